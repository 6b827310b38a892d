"""Typed ``target:`` blocks: a torchrun job, any command, an http endpoint already running (the reference
serving stack's live in :mod:`chaos.spec.serving`, a roles target's in :mod:`chaos.spec.roles`, a Slurm job's in
:mod:`chaos.spec.slurm`)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from chaos.spec.faults import HostSelector
from chaos.spec.matchers import LogMatcherSpec, OptimizerSteps, Signatures
from chaos.spec.units import MODULE_PATTERN, Argv, Duration, EnvVars, Name, check_http_url

_STRICT = ConfigDict(extra="forbid", frozen=True)


class HttpTarget(BaseModel):
    """A serving endpoint that is already running: the gateway of a user's own fleet."""

    model_config = _STRICT
    type: Literal["http"]
    url: str = Field(description="base URL of the endpoint, e.g. http://gateway.staging:8080")
    health: str | None = Field(
        default=None, description="path polled until it answers 2xx/3xx before the run starts (null: any answer)"
    )
    ready_timeout: Duration = Field(default=60.0, gt=0, description="give up when it is not ready by then")

    @field_validator("url")
    @classmethod
    def _url(cls, url: str) -> str:
        return check_http_url(url).rstrip("/")


class HangWatchSpec(BaseModel):
    """The harness-side hang watch (:mod:`chaos.detect.hang_watch`): names the rank a hang waits for
    (``detect.hang``) once no rank completed a collective for ``hang_after``, from the ranks' flight recorders."""

    model_config = _STRICT
    hang_after: Duration = Field(default=3.0, gt=0, description="no collective completed for this long: a hang")
    poll: Duration = Field(default=0.2, gt=0, description="how often the recorder files are read")


class TorchrunTarget(BaseModel):
    """A job launched by torchrun: a module (``-m``) or a script, N ranks per node, M restarts.

    Without ``nodes`` it is one node on this host (``--standalone``). With ``nodes`` (a host selector over
    the inventory) every selected host runs one torchrun agent over SSH, joined by a c10d rendezvous on the
    first selected host at ``rdzv_port``, or (``rdzv_backend: etcd-v2``) by the etcd the user runs on
    ``rdzv_host`` at ``rdzv_port``."""

    model_config = _STRICT
    type: Literal["torchrun"]
    module: str | None = Field(default=None, pattern=MODULE_PATTERN, description="a dotted module name (python -m)")
    script: Name | None = None
    args: Argv = []
    nproc_per_node: int = Field(default=2, ge=1, le=1024)
    max_restarts: int = Field(default=3, ge=0)
    monitor_interval: Duration = Field(default=0.5, gt=0)
    nodes: HostSelector | None = Field(
        default=None, description="inventory hosts that each run one torchrun agent (null: this host only)"
    )
    rdzv_port: Annotated[int, Field(ge=1, le=65535)] | Literal["auto"] = Field(
        default="auto",
        description="c10d rendezvous port on the first node: `auto` (a port free there, chosen when the run "
        "starts, so runs side by side never share one) or a number to pin it; etcd-v2: etcd's client port",
    )
    rdzv_backend: Literal["c10d", "etcd-v2"] = Field(
        default="c10d",
        description="with nodes: c10d (the first node's agent hosts the store) or etcd-v2 (an etcd the user runs "
        "on rdzv_host, serving the v2 API: etcd --enable-v2; the hosts need python-etcd)",
    )
    rdzv_host: HostSelector | None = Field(
        default=None,
        description="etcd-v2: the inventory host running etcd (host: NAME, or a group of one, e.g. group: etcd)",
    )
    python: Name | None = Field(
        default=None,
        description="the interpreter that runs the job (a path, or a name on PATH); null: python3 on PATH when it "
        "can import torch (and mlchaos for a script with the agent line), else mlchaos's own; on nodes: each "
        "host's inventory python",
    )
    torchrun: Argv | None = Field(
        default=None,
        min_length=1,
        description="the launcher command, e.g. [/opt/venv/bin/torchrun]; null: <python> -m torch.distributed.run",
    )
    env: EnvVars = {}
    matchers: list[LogMatcherSpec] = []
    signatures: Signatures = "all"
    optimizer_steps: OptimizerSteps = True
    hang_watch: HangWatchSpec | None = Field(
        default=None, description="name the rank a hang waits for (the job must attach the agent); null: off"
    )

    @model_validator(mode="after")
    def _module_or_script(self) -> TorchrunTarget:
        if (self.module is None) == (self.script is None):
            raise ValueError("a torchrun target needs exactly one of module or script")
        for field, chosen in (("nodes", self.nodes), ("rdzv_host", self.rdzv_host)):
            if chosen is not None and (chosen.rank, chosen.slurm, chosen.role) != (None, None, None):
                raise ValueError(
                    f"{field} selects inventory hosts: use host, group, count or exclude, not rank, slurm or role"
                )
        if self.rdzv_backend == "etcd-v2" and (self.nodes is None or self.rdzv_host is None):
            raise ValueError("rdzv_backend etcd-v2 needs nodes: and rdzv_host: (the inventory host running etcd)")
        if self.rdzv_backend == "etcd-v2" and self.rdzv_port == "auto":
            raise ValueError("rdzv_backend etcd-v2: give etcd's client port as rdzv_port (etcd's default is 2379)")
        if self.rdzv_backend == "c10d" and self.rdzv_host is not None:
            raise ValueError("rdzv_host is for etcd-v2; with c10d the first node's agent hosts the store")
        return self


class CommandTarget(BaseModel):
    """Any command; its output lines become events through ``matchers``. ``{python}`` in it is the job's
    interpreter (``python:``, see :mod:`chaos.targets.interpreter`)."""

    model_config = _STRICT
    type: Literal["command"]
    command: Argv = Field(min_length=1)
    python: Name | None = Field(
        default=None,
        description="the job's interpreter: replaces a bare python/python3 program and fills {python} in the "
        "command; null: the command as written, {python} = python3 on PATH when it can import what the "
        "command's .py files import of torch and mlchaos, else mlchaos's own",
    )
    env: EnvVars = {}
    matchers: list[LogMatcherSpec] = []
    signatures: Signatures = "all"
    optimizer_steps: OptimizerSteps = True

    @field_validator("command")
    @classmethod
    def _program(cls, command: list[str]) -> list[str]:
        if not command[0].strip():
            raise ValueError("the command's first item is the program to run: it cannot be empty")
        return command
