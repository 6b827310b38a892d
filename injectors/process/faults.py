"""Process faults: ``kill`` (a signal), ``freeze`` (SIGSTOP for a duration), ``slow`` (SIGSTOP/SIGCONT cycle).

Targets are chosen by exactly one of ``rank`` (through the target's rank resolver), ``pid``, ``port`` (the
process listening on it, :mod:`injectors.process.listeners`) or ``name`` (a regex over the command line; confined
to the target's own process tree when it knows one, see :func:`_matching_names`). Every op records each target's pid AND its kernel start time; apply and heal
signal only pids whose start time still matches, so a pid recycled by a stranger is never touched, even by a
cleanup days later. The harness itself and its ancestors are never targets (freezing them would hang the
run that is supposed to heal). All host access goes through the transport: ``/proc`` is read directly for
the local host and through ``cat``/``ps`` elsewhere.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator, model_validator

from chaos.cluster.base import Transport, TransportError
from chaos.cluster.local import LocalTransport, process_start_time, signal_number
from chaos.cluster.remote_process import WATCHER_MARK
from chaos.kernel.procfs import lineage, parse_stat
from chaos.plugins.injector import (
    Applied,
    FaultOp,
    InjectionContext,
    InjectionError,
    InjectorBase,
    PortName,
    ProcessTreeResolver,
    Unsupported,
    optional_int,
    state_number,
)
from chaos.safety import deadman, remote_deadman
from chaos.spec.units import Duration
from injectors import detached
from injectors.base import HeldFault, OneShot, probe
from injectors.process import dutycycle, listeners
from injectors.process import holds as process_holds

_HELPER_MODULES = (deadman.MODULE, dutycycle.MODULE)
# host-side switches, hold scripts, and the watcher a remote spawn leaves below the job (its command line
# repeats the job's own, so a name that matches the job would match it too)
_HELPER_MARKS = (remote_deadman.MARKER_PREFIX, process_holds.SCRIPT_NAME, WATCHER_MARK)


# -- parameters -------------------------------------------------------------------------------------------------


class ProcessSelector(BaseModel):
    """Which processes a fault hits: exactly one of ``rank``, ``pid``, ``name``, ``replica`` or ``port``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rank: int | None = Field(default=None, ge=0, description="training rank, resolved through the target")
    pid: int | None = Field(default=None, ge=2, description="process id on the host (init is never a target)")
    name: str | None = Field(
        default=None,
        min_length=1,
        description="regex searched in each command line (argv joined with spaces); every match is hit. A target"
        " that knows its processes (torchrun) confines it to them: below its launcher, the launcher only when"
        " nothing below matches",
    )
    replica: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="a serving target's replica (primary, fallback): its model server process at that moment",
    )
    port: Annotated[int, Field(ge=1, le=65535)] | PortName | None = Field(
        default=None,
        description="the process listening on this TCP port on the host: a number, rdzv (a multi-node torchrun "
        "job's rendezvous store: node 0's agent with c10d, etcd with etcd-v2), or a roles target's role (its port)",
    )

    @field_validator("name")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"name is not a valid regex: {exc}") from None
        return value

    @model_validator(mode="after")
    def _exactly_one(self) -> ProcessSelector:
        given = [key for key in ("rank", "pid", "name", "replica", "port") if getattr(self, key) is not None]
        if len(given) != 1:
            found = f"got {', '.join(given)}" if given else "got none"
            raise ValueError(f"select processes with exactly one of rank, pid, name, replica or port ({found})")
        return self


class KillParams(ProcessSelector):
    """Send one signal (SIGKILL by default) to the selected processes."""

    signal: str = Field(default="SIGKILL", description="signal name or number, e.g. SIGKILL, SIGTERM, 9")

    @field_validator("signal")
    @classmethod
    def _known_signal(cls, value: str) -> str:
        return _signal_name(value)


class FreezeParams(ProcessSelector):
    """SIGSTOP the selected processes for the fault's duration, then SIGCONT."""


