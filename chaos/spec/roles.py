"""The ``roles`` target: one job made of several roles (a lighthouse and N replica groups, a load balancer and
its model servers), each a command or a one-node torchrun job with its own environment, replica count and
restart policy.

Replica names: a role with ``replicas: 1`` has one replica named like the role (``lighthouse``); a role with
``replicas: N`` has replicas ``<role>.0`` … ``<role>.<N-1>`` (``group.1``). Process faults select one with
``replica: group.1``; every event a replica's processes report carries ``data.role`` and ``data.replica``.

A serving fleet is a roles target with a ``url`` (where the scenario's load goes): its model servers are roles
with a ``backend`` (the server name the load balancer reports, e.g. in an ``X-Backend`` header) and its load
balancer a role with a ``balancer`` kind whose log says when it marks a backend down or up.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from chaos.spec.matchers import LogMatcherSpec, OptimizerSteps, Signatures
from chaos.spec.units import MODULE_PATTERN, Argv, Duration, EnvVars, Name

_STRICT = ConfigDict(extra="forbid", frozen=True)
ROLE_NAME = r"^[A-Za-z][A-Za-z0-9_-]*$"  # no dot: a dot separates a role from its replica index
MAX_REPLICAS = 32


class RestartPolicy(BaseModel):
    """When a replica whose processes exited is started again: ``always``, ``on-failure`` (a non-zero exit or
    a signal) or ``never``; after ``delay``; at most ``max_restarts`` times (null: no limit)."""

    model_config = _STRICT
    policy: Literal["always", "on-failure", "never"] = "on-failure"
    delay: Duration = Field(default=1.0, description="seconds between the exit and the new start")
    max_restarts: int | None = Field(default=None, ge=0, description="restarts allowed per replica (null: any)")


class RoleTorchrun(BaseModel):
    """A role launched as a one-node torchrun job (``--standalone``: its own rendezvous on a free port)."""

    model_config = _STRICT
    module: str | None = Field(default=None, pattern=MODULE_PATTERN, description="a dotted module name (python -m)")
    script: Name | None = None
    args: Argv = []
    nproc_per_node: int = Field(default=1, ge=1, le=1024)
    max_restarts: int = Field(default=0, ge=0, description="torchrun's own restarts, inside one replica start")
    monitor_interval: Duration = Field(default=0.5, gt=0)

    @model_validator(mode="after")
    def _module_or_script(self) -> RoleTorchrun:
        if (self.module is None) == (self.script is None):
            raise ValueError("a torchrun role needs exactly one of module or script")
        return self


class RoleSpec(BaseModel):
    """One role: exactly one of ``command`` (argv) or ``torchrun``; ``replicas`` copies of it.

    Placeholders in ``command``, torchrun ``args`` and ``env`` values: ``{run_dir}``, ``{seed}``, ``{role}``,
    ``{replica}`` (the replica's name), ``{index}`` (its index, 0 for a single replica), ``{python}`` (the
    interpreter mlchaos runs with, which has the ``torchft`` extra when it was installed), ``{bin}`` (its
    folder, where console scripts such as ``torchft_lighthouse`` are), ``{port:ROLE}`` (the ``port`` of role
    ROLE, the one chosen at run time for ``port: auto``, so a load balancer's environment can name its
    backends' ports once) and ``{host:ROLE}`` (the address
    of the host role ROLE runs on: ``127.0.0.1`` for this machine, the inventory address for ``host:``) and
    ``{scenario_dir}`` (the absolute folder of the scenario file: a role on another host starts in that host's
    login directory, so relative paths there are not the scenario's).
    ``{python}`` and a torchrun role's launcher are the inventory's ``python`` on another host."""

    model_config = _STRICT
    command: Argv | None = Field(default=None, min_length=1)
    torchrun: RoleTorchrun | None = None
    env: EnvVars = {}
    replicas: int = Field(default=1, ge=1, le=MAX_REPLICAS)
    restart: RestartPolicy = RestartPolicy()
    port: Annotated[int, Field(ge=1, le=65535)] | Literal["auto"] | None = Field(
        default=None,
        description="a TCP port the role serves (on its host's address): it is ready (target.role_ready) once it "
        "accepts. `auto`: a port free on the role's host, chosen when the run starts (runs side by side never "
        "share one; {port:ROLE} names it, target.ports records it); a number pins it",
    )
    after: list[str] = Field(default=[], description="roles that must be ready (or, without a port, started) first")
    backend: str | None = Field(
        default=None,
        pattern=ROLE_NAME,
        description="the server name a load balancer reports for this role (its X-Backend): each start is a "
        "serving.replica_start event of that backend, which failback windows count from",
    )
    host: str | list[str] | None = Field(
        default=None,
        min_length=1,
        description="the inventory host this role runs on (default: this machine), or a list: replica i runs on "
        "item i modulo its length; {host:ROLE} is the address of its first replica's host",
    )
    python: Name | None = Field(
        default=None,
        description="the interpreter of {python} and of a torchrun role's launcher and workers (a path, or a name "
        "on the role's host's PATH); null: mlchaos's own here (it has the torchft extra), the inventory's python on "
        "another host",
    )
    matchers: list[LogMatcherSpec] = Field(
        default=[], description="regexes over each replica's output whose matches become events (of that replica)"
    )
    signatures: Signatures = "all"
    optimizer_steps: OptimizerSteps = True
    balancer: Literal["haproxy"] | None = Field(
        default=None,
        description="this role is a load balancer of that kind: the backend state changes it logs become "
        "detect.backend_down {backend, reason} and serving.backend_up {backend} events",
    )

    def host_of(self, index: int) -> str | None:
        """The inventory host replica ``index`` runs on; None for this machine."""
        if self.host is None or isinstance(self.host, str):
            return self.host
        return self.host[index % len(self.host)]

    @model_validator(mode="after")
    def _one_launcher(self) -> RoleSpec:
        if (self.command is None) == (self.torchrun is None):
            raise ValueError("a role needs exactly one of command or torchrun")
        if self.command is not None and not self.command[0].strip():
            raise ValueError("the command's first item is the program to run: it cannot be empty")
        if self.port is not None and self.replicas > 1:
            raise ValueError("port names one listener: give it to a role with a single replica")
        if self.backend is not None and self.replicas > 1:
            raise ValueError("backend names one server: give it to a role with a single replica")
        return self


class RolesTarget(BaseModel):
    """A job of several roles started together, each replica supervised by its restart policy.

    The job has ended when every replica of the ``until`` roles (default: every role) has exited for good
    (no restart due); its exit code is 0 when each of those last exits was 0, else the first other code."""

    model_config = _STRICT
    type: Literal["roles"]
    roles: dict[str, RoleSpec] = Field(min_length=1)
    until: list[str] = Field(default=[], description="roles whose completion ends the job (empty: every role)")
    ready_timeout: Duration = Field(default=60.0, gt=0, description="how long a role's `after` roles may take")
    url: str | None = Field(
        default=None,
        pattern=r"^https?://[^/\s]+$",
        description="where the fleet answers (http://host:port, no path; {port:ROLE} and {host:ROLE} allowed): the "
        "load's URL path goes here, and faults and load start once every role with a port is ready (target.ready)",
    )

    @field_validator("roles")
    @classmethod
    def _names(cls, roles: dict[str, RoleSpec]) -> dict[str, RoleSpec]:
        for name in roles:
            if not re.match(ROLE_NAME, name):
                raise ValueError(f"role name {name!r}: letters, digits, _ and -, starting with a letter (no dots)")
        return roles

    @model_validator(mode="after")
    def _references(self) -> RolesTarget:
        for name, role in self.roles.items():
            for other in role.after:
                if other not in self.roles:
                    raise ValueError(f"role {name!r} starts after {other!r}, which is not a role")
                if other == name:
                    raise ValueError(f"role {name!r} cannot start after itself")
        for name in self.until:
            if name not in self.roles:
                raise ValueError(f"until names {name!r}, which is not a role")
        backends = [role.backend for role in self.roles.values() if role.backend is not None]
        if len(backends) != len(set(backends)):
            raise ValueError(f"two roles give the same backend name: {', '.join(sorted(backends))}")
        _start_order(self.roles)  # raises on a cycle
        for where, text in self._templates():
            for named in re.findall(r"\{port:([^}]*)\}", text):
                if named not in self.roles:
                    raise ValueError(f"{where} names {{port:{named}}}, but there is no role {named!r}")
                if self.roles[named].port is None:
                    raise ValueError(
                        f"{where} names {{port:{named}}}, but role {named!r} has no port: give it `port: auto`"
                    )
        return self

    def _templates(self) -> Iterator[tuple[str, str]]:
        """Every text that may hold placeholders, with where it stands (for error messages)."""
        if self.url is not None:
            yield "url", self.url
        for name, role in self.roles.items():
            argv = role.command if role.command is not None else (role.torchrun.args if role.torchrun else [])
            for part in argv:
                yield f"role {name!r}", part
            for key, value in role.env.items():
                yield f"role {name!r} env {key}", value

    def hosts(self) -> list[str]:
        """The inventory hosts the roles run on (``host:``), each once, in role order."""
        found = [role.host_of(i) for role in self.roles.values() for i in range(role.replicas)]
        return list(dict.fromkeys(host for host in found if host is not None))

    def replica_names(self) -> list[str]:
        """Every replica's name, role by role (see the module docstring)."""
        return [name for role in self.roles for name in replica_names_of(role, self.roles[role].replicas)]

    def start_order(self) -> list[str]:
        """The roles in an order where each comes after the roles it waits for (ties: as written)."""
        return _start_order(self.roles)


def replica_names_of(role: str, replicas: int) -> list[str]:
    """The replica names of ``role`` with ``replicas`` copies: the role's own name for one, ``role.i`` else."""
    return [role] if replicas == 1 else [f"{role}.{i}" for i in range(replicas)]


def _start_order(roles: dict[str, RoleSpec]) -> list[str]:
    order: list[str] = []
    pending = list(roles)
    while pending:
        ready = [name for name in pending if all(other in order for other in roles[name].after)]
        if not ready:
            raise ValueError(f"roles wait for each other in a cycle: {', '.join(pending)}")
        order.append(ready[0])
        pending.remove(ready[0])
    return order
