"""Process faults the in-job agent fires on its own process at a point inside a training step.

A scenario's ``trigger: {at_step: N, rank: R, phase: P}`` on a ``kill`` reaches the agent of rank R through the
plan file (``InJobOp.phase``). The agent calls :meth:`PhaseFaults.at` at each phase point of its loop hooks:

- ``forward``: ``begin_step`` (before the forward pass);
- ``allreduce``: inside the DDP comm hook, right AFTER this rank started the bucket's all-reduce and before it
  waits for it (:meth:`PhaseFaults.in_collective`): the rank has entered the collective, its peers are in it or
  about to be, and the reduction has not completed;
- ``backward``: ``after_backward`` (the gradient all-reduce finished);
- ``optimizer_step``: ``allow_optimizer_step`` (before ``optimizer.step()``).

An op whose params select a ``replica`` (a roles target) fires only in the processes whose ``CHAOS_REPLICA`` is
that replica. Firing a ``kill``: mark the op fired (so a torchrun restart that recomputes step N does not kill again), emit
``fault.applied`` {step, phase, pid, ... where it fired} (a synchronous O_APPEND write: it is on disk before the
signal), then ``os.kill(os.getpid(), signal)``.

Firing a ``freeze`` (its ``duration_s`` is required): the same marks and ``fault.applied`` {…, duration_s}, then
a thaw process is started in a session of its own (:data:`THAW`: it sleeps ``duration_s``, then SIGCONTs this
process if it is still the same one, by its kernel start time), and the process SIGSTOPs itself, every thread
at once. The thaw does not depend on the harness or the launcher: it is this fault's dead-man switch, so a
harness that dies mid-freeze leaves no stopped rank behind. Once continued, the process reports
``fault.healed`` {frozen_s} itself. A ``slow`` (a duty cycle) is not fired at a phase: the preflight refuses it.

A kill with a plain ``at_step`` trigger on one torchrun rank comes as a ``claimable`` op at phase ``forward``:
the agent of that rank claims it when it attaches (``fault.claimed`` {fault, op}, unless it already fired in this
run) and fires it at the start of the step, like any phase op; the harness then leaves it alone (see
:mod:`chaos.run.triggers`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import get_args

from chaos.event_kinds import FAULT_CLAIMED, TriggerPhase
from chaos.injob.fault_events import FaultEvents, FiringRules
from chaos.kernel.procfs import read_stat
from chaos.plan.agent_plan import InJobOp, JsonValue

# The faults the agent can fire on its own process, and the phase points it calls (see the module docstring).
PROCESS_FAULTS = ("kill", "freeze")
PHASES: tuple[TriggerPhase, ...] = get_args(TriggerPhase)
ENV_REPLICA = "CHAOS_REPLICA"  # set by a roles target in each replica's processes


def in_this_replica(op: InJobOp) -> bool:
    """Whether ``op`` concerns this process's replica: it selects none, or the one in ``CHAOS_REPLICA`` (a roles
    target's replica, e.g. a torchft replica group)."""
    replica = op.params.get("replica")
    return replica is None or replica == os.environ.get(ENV_REPLICA)


IN_FLIGHT = "in_flight"  # the collective site of an allreduce-phase fault: all-reduce started, not waited for
# The thaw of a freeze fired at a phase: ``python -c THAW SECONDS PID START_TIME``. Sleeps, then SIGCONTs PID only
# while /proc says it is still the process that stopped itself (a reused pid is never touched).
THAW = """import os, signal, sys, time
seconds, pid, start = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
time.sleep(seconds)
try:
    stat = open(f"/proc/{pid}/stat").read()
    if stat[stat.rindex(")") + 2:].split()[19] == start:
        os.kill(pid, signal.SIGCONT)
except (OSError, IndexError):
    pass
"""