class SlowParams(ProcessSelector):
    """Stop the selected processes for part of every period (a SIGSTOP/SIGCONT duty cycle)."""

    stopped_fraction: float = Field(default=0.5, gt=0, lt=1, description="share of each period spent stopped")
    period: Duration = Field(default=1.0, gt=0, description="length of one stop+run cycle, e.g. 500ms or 2s")


# -- host access --------------------------------------------------------------------------------------------------


class ProcessHost:
    """Process facts and signals on the fault's host: local /proc directly, remote through the transport."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        self.local = isinstance(transport, LocalTransport)

    def start_time(self, pid: int) -> int | None:
        if self.local:
            return process_start_time(pid)
        done = self.transport.run(["cat", f"/proc/{pid}/stat"], timeout=10)
        stat = parse_stat(done.stdout) if done.ok else None
        return None if stat is None else stat.start_time

    def cmdline(self, pid: int) -> list[str] | None:
        if self.local:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as handle:
                    raw = handle.read().decode(errors="replace")
            except OSError:
                return None
        else:
            done = self.transport.run(["cat", f"/proc/{pid}/cmdline"], timeout=10)
            raw = done.stdout if done.ok else ""
        return raw.split("\0")[:-1] or None

    def command_lines(self) -> dict[int, str]:
        """Every user-space process's argv joined with spaces (kernel threads have none and are left out)."""
        if not self.local:
            done = self.transport.run(["ps", "-ww", "-eo", "pid=,args="], timeout=30, check=True)
            found = {}
            for line in done.stdout.splitlines():
                pid_text, _, args = line.strip().partition(" ")
                if pid_text.isdigit() and args and not args.startswith("["):
                    found[int(pid_text)] = args.strip()
            return found
        found = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit() and (argv := self.cmdline(int(entry))):
                found[int(entry)] = " ".join(argv)
        return found

    def protected(self) -> set[int]:
        """Pids never to target: the harness, its ancestors (local) and init."""
        return {1} | lineage(os.getpid()) if self.local else {1}

    def signal(self, name: str, pids: list[int]) -> None:
        """Send SIG``name`` to ``pids``; a pid that has exited is fine, any other failure raises InjectionError."""
        if not pids:
            return
        argv = ["kill", "-s", name.removeprefix("SIG"), *map(str, pids)]
        try:
            done = self.transport.run(argv, timeout=15)
        except TransportError as exc:
            raise InjectionError(f"cannot send {name} on {self.transport.host}: {exc}") from exc
        problems = [line for line in done.stderr.splitlines() if line.strip() and "no such process" not in line.lower()]
        if not done.ok and problems:
            raise InjectionError(f"{' '.join(argv)} failed on {self.transport.host}: {'; '.join(problems)[:300]}")

    def holds(self) -> process_holds.Holds:
        """The host's hold registry: counted stops, so one fault's SIGCONT never ends another's stop."""
        return process_holds.LocalHolds() if self.local else process_holds.RemoteHolds(self.transport)

    def is_helper(self, pid: int, module: str, op_id: str) -> bool:
        argv = self.cmdline(pid)
        return argv is not None and deadman.module_of(argv) == module and deadman.option(argv, "--op-id") == op_id

    def helpers(self, module: str, op_id: str, recorded: JsonValue) -> list[int]:
        """The op's live ``-m module`` helpers: the journaled pid ``recorded``, or (crash before that record)
        a search by op id; each verified by its command line."""
        found = [recorded] if isinstance(recorded, int) else detached.find(self.command_lines(), module, op_id)
        return [pid for pid in found if self.is_helper(pid, module, op_id)]

    def stop_helpers(self, module: str, op_id: str, recorded: JsonValue) -> None:
        """SIGTERM the op's helpers, SIGKILL the ones still there after 5s."""
        detached.stop(
            self.helpers(module, op_id, recorded),
            lambda pid: self.is_helper(pid, module, op_id),
            self.signal,
            grace_s=5.0,
            poll_s=0.02,
        )


# -- shared steps --------------------------------------------------------------------------------------------------


def _signal_name(value: str | int) -> str:
    """Canonical ``SIGXXX`` for a signal name or number (ValueError naming valid spellings otherwise)."""
    import signal as signals

    number = signal_number(value)
    try:
        return signals.Signals(number).name
    except ValueError:
        raise ValueError(f"unknown signal {value!r}; use a name such as SIGKILL, SIGTERM or SIGSTOP") from None


