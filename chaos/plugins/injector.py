"""The injector contract (a Jepsen nemesis / a toxiproxy toxic) and the values passed across it.

Life of one fault op, driven by the runner so that no injector can get the order wrong:

1. ``check(ctx, params)`` before anything is applied: raise :class:`Unsupported` with the reason.
2. ``prepare(ctx, op)`` resolves the fault's targets (pids, hosts …) WITHOUT changing anything and returns
   an :class:`Applied` record holding everything needed to undo it.
3. The runner journals that record (fsync) and arms the dead-man reverter from ``revert_command``: on the
   fault's host (a detached ``sh`` there), or on the harness's machine when the injector class sets
   ``revert_on_harness = True`` (its revert is a command for this machine, e.g. ``docker start``).
4. ``apply(ctx, applied)`` changes the world.
5. ``heal(ctx, applied)`` undoes it; idempotent, safe after a crash, safe when the target is gone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel, ConfigDict, JsonValue, StringConstraints

from chaos.plugins.check import summary_of

if TYPE_CHECKING:
    from chaos.cluster.base import Transport
    from chaos.history.timeline import History


class Unsupported(Exception):
    """This fault cannot run here (missing kernel feature, tool or permission); the message says why."""


class InjectionError(RuntimeError):
    """A fault could not be applied (its target vanished, a command failed)."""


P = TypeVar("P", bound=BaseModel)


def params_as(cls: type[P], params: BaseModel) -> P:
    """``params`` typed as ``cls``, the injector's own ``Params`` model; InjectionError for any other model.

    The scenario loader, the plan and the pytest fixture all validate a fault's params into its injector's
    ``Params`` class, so anything else is a caller's bug: it is named here rather than re-validated.
    """
    if isinstance(params, cls):
        return params
    raise InjectionError(
        f"expected {cls.__name__} params, got {type(params).__name__}: validate them with {cls.__name__}"
    )


class FaultOp(BaseModel):
    """One planned firing of a fault: which injector, with which params, for how long."""

    model_config = ConfigDict(frozen=True)

    op_id: str
    fault: str
    injector: str
    params: BaseModel
    duration_s: float | None = None

    def params_as(self, cls: type[P]) -> P:
        """This op's params as the injector's ``Params`` class ``cls`` (see :func:`params_as`)."""
        return params_as(cls, self.params)

    def record(
        self, injector: str, host: str, state: dict[str, JsonValue], description: str, *, reversible: bool = True
    ) -> Applied:
        """The :class:`Applied` that ``prepare`` returns for this op on ``host``: what it will change and how."""
        return Applied(
            op_id=self.op_id,
            fault=self.fault,
            injector=injector,
            host=host,
            duration_s=self.duration_s,
            reversible=reversible,
            state=state,
            description=description,
        )


class Applied(BaseModel):
    """What a fault changed, in enough detail to undo it from the journal alone (even in another process)."""

    model_config = ConfigDict(extra="forbid")

    op_id: str
    fault: str
    injector: str
    host: str = "local"
    duration_s: float | None = None
    reversible: bool = True
    state: dict[str, JsonValue] = {}
    description: str = ""


# -- reading journal state -------------------------------------------------------------------------------------
# Each injector family keeps its journal state in a frozen dataclass with ``to_json``/``from_json``; the wire
# form stays ``Applied.state`` (plain JSON), so journals of earlier runs still heal. These readers are what the
# ``from_json`` methods are made of: one InjectionError message shape for every malformed record.

T = TypeVar("T")


def _state_field(state: dict[str, JsonValue], key: str, what: str, parse: Callable[[JsonValue], T | None]) -> T:
    value = state.get(key)
    parsed = parse(value)
    if parsed is None:
        raise InjectionError(f"journal state {key!r} is missing or not {what}: {value!r}")
    return parsed


def _as_text(value: JsonValue) -> str | None:
    return value if isinstance(value, str) and value else None


def _as_int(value: JsonValue) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _as_number(value: JsonValue) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _as_texts(value: JsonValue) -> tuple[str, ...] | None:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        return None
    return tuple(item for item in value if isinstance(item, str))


def state_text(state: dict[str, JsonValue], key: str) -> str:
    """``state[key]`` as a non-empty string; InjectionError otherwise."""
    return _state_field(state, key, "a non-empty string", _as_text)


def state_int(state: dict[str, JsonValue], key: str) -> int:
    """``state[key]`` as an integer (a bool is not one); InjectionError otherwise."""
    return _state_field(state, key, "an integer", _as_int)


def state_number(state: dict[str, JsonValue], key: str) -> float:
    """``state[key]`` as a float (an integer is accepted); InjectionError otherwise."""
    return _state_field(state, key, "a number", _as_number)


def state_texts(state: dict[str, JsonValue], key: str) -> tuple[str, ...]:
    """``state[key]`` as a list of strings; InjectionError otherwise."""
    return _state_field(state, key, "a list of strings", _as_texts)


def optional_int(state: dict[str, JsonValue], key: str) -> int | None:
    """``state[key]`` when it is an integer, else None (a field written later, e.g. a helper's pid at apply)."""
    return _as_int(state.get(key))


def optional_text(state: dict[str, JsonValue], key: str) -> str | None:
    """``state[key]`` when it is a non-empty string, else None."""
    return _as_text(state.get(key))


def flag(state: dict[str, JsonValue], key: str) -> bool:
    """``state[key] is True``: a missing or malformed flag reads as False (the safe default, e.g. no sudo)."""
    return state.get(key) is True


@runtime_checkable
class RankResolver(Protocol):
    """A target that knows which host process runs each rank (e.g. torchrun)."""

    def pids_for_rank(self, rank: int) -> list[int]: ...

    def ranks(self) -> list[int]: ...


@dataclass(frozen=True)
class JobTree:
    """A target's own processes on one host: its launcher(s) and every process below them, by pid. ``here``
    False: the target runs nothing on that host (a node it never uses), so a ``name:`` selector there cannot be
    scoped to it and matches across that host, as for a target without a tree."""

    launchers: frozenset[int]
    members: frozenset[int]
    here: bool = True


@runtime_checkable
class ProcessTreeResolver(Protocol):
    """A target that knows its own process tree on each host (e.g. torchrun: the launcher and its workers);
    ``name:`` selectors then match only inside it."""

    def job_tree(self, host: str) -> JobTree:
        """The target's processes on ``host`` now (``here`` False where it runs none); InjectionError if
        unreadable."""
        ...


@runtime_checkable
class ReplicaResolver(Protocol):
    """A serving target that knows which process runs each replica (the reference serving stack)."""

    def pids_for_replica(self, name: str) -> list[int]: ...

    def replicas(self) -> list[str]: ...


RDZV_PORT = "rdzv"
PortName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z][A-Za-z0-9_.-]*$")]
"""A port a fault names instead of giving its number: ``rdzv``, a multi-node torchrun job's rendezvous store's, or
a roles target's role (the port it serves on, pinned or chosen for ``port: auto``)."""


