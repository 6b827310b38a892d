"""A scenario's fault and check entries: what fires (an injector ``type`` with its ``params``), when
(``trigger``), on which hosts (``hosts``), for how long (``duration``); and the checks that judge the run.

The params models come from the registry when the full scenario model is built (:mod:`chaos.spec.scenario`).
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny, model_validator

from chaos.event_kinds import TriggerPhase
from chaos.spec.units import Duration, Name

_STRICT = ConfigDict(extra="forbid", frozen=True)


class EveryTrigger(BaseModel):
    """Fire ``count`` times, every ``interval``, the first at ``start`` (default: one interval in)."""

    model_config = _STRICT
    interval: Duration = Field(gt=0)
    count: int = Field(ge=1, le=10_000)  # (and its last firing within max_duration: chaos.spec.preflight)
    start: Duration | None = None


class PoissonTrigger(BaseModel):
    """Fire ``count`` times with exponential gaps of mean ``mtbf`` (seeded: replays exactly)."""

    model_config = _STRICT
    mtbf: Duration = Field(gt=0)
    count: int = Field(ge=1, le=10_000)
    start: Duration = 0.0


class EventTrigger(BaseModel):
    """Fire when the ``nth`` event whose kind matches ``kind`` (a glob) arrives, optionally on one rank."""

    model_config = _STRICT
    kind: Name
    nth: int = Field(default=1, ge=1)
    rank: int | None = Field(default=None, ge=0)


# The points inside a training step where the in-job agent can fire a process fault (``trigger.phase``):
# before the forward pass, inside the gradient all-reduce (the rank has entered the collective), after backward
# (the all-reduce done), and just before the optimizer step.
PHASES: tuple[TriggerPhase, ...] = get_args(TriggerPhase)


class Trigger(BaseModel):
    """When a fault fires. Exactly one of ``after``, ``at_step``, ``on_event``, ``every``, ``poisson``."""

    model_config = _STRICT
    after: Duration | None = Field(
        default=None, description="seconds after the target starts (a serving/http target: after it is ready)"
    )
    at_step: int | None = Field(default=None, ge=0, description="when a rank reports this training step")
    rank: int | None = Field(default=None, ge=0, description="with at_step: the rank whose step counts")
    phase: TriggerPhase | None = Field(
        default=None,
        description="with at_step, on a process fault of a torchrun job: the point inside the step where the "
        "rank's own agent fires it (forward, allreduce, backward, optimizer_step)",
    )
    on_event: EventTrigger | None = None
    every: EveryTrigger | None = None
    poisson: PoissonTrigger | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> Trigger:
        chosen = [k for k in ("after", "at_step", "on_event", "every", "poisson") if getattr(self, k) is not None]
        if len(chosen) != 1:
            raise ValueError(
                "a trigger needs exactly one of after, at_step, on_event, every, poisson"
                + (f" (got {', '.join(chosen)})" if chosen else "")
            )
        if self.rank is not None and self.at_step is None:
            raise ValueError("rank belongs with at_step (on_event has its own rank)")
        if self.phase is not None and self.at_step is None:
            raise ValueError("phase belongs with at_step: a phase is a point inside a training step")
        return self

    @property
    def kind(self) -> str:
        for key in ("after", "at_step", "on_event", "every", "poisson"):
            if getattr(self, key) is not None:
                return key
        raise AssertionError("validated trigger has no kind")


class HostSelector(BaseModel):
    """Which hosts a fault hits: one ``host`` by name, the host running training ``rank`` (a multi-node
    target, resolved when the fault fires), the host of a ``role`` of the target (its rendezvous store), ``count`` hosts of a ``group`` (default: all), or of a slurm
    target's nodes (``slurm: allocated``: the job's allocation when the fault fires; ``slurm: spare``: the
    partition's nodes outside it), never those in ``exclude``. ``count`` None takes every candidate; fewer are
    drawn with the run's rng."""

    model_config = _STRICT
    host: Name | None = None
    rank: int | None = Field(default=None, ge=0, description="the host that runs this rank of a multi-node target")
    group: Name | None = None
    slurm: Literal["allocated", "spare"] | None = Field(
        default=None,
        description="a slurm target's nodes, when the fault fires: allocated (the job's allocation) or spare "
        "(the partition's nodes the job does not hold)",
    )
    role: Literal["rdzv_store"] | None = Field(
        default=None,
        description="the host of a part of the target: rdzv_store, a multi-node torchrun job's rendezvous store "
        "(c10d: the first node, whose agent hosts it; etcd-v2: the target's rdzv_host)",
    )
    count: int | None = Field(default=None, ge=1)
    exclude: list[Name] = Field(default_factory=list)

    @model_validator(mode="after")
    def _host_or_group(self) -> HostSelector:
        given = [key for key in ("host", "rank", "group", "slurm", "role") if getattr(self, key) is not None]
        if len(given) > 1:
            raise ValueError(f"give one of host, rank, group, slurm or role, not {' and '.join(given)}")
        single = self.host is not None or self.rank is not None or self.role is not None
        if single and self.count not in (None, 1):
            raise ValueError("count makes no sense with a single host")
        return self


class FaultSpec(BaseModel):
    """One fault: an injector ``type`` with its ``params``, a ``trigger`` and an optional ``duration``."""

    model_config = _STRICT
    name: str = Field(default="", pattern=r"^[A-Za-z0-9_.-]*$", description="unique; default <type>-<n>")
    type: str
    params: SerializeAsAny[BaseModel]
    trigger: Trigger
    duration: Duration | None = Field(default=None, gt=0, description="how long the fault lasts before heal")
    hosts: HostSelector | None = Field(
        default=None, description="inventory hosts the fault is applied on (null: the harness's own host)"
    )


class CheckSpec(BaseModel):
    """One assertion: a check ``type`` with its ``params``; ``name`` labels it in reports."""

    model_config = _STRICT
    name: str = ""
    type: str
    params: SerializeAsAny[BaseModel]