def _seconds(value: float) -> str:
    return f"{value:g}s"


def resolve_processes(ctx: InjectionContext, selector: ProcessSelector) -> tuple[list[int], list[int], str]:
    """The selected (pids, start times, label). Changes nothing; InjectionError when nothing (safe) matches."""
    host = ProcessHost(ctx.transport)
    protected = host.protected()
    if selector.rank is not None:
        pids = ctx.rank_resolver().pids_for_rank(selector.rank)
        what = f"rank {selector.rank}"
    elif selector.pid is not None:
        pids, what = [selector.pid], f"pid {selector.pid}"
    elif selector.replica is not None:
        pids = ctx.replica_resolver().pids_for_replica(selector.replica)
        what = f"replica {selector.replica}"
    elif selector.port is not None:
        port = ctx.port(selector.port)
        pids, what = listeners.listening_pids(ctx.transport, port), f"the process listening on port {port}"
    else:
        pids, what = _matching_names(ctx, host, selector.name or "", protected)
    refused = [pid for pid in pids if pid in protected]
    if refused:
        raise InjectionError(f"{what} is the harness itself or one of its ancestors (pid {refused[0]}); refusing")
    found = [(pid, start) for pid in dict.fromkeys(pids) if (start := host.start_time(pid)) is not None]
    if not found:
        raise InjectionError(f"no running process for {what} on {ctx.transport.host}")
    pid_text = ", ".join(str(pid) for pid, _ in found)
    label = what if selector.pid is not None else f"{what} (pid{'s' if len(found) > 1 else ''} {pid_text})"
    return [pid for pid, _ in found], [start for _, start in found], label


def _matching_names(ctx: InjectionContext, host: ProcessHost, name: str, protected: set[int]) -> tuple[list[int], str]:
    """The pids whose command line ``name`` matches, and the selector's label.

    A target that knows its own process tree (:class:`ProcessTreeResolver`, e.g. torchrun) confines the match
    to it: the processes below its launcher on this host, so a pattern naming the script never hits the
    launcher (whose command line names the script too) nor a stranger elsewhere on the machine. The launcher
    is hit only when the pattern matches nothing below it (``name: torch.distributed.run`` kills the agent).
    On a host the target runs nothing on (``JobTree.here`` False: a fault aimed at another service's host),
    and for other targets, the match is across the host. Never our own helpers, the harness or its ancestors."""
    pattern = re.compile(name)
    lines = {
        pid: args
        for pid, args in host.command_lines().items()
        if pid not in protected
        and not any(f"-m {module}" in args for module in _HELPER_MODULES)  # our own helpers
        and not any(mark in args for mark in _HELPER_MARKS)  # host-side switches and hold scripts
    }
    if not isinstance(ctx.target, ProcessTreeResolver):
        return sorted(pid for pid, args in lines.items() if pattern.search(args)), f"processes matching {name!r}"
    where = ctx.extras.get("host")
    tree = ctx.target.job_tree(where if isinstance(where, str) else ctx.transport.host)
    if not tree.here:  # the target runs nothing on this host: nothing to scope to
        return sorted(pid for pid, args in lines.items() if pattern.search(args)), f"processes matching {name!r}"
    below = sorted(pid for pid in tree.members if pid in lines and pattern.search(lines[pid]))
    if below:
        return below, f"the target's processes matching {name!r}"
    launchers = sorted(pid for pid in tree.launchers if pid in lines and pattern.search(lines[pid]))
    return launchers, f"the target's launcher matching {name!r}"


def _ints(state: dict[str, JsonValue], key: str) -> list[int]:
    value = state.get(key)
    if not isinstance(value, list) or not all(isinstance(item, int) for item in value):
        raise InjectionError(f"journal state {key!r} is not a list of pids: {value!r}")
    return [item for item in value if isinstance(item, int)]


