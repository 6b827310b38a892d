"""The ``fault.*`` events of one rank's in-job faults (the agent's tensor and gradient faults, the phase and hang
faults), each naming its op alike: ``{rank, fault, op, injector, ...}``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from chaos.event_kinds import FAULT_APPLIED, FAULT_FAILED, FAULT_HEALED
from chaos.plan.agent_plan import InJobOp, JsonValue


@dataclass(frozen=True)
class FaultEvents:
    """Reports what rank ``rank``'s in-job faults did through ``emit`` (the agent's event sink)."""

    emit: Callable[..., None]
    rank: int

    def applied(self, op: InJobOp, step: int, description: str, **extra: JsonValue) -> None:
        """``fault.applied``: ``op`` fired at ``step``; what it did in words, then ``extra``."""
        self.emit(FAULT_APPLIED, rank=self.rank, **_names(op), description=description, step=step, **extra)

    def healed(self, op: InJobOp, **extra: JsonValue) -> None:
        """``fault.healed``: ``op``'s change is gone (undone, or consumed); ``extra`` says how."""
        self.emit(FAULT_HEALED, rank=self.rank, **_names(op), **extra)

    def failed(self, op: InJobOp, error: str) -> None:
        """``fault.failed``: ``op`` could not fire, and nothing of it is left applied."""
        self.emit(FAULT_FAILED, rank=self.rank, **_names(op), error=error)


@dataclass(frozen=True)
class FiringRules:
    """What a rank's phase-point fault families (:mod:`chaos.injob.phase_faults`, :mod:`chaos.injob.crash_faults`)
    and its collective faults (:mod:`chaos.injob.collective_faults`) take from its agent: which ops are this rank's (``mine``), its ``rank``, the current ``step``, the event sink
    (``emit``), the cross-restart fire-once markers (``already_fired``/``mark_fired``), and whether a comm hook can
    host the ``allreduce`` phase (``has_ddp``)."""

    mine: Callable[[InJobOp], bool]
    rank: int
    step: Callable[[], int]
    emit: Callable[..., None]
    already_fired: Callable[[InJobOp], bool]
    mark_fired: Callable[[InJobOp], None]
    has_ddp: bool


def _names(op: InJobOp) -> dict[str, JsonValue]:
    """``{fault, op, injector}``: the plan's names of ``op``."""
    return {"fault": op.fault, "op": op.op_id, "injector": op.injector}


__all__ = ["FaultEvents", "FiringRules"]