class PhaseFaults:
    """The plan's phase-triggered process faults (ops with a ``phase``); this rank's (``mine``) fire, each at
    most once per run.

    ``ops`` are the whole plan's (every rank's): every rank refuses misuse alike and installs the same comm hook
    (:attr:`in_collective_wanted`), so all ranks run the same all-reduce code; ``rules``
    (:class:`chaos.injob.fault_events.FiringRules`) say which ops this process fires (the agent's rank rule), the
    current step, the cross-restart markers and whether a comm hook can host the ``allreduce`` phase. Raises ValueError (saying
    what to pass) for an op it cannot fire: a fault other than ``kill``, an unknown phase, or ``allreduce``
    without ``ddp=``: any of them would otherwise silently never fire.
    """

    def __init__(self, ops: Sequence[InJobOp], rules: FiringRules) -> None:
        self._rules = rules
        # A roles target's replica (a torchft replica group) is told apart by CHAOS_REPLICA: an op that selects
        # a replica fires only in that replica's processes (its rank filter is the agent's, on the trigger rank).
        planned = [op for op in ops if op.phase is not None and in_this_replica(op)]
        self._in_collective_wanted = any(op.phase == "allreduce" for op in planned)
        self._ops = [op for op in planned if rules.mine(op)]
        self._phases = frozenset(str(op.phase) for op in self._ops)
        self._events = FaultEvents(rules.emit, rules.rank)
        self._done: set[str] = set()
        for op in self._ops:
            if op.claimable and not rules.already_fired(op):
                rules.emit(FAULT_CLAIMED, rank=rules.rank, fault=op.fault, op=op.op_id, at_step=op.at_step)
        for op in planned:
            if op.injector not in PROCESS_FAULTS:
                raise ValueError(
                    f"fault {op.fault!r} ({op.injector}) has a trigger phase, but the agent fires only "
                    f"{', '.join(PROCESS_FAULTS)} on its own process; drop trigger.phase (the harness applies it)"
                )
            if op.phase not in PHASES:
                raise ValueError(f"fault {op.fault!r}: unknown phase {op.phase!r} (phases: {', '.join(PHASES)})")
            if op.injector == "freeze" and (op.duration_s is None or op.duration_s <= 0):
                raise ValueError(
                    f"fault {op.fault!r} freezes this process at phase {op.phase}, so it needs a duration: the "
                    "process stops itself and is continued when the duration has passed"
                )
            if op.phase == "allreduce" and not rules.has_ddp:
                raise ValueError(
                    f"fault {op.fault!r} fires inside DDP's gradient all-reduce (phase allreduce), so attach needs "
                    "the DDP-wrapped model: attach(model, optimizer=optimizer, ddp=ddp_model) with "
                    "ddp_model = DistributedDataParallel(model); without it the fault would never fire"
                )

    @property
    def phases(self) -> frozenset[str]:
        """The phases at which :meth:`at` may fire something on this process (empty: never; the agent then
        skips the call, which runs at every phase of every step)."""
        return self._phases

    @property
    def in_collective_wanted(self) -> bool:
        """Whether an ``allreduce`` op is planned on any rank (the agent then installs a comm hook that calls us)."""
        return self._in_collective_wanted

    def in_collective(self, bucket_index: int) -> None:
        """Call inside the comm hook right after starting the bucket's all-reduce, before waiting for it."""
        if "allreduce" in self._phases:  # called at every bucket of every step: nothing planned, nothing to do
            self.at("allreduce", bucket=bucket_index, site=IN_FLIGHT)

    def at(self, phase: str, **where: JsonValue) -> None:
        """Fire every op due at (this step, ``phase``) that has not fired in this run; ``where`` (bucket,
        site) goes into the ``fault.applied`` event. A ``kill`` with SIGKILL does not return."""
        step = self._rules.step()
        for op in self._ops:
            if op.phase != phase or op.at_step != step or op.op_id in self._done:
                continue
            self._done.add(op.op_id)
            if self._rules.already_fired(op):
                continue  # a restart recomputing the step: the fault already hit this run
            self._rules.mark_fired(op)  # before the signal: a restarted worker must find it
            if op.injector == "freeze":
                self._freeze(op, phase, step, where)
            else:
                self._kill(op, phase, step, where)

    def _kill(self, op: InJobOp, phase: str, step: int, where: dict[str, JsonValue]) -> None:
        number = _signal(op.params.get("signal", "SIGKILL"))
        pid = os.getpid()
        at = _point(phase, where)
        description = f"{number.name} rank {self._rules.rank} (pid {pid}) by its own agent at step {step}, {at}"
        self._events.applied(op, step, description, phase=phase, pid=pid, signal=number.name, **where)
        # The event is written (one synchronous O_APPEND write) before the signal: the history says where.
        os.kill(pid, number)

    def _freeze(self, op: InJobOp, phase: str, step: int, where: dict[str, JsonValue]) -> None:
        """Stop this process for the op's duration (see the module docstring); returns once continued."""
        seconds = float(op.duration_s or 0.0)
        pid = os.getpid()
        start = _start_time(pid)
        at = _point(phase, where)
        description = (
            f"SIGSTOP rank {self._rules.rank} (pid {pid}) by its own agent at step {step}, {at}, for {seconds:g}s"
        )
        self._events.applied(op, step, description, phase=phase, duration_s=seconds, pid=pid, **where)
        subprocess.Popen(  # the thaw first: nothing could start it once this process is stopped
            [sys.executable, "-c", THAW, repr(seconds), str(pid), start],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )
        stopped = time.monotonic()
        os.kill(pid, signal.SIGSTOP)  # every thread of the process, until the thaw (or anyone) continues it
        self._events.healed(op, frozen_s=round(time.monotonic() - stopped, 3), pid=pid)


def _signal(raw: JsonValue) -> signal.Signals:
    """The signal a kill op names (``SIGTERM``, ``TERM``, ``15`` or 15); SIGKILL when it names none."""
    text = str(raw).upper() if isinstance(raw, (str, int)) and not isinstance(raw, bool) else "SIGKILL"
    if text.isdigit():
        return signal.Signals(int(text))
    name = text if text.startswith("SIG") else f"SIG{text}"
    return signal.Signals[name] if name in signal.Signals.__members__ else signal.SIGKILL


def _point(phase: str, where: dict[str, JsonValue]) -> str:
    """Where in the step a phase fault fired, in words, for its description."""
    return f"in the all-reduce of bucket {where.get('bucket')}" if phase == "allreduce" else f"in phase {phase}"


def _start_time(pid: int) -> str:
    """The kernel start time of ``pid`` (field 22 of /proc/PID/stat), which tells it from a later reuse."""
    stat = read_stat(pid)
    if stat is None:
        raise ProcessLookupError(pid)
    return str(stat.start_time)


__all__ = ["IN_FLIGHT", "PHASES", "PROCESS_FAULTS", "THAW", "PhaseFaults"]