# -- journal state ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Targets:
    """The processes a fault hit, as journaled: each pid with its kernel start time, and the selector's label.

    The JSON keys (``pids``, ``start_times``, ``selector``) are those of every process-targeting fault's
    journal state (node's ``cpu_throttle`` too); :meth:`from_json` validates them, so heal reads typed fields.
    """

    pids: tuple[int, ...]
    start_times: tuple[int, ...]
    selector: str

    def to_json(self) -> dict[str, JsonValue]:
        return {"pids": list(self.pids), "start_times": list(self.start_times), "selector": self.selector}

    @classmethod
    def from_json(cls, state: dict[str, JsonValue]) -> Targets:
        """InjectionError when the pids or start times are not lists of integers of the same length."""
        pids, starts = _ints(state, "pids"), _ints(state, "start_times")
        if len(pids) != len(starts):
            raise InjectionError("journal state has different numbers of pids and start times")
        return cls(tuple(pids), tuple(starts), str(state.get("selector")))

    def pairs(self, pids: list[int] | None = None) -> list[tuple[int, int]]:
        """(pid, start time) of ``pids`` (default: every recorded target), the keys of the hold registry."""
        starts = dict(zip(self.pids, self.start_times, strict=True))
        return [(pid, starts[pid]) for pid in (self.pids if pids is None else pids)]

    def same(self, host: ProcessHost) -> list[int]:
        """Recorded pids that are still the recorded processes (pid reuse guard)."""
        return [pid for pid, start in zip(self.pids, self.start_times, strict=True) if host.start_time(pid) == start]

    def alive(self, host: ProcessHost, verb: str) -> list[int]:
        """For apply: :meth:`same`, or InjectionError when every target exited (so none could be ``verb``)."""
        alive = self.same(host)
        if not alive:
            raise InjectionError(f"{self.selector} exited before it could be {verb}")
        return alive


@dataclass(frozen=True)
class KillState:
    """The journal state of ``kill``: the targets and the signal."""

    targets: Targets
    signal: str

    def to_json(self) -> dict[str, JsonValue]:
        return {**self.targets.to_json(), "signal": self.signal}

    @classmethod
    def from_json(cls, state: dict[str, JsonValue]) -> KillState:
        signal = state.get("signal")
        if not isinstance(signal, str):
            raise InjectionError(f"journal state has no signal name: {signal!r}")
        return cls(Targets.from_json(state), signal)


@dataclass(frozen=True)
class SlowState:
    """The journal state of ``slow``: the targets, the duty cycle and (once applied) the helper's pid.

    ``apply`` adds ``helper_pid`` and ``helper_start_time`` to the JSON; :meth:`to_json` writes what
    ``prepare`` knows, so a state read back before apply round-trips unchanged.
    """

    targets: Targets
    stopped_fraction: float
    period_s: float
    helper_pid: int | None = None

    def to_json(self) -> dict[str, JsonValue]:
        state = {**self.targets.to_json(), "stopped_fraction": self.stopped_fraction, "period_s": self.period_s}
        return state if self.helper_pid is None else {**state, "helper_pid": self.helper_pid}

    @classmethod
    def from_json(cls, state: dict[str, JsonValue]) -> SlowState:
        return cls(
            Targets.from_json(state),
            state_number(state, "stopped_fraction"),
            state_number(state, "period_s"),
            optional_int(state, "helper_pid"),
        )


def _check_kill(ctx: InjectionContext, params: BaseModel | None = None) -> None:
    if getattr(params, "port", None) is not None:
        listeners.check_ss(ctx.transport)
    replica = getattr(params, "replica", None)
    if replica is not None:
        try:
            known = ctx.replica_resolver().replicas()
        except InjectionError as exc:
            raise Unsupported(str(exc)) from None
        if replica not in known:
            raise Unsupported(f"no replica named {replica!r}; this target has {', '.join(known) or 'none'}")
    if isinstance(ctx.transport, LocalTransport):
        import shutil

        if shutil.which("kill") is None:
            raise Unsupported("the `kill` command is not installed on this host")
        return
    probe(ctx.transport, ["kill", "-l"], "cannot run `kill` on", "`kill -l` fails on {host}", timeout=15, stderr=True)