@runtime_checkable
class NamedPorts(Protocol):
    """A target that names the ports it serves on (``target.ports``): a fault may say ``rdzv`` for the port of
    a multi-node torchrun job's rendezvous store, or a role's name for that role's port, instead of a number
    chosen when the run starts."""

    def port_named(self, name: str) -> int | None:
        """The port called ``name`` now; None when the target has no such port (or has not chosen it yet)."""
        ...


@dataclass
class InjectionContext:
    """What an injector may use: the host transport, the target (for rank lookups), the history, and the run's
    folder (absolute; None outside a run, e.g. the pytest fixture's faults)."""

    transport: Transport
    history: History | None = None
    target: object | None = None
    extras: dict[str, object] = field(default_factory=dict)
    run_dir: Path | None = None

    def rank_resolver(self) -> RankResolver:
        if isinstance(self.target, RankResolver):
            return self.target
        raise InjectionError("this target does not report ranks; select processes by pid or name instead")

    def replica_resolver(self) -> ReplicaResolver:
        if isinstance(self.target, ReplicaResolver):
            return self.target
        raise InjectionError("this target has no replicas; select processes by pid or name instead")

    def port(self, port: int | str) -> int:
        """``port`` as a number: a name (``rdzv``, a role) is asked of the target; InjectionError when it has none."""
        if isinstance(port, int):
            return port
        found = self.target.port_named(port) if isinstance(self.target, NamedPorts) else None
        if found is None:
            raise InjectionError(
                f"port {port!r} names no port of this target (rdzv: a multi-node torchrun job's store; a roles "
                "target's role: the port it serves on)"
            )
        return found


