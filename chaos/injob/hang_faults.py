"""Hang faults the in-job agent fires on its own rank: ``spin`` (stuck in a Python loop) and ``skip_collective``
(the rank skips one collective).

- ``spin`` {rank, phase: forward | backward | optimizer_step (default forward)} with the fault's ``duration``:
  at (``at_step``, phase) the rank reports ``fault.applied`` {step, phase, duration_s}, then loops in Python,
  holding the GIL and burning CPU (``R`` in /proc, CPU time rising), for the duration; then ``fault.healed``
  {spun_s}. Its peers wait for it in their next collective: the hang heals by itself.
- ``skip_collective`` {rank, index (default 0)}: the collective this rank calls at (``at_step``, ``index``: 0 is
  the step's first) returns at once without running (:meth:`chaos.injob.flight_recorder.Recorder.skip_next`;
  an async one returns a completed Work); ``fault.applied`` {step, index, op} is reported when it does. What
  follows is what a real skipped collective does: the peers wait in it; on gloo the rank's next collective on
  the SAME group pairs with the peers' skipped one (gloo matches by order), so training goes on silently
  desynchronized until two collectives of different sizes meet (gloo then aborts); when its next collective
  is on another group the job hangs at once. It does not heal: the job must be restarted.

Each fires at most once per run (the agent's cross-restart markers), like every in-job fault.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import get_args

from chaos.event_kinds import TensorPhase
from chaos.injob.fault_events import FaultEvents
from chaos.injob.flight_recorder import Recorder
from chaos.plan.agent_plan import InJobOp

SPIN = "spin"
SKIP = "skip_collective"
HANG_FAULTS = (SPIN, SKIP)
SPIN_PHASES: tuple[TensorPhase, ...] = get_args(TensorPhase)


class HangFaults:
    """This rank's planned ``spin`` and ``skip_collective`` ops (``mine``); raises ValueError for a misuse."""

    def __init__(
        self,
        ops: Sequence[InJobOp],
        *,
        rank: int,
        step: Callable[[], int],
        emit: Callable[..., None],
        already_fired: Callable[[InJobOp], bool],
        mark_fired: Callable[[InJobOp], None],
    ) -> None:
        self._rank = rank
        self._step = step
        self._events = FaultEvents(emit, rank)
        self._already_fired = already_fired
        self._mark_fired = mark_fired
        self._spins: list[InJobOp] = []
        self._skips: dict[tuple[int, int], InJobOp] = {}
        for op in ops:
            if op.injector == SPIN:
                phase = op.params.get("phase", "forward")
                if phase not in SPIN_PHASES:
                    raise ValueError(f"fault {op.fault!r}: spin phase {phase!r} is not one of {', '.join(SPIN_PHASES)}")
                if op.duration_s is None or op.duration_s <= 0:
                    raise ValueError(f"fault {op.fault!r} spins its rank for its duration: give it a duration")
                if not already_fired(op):
                    self._spins.append(op)
            elif op.injector == SKIP and not already_fired(op):
                index = op.params.get("index", 0)
                self._skips[(op.at_step, index if isinstance(index, int) else 0)] = op

    @property
    def phases(self) -> frozenset[str]:
        """The phases at which :meth:`at` may fire a spin on this rank (empty: never)."""
        return frozenset(str(op.params.get("phase", "forward")) for op in self._spins)

    @property
    def wants_skips(self) -> bool:
        return bool(self._skips)

    def arm(self, recorder: Recorder) -> None:
        """Hand the planned skips to the recorder, which fires them at their (step, index)."""
        for step, index in self._skips:
            recorder.skip_next(step, index)
        recorder.on_skip = self._skipped

    def _skipped(self, step: int, index: int, op_name: str) -> None:
        op = self._skips.pop((step, index), None)
        if op is None:
            return
        self._mark_fired(op)
        description = f"rank {self._rank} skipped collective {index} ({op_name}) of step {step}"
        self._events.applied(op, step, description, index=index, collective=op_name)

    def at(self, phase: str) -> None:
        """Fire the spins due at (this step, ``phase``)."""
        if not self._spins:
            return
        step = self._step()
        for op in [op for op in self._spins if op.at_step == step and op.params.get("phase", "forward") == phase]:
            self._spins.remove(op)
            self._mark_fired(op)
            seconds = float(op.duration_s or 0.0)
            description = f"rank {self._rank} spins in a Python loop for {seconds:g}s at step {step}, phase {phase}"
            self._events.applied(op, step, description, phase=phase, duration_s=seconds)
            began = time.monotonic()
            end = began + seconds
            spins = 0
            while time.monotonic() < end:  # a Python loop: holds the GIL, burns CPU, never reaches a collective
                spins += 1
            self._events.healed(op, spun_s=round(time.monotonic() - began, 3))


__all__ = ["HANG_FAULTS", "SKIP", "SPIN", "SPIN_PHASES", "HangFaults"]