def _release(ctx: InjectionContext, host: ProcessHost, targets: Targets, applied: Applied) -> None:
    """Heal's release: drop ``applied``'s holds, continuing what no other fault holds. When the registry itself
    fails (e.g. no ``date`` on the host) every target still the same process gets a plain SIGCONT instead: a
    heal must never leave a process stopped for want of bookkeeping."""
    try:
        outcomes = host.holds().release(targets.pairs(), applied.op_id, signal=True)
    except InjectionError:
        host.signal("SIGCONT", targets.same(host))
        return
    process_holds.record_overlaps(ctx, applied, outcomes, healed=True)


def _continue_command(applied: Applied) -> list[str] | None:
    """The dead-man's revert: drop this op's holds and SIGCONT its processes (see :func:`process_holds.revert_argv`)."""
    return process_holds.revert_argv(applied.op_id, Targets.from_json(applied.state).pairs())


# -- injectors ----------------------------------------------------------------------------------------------------


class _ProcessFault(InjectorBase):
    """What the process faults share: ``kill`` on the host (and the replica, when one is named) is checked
    first, and the selected processes are resolved and journaled with their start times."""

    def check(self, ctx: InjectionContext, params: BaseModel) -> None:
        _check_kill(ctx, params)

    @staticmethod
    def _targets(ctx: InjectionContext, selector: ProcessSelector) -> Targets:
        """The selected processes (changes nothing; InjectionError when nothing safe matches)."""
        pids, starts, label = resolve_processes(ctx, selector)
        return Targets(tuple(pids), tuple(starts), label)


class KillInjector(OneShot, _ProcessFault, name="kill", params=KillParams):
    """send a signal (default SIGKILL) to a rank, pid or command-line match

    Signal the selected processes once (SIGKILL by default). Irreversible: heal has nothing to undo."""

    def prepare(self, ctx: InjectionContext, op: FaultOp) -> Applied:
        params = op.params_as(KillParams)
        state = KillState(self._targets(ctx, params), params.signal)
        description = f"{params.signal} {state.targets.selector}"
        return op.record(self.name, ctx.transport.host, state.to_json(), description, reversible=False)

    def apply(self, ctx: InjectionContext, applied: Applied) -> None:
        """Signal the recorded processes still alive; ones that already exited are the goal, not an error."""
        state = KillState.from_json(applied.state)
        host = ProcessHost(ctx.transport)
        host.signal(state.signal, state.targets.same(host))


class FreezeInjector(HeldFault, _ProcessFault, name="freeze", params=FreezeParams):
    """SIGSTOP a rank, pid or command-line match for the fault's duration

    SIGSTOP the selected processes for the op's duration; heal sends SIGCONT to the same processes."""

    def prepare(self, ctx: InjectionContext, op: FaultOp) -> Applied:
        """Resolve targets; InjectionError without a duration (a freeze must always end)."""
        duration = self.duration(op)
        targets = self._targets(ctx, op.params_as(FreezeParams))
        description = f"SIGSTOP {targets.selector} for {_seconds(duration)}"
        return op.record(self.name, ctx.transport.host, targets.to_json(), description)

    def apply(self, ctx: InjectionContext, applied: Applied) -> None:
        """Hold the processes in the host's registry and SIGSTOP them; a process another fault already holds
        is recorded as a ``fault.overlap``."""
        host, targets = ProcessHost(ctx.transport), Targets.from_json(applied.state)
        lasts_s = (applied.duration_s or 0.0) + process_holds.SLACK_S
        pairs = targets.pairs(targets.alive(host, "frozen"))
        outcomes = host.holds().hold(pairs, applied.op_id, lasts_s=lasts_s, holding=True, signal=True)
        process_holds.record_overlaps(ctx, applied, outcomes, healed=False)

    def heal(self, ctx: InjectionContext, applied: Applied) -> None:
        """Release our hold and SIGCONT every recorded process that is still the same process and that no other
        fault holds (those stay stopped, recorded as a ``fault.overlap``); idempotent, fine when all exited."""
        host = ProcessHost(ctx.transport)
        _release(ctx, host, Targets.from_json(applied.state), applied)

    def revert_command(self, applied: Applied) -> list[str] | None:
        return _continue_command(applied)