@runtime_checkable
class JobEnv(Protocol):
    """Optional injector capability: a fault that acts through the job's own processes (the clock shim, preloaded)
    names the environment they need; the runner adds it to every process the target starts when the scenario
    has a fault of this type, before the job starts."""

    def job_env(self, run_dir: Path) -> dict[str, str]: ...


class Injector(Protocol):
    """A fault family member, registered under its YAML ``type`` name."""

    name: ClassVar[str]
    Params: ClassVar[type[BaseModel]]
    summary: ClassVar[str]

    def check(self, ctx: InjectionContext, params: BaseModel) -> None: ...

    def prepare(self, ctx: InjectionContext, op: FaultOp) -> Applied: ...

    def apply(self, ctx: InjectionContext, applied: Applied) -> None: ...

    def heal(self, ctx: InjectionContext, applied: Applied) -> None: ...

    def revert_command(self, applied: Applied) -> list[str] | None:
        """Argv that undoes ``applied`` on its host without the harness (for the dead-man switch)."""
        ...


class InjectorBase:
    """A base that lets an injector class say each thing once, as a toxiproxy toxic is registered in one line:
    ``class KillInjector(InjectorBase, name="kill", params=KillParams):`` and a docstring whose first paragraph
    is the summary (``mlchaos list`` shows it), the paragraphs after it the details.

    ``name=`` and ``params=`` set the ``name`` and ``Params`` class attributes the registry reads; a class that
    has a name of its own but no ``summary`` takes its docstring's first paragraph, on one line. Plain class
    attributes (``name: ClassVar[str] = "kill"``, ``Params``, ``summary``) work too, with or without this base.
    """

    name: ClassVar[str]
    Params: ClassVar[type[BaseModel]]
    summary: ClassVar[str]

    def __init_subclass__(cls, *, name: str | None = None, params: type[BaseModel] | None = None, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if name is not None:
            cls.name = name
        if params is not None:
            cls.Params = params
        if "name" in vars(cls) and "summary" not in vars(cls) and cls.__doc__:
            cls.summary = summary_of(cls)


class InJobInjector(InjectorBase):
    """Base for faults applied INSIDE the target process by the in-job agent (:mod:`chaos.agent`).

    The harness never applies these itself: the runner hands their ops to the job in the plan file named by
    ``CHAOS_PLAN``, the agent fires them at exact (rank, step, phase) points and reports ``fault.applied`` /
    ``fault.healed`` through the job's event file. There is nothing to heal from outside: the corruption
    lives in the process's own memory and dies with it.
    """

    in_job: ClassVar[bool] = True

    def check(self, ctx: InjectionContext, params: BaseModel) -> None:
        """In-job faults need nothing from the host; the runner checks their triggers."""

    def prepare(self, ctx: InjectionContext, op: FaultOp) -> Applied:
        raise InjectionError(f"{self.name} is applied by the in-job agent, not by the harness")

    def apply(self, ctx: InjectionContext, applied: Applied) -> None:
        raise InjectionError(f"{self.name} is applied by the in-job agent, not by the harness")

    def heal(self, ctx: InjectionContext, applied: Applied) -> None:
        """Nothing to undo from outside the job."""

    def revert_command(self, applied: Applied) -> list[str] | None:
        return None


def needs_duration(injector: object) -> bool:
    """True for a fault that must be given a ``duration`` (it holds something until a deadline: a freeze, a
    duty cycle, a mount); the preflight refuses such a fault without one before anything is applied. Declared by
    the injector class as ``needs_duration: ClassVar[bool] = True`` (absent: False)."""
    return bool(getattr(injector, "needs_duration", False))


def is_one_shot(injector: object) -> bool:
    """True for a fault that happens once and has nothing to hold or heal (a signal, a restart): a ``duration``
    on it means nothing, and the preflight refuses one. Declared as ``one_shot: ClassVar[bool] = True``."""
    return bool(getattr(injector, "one_shot", False))


def is_in_job(injector: object) -> bool:
    """True for injectors whose faults the job's own agent applies."""
    return bool(getattr(injector, "in_job", False))
