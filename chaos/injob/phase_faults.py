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
signal), then ``os.kill(os.getpid(), signal)``. Only ``kill`` is fired this way: a process that stops itself
(``freeze``/``slow``) needs someone outside to continue it, which the harness does not yet arm for an in-job
stop; the preflight refuses those with a phase, and :class:`PhaseFaults` refuses them at attach.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Sequence

from pydantic import JsonValue

from chaos.plan.agent_plan import InJobOp

# The faults the agent can fire on its own process, and the phase points it calls (see the module docstring).
PROCESS_FAULTS = ("kill",)
PHASES = ("forward", "allreduce", "backward", "optimizer_step")
ENV_REPLICA = "CHAOS_REPLICA"  # set by a roles target in each replica's processes
IN_FLIGHT = "in_flight"  # the collective site of an allreduce-phase fault: all-reduce started, not waited for


class PhaseFaults:
    """The plan's phase-triggered process faults (ops with a ``phase``); this rank's (``mine``) fire, each at
    most once per run.

    ``ops`` are the whole plan's (every rank's): every rank refuses misuse alike and installs the same comm hook
    (:attr:`in_collective_wanted`), so all ranks run the same all-reduce code; ``mine`` says which ops this
    process fires (the agent's rank rule). ``step`` reads the agent's current step; ``already_fired``/``mark_fired`` are the agent's cross-restart
    markers; ``has_ddp`` says whether a comm hook can host the ``allreduce`` phase. Raises ValueError (saying
    what to pass) for an op it cannot fire: a fault other than ``kill``, an unknown phase, or ``allreduce``
    without ``ddp=``: any of them would otherwise silently never fire.
    """

    def __init__(
        self,
        ops: Sequence[InJobOp],
        *,
        mine: Callable[[InJobOp], bool],
        rank: int,
        step: Callable[[], int],
        emit: Callable[..., None],
        already_fired: Callable[[InJobOp], bool],
        mark_fired: Callable[[InJobOp], None],
        has_ddp: bool,
    ) -> None:
        # A roles target's replica (a torchft replica group) is told apart by CHAOS_REPLICA: an op that selects
        # a replica fires only in that replica's processes (its rank filter is the agent's, on the trigger rank).
        here = os.environ.get(ENV_REPLICA)
        planned = [op for op in ops if op.phase is not None and op.params.get("replica") in (None, here)]
        self._in_collective_wanted = any(op.phase == "allreduce" for op in planned)
        self._ops = [op for op in planned if mine(op)]
        self._rank = rank
        self._step = step
        self._emit = emit
        self._already_fired = already_fired
        self._mark_fired = mark_fired
        self._done: set[str] = set()
        for op in planned:
            if op.injector not in PROCESS_FAULTS:
                raise ValueError(
                    f"fault {op.fault!r} ({op.injector}) has a trigger phase, but the agent fires only "
                    f"{', '.join(PROCESS_FAULTS)} on its own process; drop trigger.phase (the harness applies it)"
                )
            if op.phase not in PHASES:
                raise ValueError(f"fault {op.fault!r}: unknown phase {op.phase!r} (phases: {', '.join(PHASES)})")
            if op.phase == "allreduce" and not has_ddp:
                raise ValueError(
                    f"fault {op.fault!r} fires inside DDP's gradient all-reduce (phase allreduce), so attach needs "
                    "the DDP-wrapped model: attach(model, optimizer=optimizer, ddp=ddp_model) with "
                    "ddp_model = DistributedDataParallel(model); without it the fault would never fire"
                )

    @property
    def in_collective_wanted(self) -> bool:
        """Whether an ``allreduce`` op is planned on any rank (the agent then installs a comm hook that calls us)."""
        return self._in_collective_wanted

    def in_collective(self, bucket_index: int) -> None:
        """Call inside the comm hook right after starting the bucket's all-reduce, before waiting for it."""
        self.at("allreduce", bucket=bucket_index, site=IN_FLIGHT)

    def at(self, phase: str, **where: JsonValue) -> None:
        """Fire every op due at (this step, ``phase``) that has not fired in this run; ``where`` (bucket,
        site) goes into the ``fault.applied`` event. A ``kill`` with SIGKILL does not return."""
        step = self._step()
        for op in self._ops:
            if op.phase != phase or op.at_step != step or op.op_id in self._done:
                continue
            self._done.add(op.op_id)
            if self._already_fired(op):
                continue  # a restart recomputing the step: the fault already hit this run
            self._mark_fired(op)  # before the signal: a restarted worker must find it
            self._kill(op, phase, step, where)

    def _kill(self, op: InJobOp, phase: str, step: int, where: dict[str, JsonValue]) -> None:
        raw = op.params.get("signal", "SIGKILL")
        name = raw if isinstance(raw, str) else "SIGKILL"
        number = signal.Signals[name] if name in signal.Signals.__members__ else signal.SIGKILL
        pid = os.getpid()
        at = f"in the all-reduce of bucket {where.get('bucket')}" if phase == "allreduce" else f"in phase {phase}"
        self._emit(
            "fault.applied",
            rank=self._rank,
            fault=op.fault,
            op=op.op_id,
            injector=op.injector,
            description=f"{number.name} rank {self._rank} (pid {pid}) by its own agent at step {step}, {at}",
            step=step,
            phase=phase,
            pid=pid,
            signal=number.name,
            **where,
        )
        # The event is written (one synchronous O_APPEND write) before the signal: the history says where.
        os.kill(pid, number)


__all__ = ["IN_FLIGHT", "PHASES", "PROCESS_FAULTS", "PhaseFaults"]