class SlowInjector(HeldFault, _ProcessFault, name="slow", params=SlowParams):
    """make a rank, pid or command-line match slow with a SIGSTOP/SIGCONT duty cycle

    A SIGSTOP/SIGCONT duty cycle run by a detached helper on the host, so it survives the harness.

    The helper (:mod:`injectors.process.dutycycle`) ends by itself at the op's deadline and always continues the
    targets. ``apply`` adds ``helper_pid``/``helper_start_time`` to ``applied.state`` (journal it with
    ``Journal.applied(op_id, state=applied.state)``); heal also finds the helper by its ``--op-id`` when the
    crash came before that record, so an unjournaled helper is still stopped.
    """

    def check(self, ctx: InjectionContext, params: BaseModel) -> None:
        super().check(ctx, params)
        if not isinstance(ctx.transport, LocalTransport):
            argv = detached.import_argv(ctx.transport, dutycycle.MODULE)
            fails = "mlchaos is not importable by the host's python on {host} (needed for slow)"
            probe(ctx.transport, argv, "cannot run python3 on", fails)

    def prepare(self, ctx: InjectionContext, op: FaultOp) -> Applied:
        """Resolve targets; InjectionError without a duration (the helper must have a deadline)."""
        duration = self.duration(op)
        params = op.params_as(SlowParams)
        state = SlowState(self._targets(ctx, params), params.stopped_fraction, params.period)
        return op.record(
            self.name,
            ctx.transport.host,
            state.to_json(),
            f"SIGSTOP/SIGCONT {state.targets.selector} {params.stopped_fraction:.0%} of every"
            f" {_seconds(params.period)} for {_seconds(duration)}",
        )

    def apply(self, ctx: InjectionContext, applied: Applied) -> None:
        """Start the detached duty-cycle helper; records its pid and start time in ``applied.state``."""
        host, state = ProcessHost(ctx.transport), SlowState.from_json(applied.state)
        alive = state.targets.alive(host, "slowed")
        # Registered (not yet holding) from here to heal, so an overlap shows at apply; the helper holds them
        # only in its stop phases.
        lasts_s = (applied.duration_s or 0.0) + process_holds.SLACK_S
        outcomes = host.holds().hold(
            state.targets.pairs(alive), applied.op_id, lasts_s=lasts_s, holding=False, signal=False
        )
        process_holds.record_overlaps(ctx, applied, outcomes, healed=False)
        until_ns = detached.host_deadline_ns(ctx.transport, applied.duration_s or 0.0)
        starts = {pid: host.start_time(pid) for pid in alive}
        argv = detached.helper_argv(
            ctx.transport,
            dutycycle.MODULE,
            applied.op_id,
            pids=",".join(str(pid) for pid in starts),
            start_times=",".join(str(start) for start in starts.values()),
            stopped_fraction=state.stopped_fraction,
            period=state.period_s,
            until_ns=until_ns,
        )
        log = "dutycycle.log" if host.local else None
        helper = detached.launch(ctx.transport, argv, what="duty-cycle helper", log=log)
        applied.state["helper_pid"] = helper
        applied.state["helper_start_time"] = host.start_time(helper)

    def heal(self, ctx: InjectionContext, applied: Applied) -> None:
        """Stop the helper (verified by cmdline and op id), then release our hold and SIGCONT the recorded
        processes that no other fault holds (a frozen one stays frozen: a ``fault.overlap``).

        Order matters: a helper still running would stop the targets again right after our SIGCONT.
        """
        host, state = ProcessHost(ctx.transport), SlowState.from_json(applied.state)
        host.stop_helpers(dutycycle.MODULE, applied.op_id, state.helper_pid)
        _release(ctx, host, state.targets, applied)

    def revert_command(self, applied: Applied) -> list[str] | None:
        """Stop the duty cycle's helper (it would stop its targets again at its next phase), then continue them."""
        return detached.stop_then(dutycycle.MODULE, applied.op_id, _continue_command(applied) or ())


INJECTORS = (KillInjector, FreezeInjector, SlowInjector)
