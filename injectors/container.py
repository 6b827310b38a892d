"""Container faults through the Docker Engine API: ``container_kill``, ``container_stop``,
``container_restart``, ``container_pause`` and ``container_cpu``.

They need a docker host (``transport: docker`` in the inventory, :class:`chaos.cluster.docker.DockerTransport`)
and act on the whole container through the daemon, not on processes inside it: a kill is the daemon's
``kill``, a pause is the cgroup freezer, a CPU cap is the container's own CFS quota (``docker update``).

Every op records the container's NAME and the id it had at prepare. The container is re-found by name at
each step, because the object the SDK handed out goes stale when the container is restarted, and an
orchestrator may have recreated it (same name, new id) meanwhile. Heal undoes only what is still ours: it
unpauses / starts / restores the quota of the container with the recorded id, in the state the fault left
it; a container already started, unpaused, recreated or removed by someone else is left as it is, and heal
succeeds. Heal raises InjectionError only when the daemon cannot be reached or refuses the undo.

Dead-man: :meth:`revert_command` is a ``docker`` CLI argv (``docker start NAME``, ``docker unpause NAME``,
``docker update --cpu-quota=N|--cpus=N NAME``, with ``-H URL`` when the inventory names a ``docker_url``). It
must run on the HARNESS's machine, the one that reaches the Engine API (the local :mod:`chaos.safety.deadman`), not
inside the container, where a stopped container would take the switch down with it: every injector here says
so with ``revert_on_harness = True``. Reverts act by name and change nothing when the container is already
running / unpaused / restored; only ``docker unpause`` of a container that is not paused exits non-zero, so
the dead-man journals that op as failed and ``mlchaos cleanup`` closes it with a heal that finds nothing to do.

One-shot faults (``container_kill``, ``container_restart``) have no heal: with restart policy ``no`` a
killed container stays down, and bringing it back is the user's orchestration under test.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, TypeVar, cast

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator

from chaos.cluster.base import TransportError
from chaos.cluster.local import signal_number
from chaos.plugins.injector import (
    Applied,
    FaultOp,
    InjectionContext,
    InjectionError,
    Injector,
    Unsupported,
    flag,
    optional_int,
    optional_text,
    params_as,
    state_int,
    state_number,
    state_text,
)
from chaos.spec.units import Duration
from injectors.base import HeldFault, OneShot

if TYPE_CHECKING:
    from docker.models.containers import Container

    from chaos.cluster.docker import DockerTransport

NOT_DOCKER = "container faults need a docker host (transport: docker in the inventory)"
DEFAULT_CFS_PERIOD_US = 100_000  # the kernel's (and docker's) period when the container sets none
MIN_CFS_QUOTA_US = 1_000  # the kernel's smallest quota; docker refuses less
SKIPPED = "skipped"  # state key set by an apply that changed nothing, so the heal that follows leaves it alone


@dataclass(frozen=True)
class CpuCap:
    """``container_cpu``'s record: the limits found at prepare and the one the fault sets (NanoCpus or quota).

    Exactly one of ``fault_nano``/``fault_quota`` is set. Reading needs only what heal and the dead-man's revert
    use (the previous NanoCpus for a NanoCpus cap, else the previous quota), the rest is kept for the report."""

    previous_quota: int | None
    previous_period: int | None
    previous_nano: int | None
    cpus: float | None
    fault_nano: int | None = None  # set when the container is limited through NanoCpus
    fault_quota: int | None = None  # set otherwise

    KEYS: ClassVar[tuple[str, ...]] = ("previous_cpu_quota", "previous_nano_cpus", "fault_nano_cpus", "fault_cpu_quota")

    def to_json(self) -> dict[str, JsonValue]:
        record: dict[str, JsonValue] = {
            "previous_cpu_quota": self.previous_quota,
            "previous_cpu_period": self.previous_period,
            "previous_nano_cpus": self.previous_nano,
            "cpus": self.cpus,
            "fault_nano_cpus": self.fault_nano,
            "fault_cpu_quota": self.fault_quota,
        }
        return {key: value for key, value in record.items() if value is not None}

    @classmethod
    def from_json(cls, state: dict[str, JsonValue]) -> CpuCap:
        nano = "fault_nano_cpus" in state
        cpus = state.get("cpus")
        return cls(
            previous_quota=optional_int(state, "previous_cpu_quota")
            if nano
            else state_int(state, "previous_cpu_quota"),
            previous_period=optional_int(state, "previous_cpu_period"),
            previous_nano=state_int(state, "previous_nano_cpus") if nano else optional_int(state, "previous_nano_cpus"),
            cpus=state_number(state, "cpus") if cpus is not None else None,
            fault_nano=state_int(state, "fault_nano_cpus") if nano else None,
            fault_quota=None if nano else state_int(state, "fault_cpu_quota"),
        )

    def quota_to_restore(self) -> int:
        """The recorded CpuQuota, with "none" (0, which docker update reads as "unchanged") as -1 (unlimited)."""
        previous = self.previous_quota or 0
        return previous if previous > 0 else -1


@dataclass(frozen=True)
class ContainerState:
    """What every container fault records (the container's name, id and daemon URL) plus its own fields.

    The journal's JSON keys are the ones 0.1 wrote, so a dead run's journal still heals."""

    container: str
    container_id: str | None  # None only in a hand-made record: then nothing matches it and heal leaves all be
    docker_url: str | None
    skipped: bool = False  # apply changed nothing (the container was recreated or stopped since prepare)
    signal: str | None = None  # container_kill
    timeout_s: int | None = None  # container_stop / container_restart
    cpu: CpuCap | None = None  # container_cpu

    def to_json(self) -> dict[str, JsonValue]:
        record: dict[str, JsonValue] = {
            "container": self.container,
            "container_id": self.container_id,
            "docker_url": self.docker_url,
        }
        if self.signal is not None:
            record["signal"] = self.signal
        if self.timeout_s is not None:
            record["timeout_s"] = self.timeout_s
        if self.cpu is not None:
            record.update(self.cpu.to_json())
        if self.skipped:
            record[SKIPPED] = True
        return record

    @classmethod
    def from_json(cls, state: dict[str, JsonValue]) -> ContainerState:
        return cls(
            container=state_text(state, "container"),
            container_id=optional_text(state, "container_id"),
            docker_url=optional_text(state, "docker_url"),
            skipped=flag(state, SKIPPED),
            signal=optional_text(state, "signal"),
            timeout_s=optional_int(state, "timeout_s"),
            cpu=CpuCap.from_json(state) if any(key in state for key in CpuCap.KEYS) else None,
        )

    def need(self, value: _T | None, key: str) -> _T:
        """A fault-specific field apply or heal needs; InjectionError names it when the record lacks it."""
        if value is None:
            raise InjectionError(f"journal state of container {self.container!r} has no {key!r}")
        return value


_T = TypeVar("_T")


# -- parameters -------------------------------------------------------------------------------------------------


class ContainerKillParams(BaseModel):
    """Send one signal to the container's main process (PID 1 inside it) through the daemon."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    signal: str = Field(default="SIGKILL", description="signal name or number, e.g. SIGKILL, SIGTERM, 9")

    @field_validator("signal", mode="before")
    @classmethod
    def _known_signal(cls, value: object) -> str:
        import signal as signals

        if not isinstance(value, str | int) or isinstance(value, bool):
            raise ValueError(f"signal must be a name or number, got {value!r}")
        try:
            return signals.Signals(signal_number(value)).name
        except ValueError:
            raise ValueError(f"unknown signal {value!r}; use a name such as SIGKILL, SIGTERM or SIGINT") from None


class ContainerStopParams(BaseModel):
    """Stop the container (SIGTERM, then SIGKILL after ``timeout``) for the fault's duration, then start it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    timeout: Duration = Field(default=10.0, ge=0, description="grace before SIGKILL, rounded up to whole seconds")


class ContainerRestartParams(ContainerStopParams):
    """Restart the container once (stop with ``timeout`` grace, then start)."""


class ContainerPauseParams(BaseModel):
    """Freeze every process of the container (cgroup freezer) for the fault's duration."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ContainerCpuParams(BaseModel):
    """Cap the whole container at ``cpus`` CPUs for the fault's duration."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cpus: float = Field(gt=0, description="CPUs the container may use: 0.2 = 20% of one CPU, 2 = two")


# -- docker access -------------------------------------------------------------------------------------------------


def docker_transport(ctx: InjectionContext, error: type[Exception] = InjectionError) -> DockerTransport:
    """``ctx.transport`` as a DockerTransport; ``error`` (Unsupported in check) for any other transport."""
    from chaos.cluster.docker import DockerTransport

    if not isinstance(ctx.transport, DockerTransport):
        raise error(f"{NOT_DOCKER}; host {ctx.transport.host!r} is not one")
    return ctx.transport


def _daemon_errors() -> tuple[type[Exception], ...]:
    """What the SDK raises when the daemon is unreachable or refuses a call (besides NotFound)."""
    import docker.errors
    import requests

    return (docker.errors.DockerException, requests.exceptions.RequestException, TransportError)


def _call(what: str, name: str, call: Callable[[], _T]) -> _T:
    """Run one daemon call; InjectionError naming the container and the daemon's own words on failure."""
    import docker.errors

    try:
        return call()
    except docker.errors.APIError as exc:
        reason = exc.explanation or str(exc)
        raise InjectionError(f"{what} container {name!r} failed: {reason}") from exc
    except TransportError as exc:  # the transport's own message (daemon unreachable, with a hint)
        raise InjectionError(f"{what} container {name!r} failed: {exc}") from exc
    except _daemon_errors() as exc:
        raise InjectionError(f"{what} container {name!r} failed: cannot reach the Docker daemon: {exc}") from exc


def find_container(transport: DockerTransport) -> Container | None:
    """The container named like the host's container NOW (fresh attrs), or None when there is none."""
    import docker.errors

    name = transport.container_name
    try:
        return _call("looking up", name, lambda: transport.client.containers.get(name))
    except InjectionError as exc:
        if isinstance(exc.__cause__, docker.errors.NotFound):
            return None
        raise


def _require_container(transport: DockerTransport) -> Container:
    found = find_container(transport)
    if found is None:
        raise InjectionError(f"container {transport.container_name!r} on {transport.host} does not exist")
    return found


def check_running(ctx: InjectionContext) -> DockerTransport:
    """Unsupported unless the host is a docker host whose container exists and runs (checked before any fault)."""
    transport = docker_transport(ctx, Unsupported)
    name = transport.container_name
    try:
        transport.container()
    except _daemon_errors() as exc:
        text = str(exc)
        raise Unsupported(text if name in text else f"container {name!r} on {transport.host}: {text}") from exc
    return transport


def _record(transport: DockerTransport) -> tuple[ContainerState, Container]:
    """The state every op here starts from (the container's name, id and daemon URL) and the container, which
    must be running; changes nothing."""
    container = _require_container(transport)
    if container.status != "running":
        raise InjectionError(
            f"container {transport.container_name!r} on {transport.host} is {container.status}, not running"
        )
    if not container.id:
        raise InjectionError(f"container {transport.container_name!r} on {transport.host} has no id")
    state = ContainerState(
        container=transport.container_name, container_id=container.id, docker_url=transport.spec.docker_url
    )
    return state, container


def _ours(transport: DockerTransport, state: ContainerState) -> Container | None:
    """The recorded container if it still exists under its name with the recorded id (None: gone/recreated)."""
    found = find_container(transport)
    return found if found is not None and state.container_id is not None and found.id == state.container_id else None


def _current(transport: DockerTransport, applied: Applied, verb: str) -> tuple[Container, ContainerState]:
    """For apply: the recorded container, running, and its state; InjectionError (and the heal that follows
    skips) otherwise."""
    found = _require_container(transport)
    state = ContainerState.from_json(applied.state)
    if found.id != state.container_id or found.status != "running":
        applied.state = replace(state, skipped=True).to_json()
        change = "was recreated" if found.id != state.container_id else f"is {found.status}"
        raise InjectionError(f"container {transport.container_name!r} {change} since prepare; not {verb}")
    return found, state


def docker_cli(applied: Applied, *args: str) -> list[str]:
    """``docker [-H URL] ARGS... NAME``: the dead-man's revert, run on the harness's machine."""
    state = ContainerState.from_json(applied.state)
    host = ["-H", state.docker_url] if state.docker_url else []
    return ["docker", *host, *args, state.container]


def _whole_seconds(value: float) -> int:
    return math.ceil(value)


def _seconds(value: float) -> str:
    return f"{value:g}s"


# -- injectors ----------------------------------------------------------------------------------------------------


class _ContainerFault(HeldFault):
    """The life every container fault shares; a subclass says what it records, does and undoes.

    ``prepare`` needs a running container (and a duration unless ``one_shot``), ``apply`` acts only on the
    recorded container while it still runs, and ``heal`` undoes only on the recorded container (never on one
    recreated under the same name) and not after an apply that changed nothing. One-shot faults (a signal, a
    restart) cannot be taken back: they are journaled as irreversible and have neither heal nor revert.
    """

    revert_on_harness: ClassVar[bool] = True
    one_shot: ClassVar[bool] = False  # a held fault ends at its deadline; one-shot faults derive from OneShot
    done: ClassVar[str]  # what apply does, as in "container X is paused since prepare; not <done>"

    def check(self, ctx: InjectionContext, params: BaseModel) -> None:
        check_running(ctx)

    def prepare(self, ctx: InjectionContext, op: FaultOp) -> Applied:
        duration = None if self.one_shot else self.duration(op)
        params = op.params_as(self.Params)
        transport = docker_transport(ctx)
        state, what = self._plan(*_record(transport), params)
        for_how_long = "" if duration is None else f" for {_seconds(duration)}"
        return op.record(
            self.name, transport.host, state.to_json(), f"{what}{for_how_long}", reversible=not self.one_shot
        )

    def _plan(self, state: ContainerState, container: Container, params: BaseModel) -> tuple[ContainerState, str]:
        """The state with this fault's own fields added, and the description (without the duration)."""
        raise NotImplementedError

    def apply(self, ctx: InjectionContext, applied: Applied) -> None:
        transport = docker_transport(ctx)
        self._act(transport, *_current(transport, applied, self.done))

    def _act(self, transport: DockerTransport, container: Container, state: ContainerState) -> None:
        raise NotImplementedError

    def heal(self, ctx: InjectionContext, applied: Applied) -> None:
        """Undo on the recorded container, if it still exists; nothing after a skipped apply (a one-shot fault's
        heal is :class:`OneShot`'s: nothing)."""
        state = ContainerState.from_json(applied.state)
        if state.skipped:
            return
        transport = docker_transport(ctx)
        container = _ours(transport, state)
        if container is not None:
            self._undo(transport, container, state)

    def _undo(self, transport: DockerTransport, container: Container, state: ContainerState) -> None:
        """Nothing to undo unless a subclass says so."""

    def revert_command(self, applied: Applied) -> list[str] | None:
        return None


class ContainerKillInjector(OneShot, _ContainerFault, name="container_kill", params=ContainerKillParams):
    """send a signal (default SIGKILL) to a container's main process through the Docker API

    Signal the container's main process once via the daemon (SIGKILL by default). Irreversible."""

    done: ClassVar[str] = "killed"

    def _plan(self, state: ContainerState, container: Container, params: BaseModel) -> tuple[ContainerState, str]:
        signal = params_as(ContainerKillParams, params).signal
        return replace(state, signal=signal), f"{signal} container {state.container}"

    def _act(self, transport: DockerTransport, container: Container, state: ContainerState) -> None:
        signal = state.need(state.signal, "signal")
        _call(f"sending {signal} to", transport.container_name, lambda: container.kill(signal=signal))


class Verbs(NamedTuple):
    """A grace fault's words: ``verb``, the docker-py Container method and the word in the description; ``acting``,
    the step as a daemon error names it ("stopping X failed: ..."); ``done``, what apply does ("not stopped")."""

    verb: str
    acting: str
    done: str


class _GraceFault(_ContainerFault):
    """stop and restart: one daemon call (``container.<verb>``) with the params' ``timeout`` grace before SIGKILL,
    recorded as whole seconds at prepare so the dead-man revert and the heal see the same value."""

    verbs: ClassVar[Verbs]

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        cls.done = cls.verbs.done

    def _plan(self, state: ContainerState, container: Container, params: BaseModel) -> tuple[ContainerState, str]:
        grace = params_as(cast("type[ContainerStopParams]", self.Params), params)  # restart's Params subclass it
        return replace(state, timeout_s=_whole_seconds(grace.timeout)), f"{self.verbs.verb} container {state.container}"

    def _act(self, transport: DockerTransport, container: Container, state: ContainerState) -> None:
        timeout = state.need(state.timeout_s, "timeout_s")
        _call(self.verbs.acting, transport.container_name, lambda: getattr(container, self.verbs.verb)(timeout=timeout))


class ContainerStopInjector(_GraceFault, name="container_stop", params=ContainerStopParams):
    """stop a container for the fault's duration, then start it again

    ``docker stop`` for the fault's duration; heal starts the recorded container again if it is still down."""

    verbs = Verbs("stop", "stopping", "stopped")

    def _undo(self, transport: DockerTransport, container: Container, state: ContainerState) -> None:
        """Start the recorded container unless it runs already (or is on its way)."""
        if container.status not in ("running", "restarting", "paused", "removing"):
            _call("starting", transport.container_name, container.start)

    def revert_command(self, applied: Applied) -> list[str] | None:
        return docker_cli(applied, "start")


class ContainerRestartInjector(OneShot, _GraceFault, name="container_restart", params=ContainerRestartParams):
    """restart a container once (stop with a grace timeout, then start)

    ``docker restart`` once (stop with ``timeout`` grace, then start). Irreversible: nothing to heal."""

    verbs = Verbs("restart", "restarting", "restarted")


class ContainerPauseInjector(_ContainerFault, name="container_pause", params=ContainerPauseParams):
    """freeze every process of a container (docker pause) for the fault's duration

    Freeze the container (cgroup freezer) for the fault's duration; heal unpauses it if it is still paused."""

    done: ClassVar[str] = "paused"

    def _plan(self, state: ContainerState, container: Container, params: BaseModel) -> tuple[ContainerState, str]:
        return state, f"pause container {state.container}"

    def _act(self, transport: DockerTransport, container: Container, state: ContainerState) -> None:
        _call("pausing", transport.container_name, container.pause)

    def _undo(self, transport: DockerTransport, container: Container, state: ContainerState) -> None:
        """Unpause the recorded container if paused; a restarted one is left alone."""
        if container.status != "paused":
            return
        try:
            _call("unpausing", transport.container_name, container.unpause)
        except InjectionError:
            again = _ours(transport, state)  # raced with someone else's unpause/restart: that is healed too
            if again is not None and again.status == "paused":
                raise

    def revert_command(self, applied: Applied) -> list[str] | None:
        return docker_cli(applied, "unpause")


class ContainerCpuInjector(_ContainerFault, name="container_cpu", params=ContainerCpuParams):
    """cap a container at a number of CPUs (its CFS quota via docker update)

    Cap the container's CPU for the fault's duration; heal restores exactly the recorded limits.

    A container limited with ``NanoCpus`` (``docker run --cpus``, compose ``cpus:``) is capped through
    ``NanoCpus`` (docker refuses a quota next to it); any other through ``CpuQuota`` at its own period
    (``CpuPeriod``, or the kernel's 100ms), which is left untouched. Restoring "no quota" writes -1, docker's
    spelling of unlimited (``HostConfig.CpuQuota`` then reads -1 rather than 0). Heal restores only while the
    fault's value is still in place, so a limit someone changed meanwhile, or a recreated container, is kept.
    """

    done: ClassVar[str] = "throttled"

    def check(self, ctx: InjectionContext, params: BaseModel) -> None:
        transport = check_running(ctx)
        try:
            info = _call("inspecting the daemon of", transport.container_name, transport.client.info)
        except InjectionError as exc:
            raise Unsupported(str(exc)) from exc
        if info.get("CpuCfsQuota") is False:
            raise Unsupported(f"the Docker daemon of {transport.host} has no CFS quota support (CpuCfsQuota: false)")

    def _plan(self, state: ContainerState, container: Container, params: BaseModel) -> tuple[ContainerState, str]:
        """Record the current CpuQuota/CpuPeriod/NanoCpus and the fault's value; InjectionError if out of range."""
        cpus = params_as(ContainerCpuParams, params).cpus
        host_config = container.attrs.get("HostConfig") or {}
        quota, period, nano = (int(host_config.get(key) or 0) for key in ("CpuQuota", "CpuPeriod", "NanoCpus"))
        cap = CpuCap(previous_quota=quota, previous_period=period, previous_nano=nano, cpus=cpus)
        if nano > 0:
            cap = replace(cap, fault_nano=int(cpus * 1e9))
        else:
            fault_quota = round(cpus * (period or DEFAULT_CFS_PERIOD_US))
            if fault_quota < MIN_CFS_QUOTA_US:
                raise InjectionError(
                    f"cpus={cpus:g} is a quota of {fault_quota}us per {period or DEFAULT_CFS_PERIOD_US}us period;"
                    f" the kernel's smallest is {MIN_CFS_QUOTA_US}us"
                )
            cap = replace(cap, fault_quota=fault_quota)
        return replace(state, cpu=cap), f"cap container {state.container} at {cpus:g} CPUs"

    def _act(self, transport: DockerTransport, container: Container, state: ContainerState) -> None:
        cap = state.need(state.cpu, "previous_cpu_quota")
        if cap.fault_nano is not None:
            _update_nano_cpus(transport, container, cap.fault_nano)
        else:
            quota = state.need(cap.fault_quota, "fault_cpu_quota")
            _call("updating the CPU quota of", transport.container_name, lambda: container.update(cpu_quota=quota))

    def _undo(self, transport: DockerTransport, container: Container, state: ContainerState) -> None:
        """Restore the recorded limit while the fault's is still in place; otherwise leave the container be."""
        cap = state.need(state.cpu, "previous_cpu_quota")
        host_config = container.attrs.get("HostConfig") or {}
        if cap.fault_nano is not None:
            if int(host_config.get("NanoCpus") or 0) == cap.fault_nano:
                _update_nano_cpus(transport, container, state.need(cap.previous_nano, "previous_nano_cpus"))
            return
        if int(host_config.get("CpuQuota") or 0) == cap.fault_quota:
            restore = cap.quota_to_restore()
            _call("restoring the CPU quota of", transport.container_name, lambda: container.update(cpu_quota=restore))

    def revert_command(self, applied: Applied) -> list[str] | None:
        state = ContainerState.from_json(applied.state)
        cap = state.need(state.cpu, "previous_cpu_quota")
        if cap.fault_nano is not None:
            return docker_cli(
                applied, "update", f"--cpus={state.need(cap.previous_nano, 'previous_nano_cpus') / 1e9:g}"
            )
        return docker_cli(applied, "update", f"--cpu-quota={cap.quota_to_restore()}")


def _update_nano_cpus(transport: DockerTransport, container: Container, nano_cpus: int) -> None:
    """``docker update --cpus``: the SDK's ``update`` has no NanoCpus, so this posts the Engine API call itself."""
    api = transport.client.api
    url = f"{api.base_url}/v{api.api_version}/containers/{container.id}/update"

    def post() -> None:
        response = api.post(url, json={"NanoCpus": nano_cpus}, timeout=30)
        if response.status_code >= 400:
            try:
                reason = str(response.json().get("message", response.text))
            except ValueError:
                reason = response.text
            raise InjectionError(f"updating NanoCpus of container {transport.container_name!r} failed: {reason}")

    _call("updating NanoCpus of", transport.container_name, post)


INJECTORS: tuple[type[Injector], ...] = (  # annotated: mypy proves each is an Injector
    ContainerKillInjector,
    ContainerStopInjector,
    ContainerRestartInjector,
    ContainerPauseInjector,
    ContainerCpuInjector,
)
