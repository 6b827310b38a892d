"""The ``crash`` fault: rank R's own agent crashes its process at (``at_step``, ``phase``), the way real code dies.

The phase points are the phase faults' (:mod:`chaos.injob.phase_faults`): ``forward`` (the step begins),
``allreduce`` (inside DDP's comm hook, the bucket's all-reduce started and not yet waited for), ``backward``
(after it) and ``optimizer_step``. Per ``kind``:

- ``exception``: :class:`InjectedFault` (a ``RuntimeError`` naming the op) is raised in the training thread,
  out of the call the script made there (its forward, ``loss.backward()``, ``optimizer.step()``): uncaught, the
  rank ends with its traceback and exit code 1, as for a bug of its own; a script may catch it.
- ``segfault``: a read through a NULL pointer (``ctypes.string_at(0)``: ``strlen(NULL)`` in C), so the kernel
  delivers SIGSEGV and the process dies of it (-11; faulthandler, when the job enabled it, prints the stacks).
- ``abort``: ``os.abort()``: SIGABRT (-6).

Firing: mark the op fired (the cross-restart marker: a restarted rank recomputing the step does not crash again),
report ``fault.applied`` {step, phase, crash_kind, pid, bucket/site in allreduce}, fsync the event file and flush
Python's stdout/stderr (a native crash runs no ``finally``, atexit or buffer flush), then crash. Each op fires
at most once per run.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
from collections.abc import Sequence
from typing import NoReturn, get_args

from chaos import events
from chaos.injob.fault_events import FaultEvents, FiringRules
from chaos.injob.fault_specs import CrashKind, CrashSpec
from chaos.injob.phase_faults import IN_FLIGHT, PHASES, in_this_replica
from chaos.kernel.durable import fsync_path
from chaos.plan.agent_plan import InJobOp, JsonValue

CRASH = "crash"
CRASHES: tuple[str, ...] = get_args(CrashKind)


class InjectedFault(RuntimeError):
    """The exception a ``crash`` fault of kind ``exception`` raises in the training thread; its message names
    the fault, the op, the rank, the step and the phase."""


class CrashFaults:
    """The plan's ``crash`` ops; this rank's (``mine``) fire at their (step, phase), each at most once per run.

    ``ops`` are the whole plan's: every rank refuses misuse alike and says alike whether an ``allreduce`` crash
    needs the comm hook (:attr:`in_collective_wanted`); ``rules`` are the agent's
    (:class:`chaos.injob.fault_events.FiringRules`), as for :class:`chaos.injob.phase_faults.PhaseFaults`. Raises ValueError for an op that would
    never fire: an unknown kind or phase, or ``allreduce`` without a DDP module (``ddp=``) or torchft manager.
    """

    def __init__(self, ops: Sequence[InJobOp], rules: FiringRules) -> None:
        self._rules = rules
        planned = [(op, CrashSpec.from_params(op.params)) for op in ops if op.injector == CRASH]
        for op, spec in planned:
            if spec.phase not in PHASES:
                raise ValueError(f"fault {op.fault!r}: crash phase {spec.phase!r} is not one of {', '.join(PHASES)}")
            if spec.kind not in CRASHES:
                raise ValueError(f"fault {op.fault!r}: crash kind {spec.kind!r} is not one of {', '.join(CRASHES)}")
            if spec.phase == "allreduce" and not rules.has_ddp:
                raise ValueError(
                    f"fault {op.fault!r} crashes inside DDP's gradient all-reduce (phase allreduce), so attach needs "
                    "the DDP-wrapped model: attach(model, optimizer, ddp=ddp_model); without it it would never fire"
                )
        self._in_collective_wanted = any(spec.phase == "allreduce" and in_this_replica(op) for op, spec in planned)
        self._ops = [(op, spec) for op, spec in planned if in_this_replica(op) and rules.mine(op)]
        self._events = FaultEvents(rules.emit, rules.rank)
        self._done: set[str] = set()

    @property
    def phases(self) -> frozenset[str]:
        """The phases at which :meth:`at` may crash this process (empty: never)."""
        return frozenset(spec.phase for _, spec in self._ops)

    @property
    def in_collective_wanted(self) -> bool:
        """Whether an ``allreduce`` crash is planned on any rank (the agent then reduces through its comm hook)."""
        return self._in_collective_wanted

    def in_collective(self, bucket_index: int) -> None:
        """Call inside the comm hook right after starting the bucket's all-reduce, before waiting for it."""
        if "allreduce" in self.phases:
            self.at("allreduce", bucket=bucket_index, site=IN_FLIGHT)

    def at(self, phase: str, **where: JsonValue) -> None:
        """Crash if an op is due at (this step, ``phase``) and has not fired in this run; else return. ``where``
        (bucket, site) goes into ``fault.applied``. Raises :class:`InjectedFault` (kind ``exception``) or does not
        return (``segfault``, ``abort``)."""
        step = self._rules.step()
        for op, spec in self._ops:
            if spec.phase != phase or op.at_step != step or op.op_id in self._done:
                continue
            self._done.add(op.op_id)
            if self._rules.already_fired(op):
                continue  # a restart recomputing the step: the crash already happened in this run
            self._rules.mark_fired(op)  # before the crash: the restarted rank must find it
            pid = os.getpid()
            at = f"in the all-reduce of bucket {where.get('bucket')}" if phase == "allreduce" else f"in phase {phase}"
            description = (
                f"{spec.kind} crash of rank {self._rules.rank} (pid {pid}) by its own agent at step {step}, {at}"
            )
            self._events.applied(op, step, description, phase=phase, crash_kind=spec.kind, pid=pid, **where)
            settle()
            message = f"crash fault {op.fault!r} (op {op.op_id}) on rank {self._rules.rank} at step {step}, {at}"
            crash(spec.kind, message)


def settle() -> None:
    """Make what this process reported survive its crash: fsync the event file (the event's write already
    reached the kernel, one ``os.write``; this puts it on disk) and flush Python's stdout and stderr."""
    path = os.environ.get(events.ENV_EVENTS)
    if path and path != events.STDOUT_SINK:
        with contextlib.suppress(OSError):
            fsync_path(path)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass


def crash(kind: str, message: str) -> NoReturn:
    """End this process as ``kind`` says (module docstring); ``message`` is the exception's."""
    if kind == "segfault":
        ctypes.string_at(0)  # strlen(NULL): an invalid read, SIGSEGV from the kernel
        # Reached only where address 0 is readable (vm.mmap_min_addr = 0 and something mapped page 0).
        signal.signal(signal.SIGSEGV, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGSEGV)
    elif kind == "abort":
        os.abort()
    raise InjectedFault(message)


__all__ = ["CRASH", "CRASHES", "CrashFaults", "InjectedFault", "crash", "settle"]
