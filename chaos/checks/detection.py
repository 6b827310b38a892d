"""Detection checks: did something notice each fault, and how fast.

``detected_within`` holds every applied op of one fault to a latency bound: the time from its
``fault.applied`` event to the first event matching a kind glob (``detect.*`` by default) that comes
strictly after it, optionally only on one rank.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from chaos.checks import _evidence as ev
from chaos.checks.base import CheckResult, register_check
from chaos.checks.latency import FaultBound, Latencies, judge_latency, latency_verdict
from chaos.history.timeline import Event, History

if TYPE_CHECKING:
    from chaos.spec.scenario import Scenario

CHECK_DETECTED_WITHIN = "detected_within"


class DetectedWithinParams(FaultBound):
    """Parameters of ``detected_within``: ``within`` bounds the time from each fault.applied to the first
    detection."""

    event: str = Field(
        default="detect.*",
        min_length=1,
        description="glob over event kinds that count as a detection (e.g. detect.collective_*)",
    )
    rank: int | None = Field(
        default=None, ge=0, description="count only detections reported on this rank; null means any rank"
    )
    exclusive: bool = Field(
        default=False,
        description="with rank: the FIRST matching detection after the fault must be on that rank (right culprit)",
    )
    within_steps: int | None = Field(
        default=None,
        ge=0,
        description="also bound the training steps from the fault to the detection (the highest target.step "
        "at the fault vs the detection's own step, else the highest step at the detection)",
    )


@register_check(
    CHECK_DETECTED_WITHIN,
    DetectedWithinParams,
    summary="every applied op of a fault is followed by a matching detection event within a time bound",
)
def detected_within(history: History, params: BaseModel, scenario: Scenario) -> CheckResult:
    """Worst detection latency over the fault's applied ops, in seconds.

    For each ``fault.applied`` of ``fault``: latency = first event matching ``event`` (and ``rank`` when
    set) strictly after the applied timestamp, minus that timestamp. ``pass`` when every op has a detection
    and the worst latency is ``<= within``; ``fail`` when an op has none or one is too slow; ``unknown``
    when the fault was never applied (so a fault that silently failed to fire cannot pass).
    """
    p = ev.narrow(params, DetectedWithinParams)
    verdict = latency_verdict(CHECK_DETECTED_WITHIN, p.fault, p.within)
    ops = ev.applied_ops(history, p.fault)
    if not ops:
        return verdict(status="unknown", reason=ev.missing_fault_reason(history, p.fault))

    where = f"{p.event!r}" + ("" if p.rank is None else f" on rank {p.rank}")
    matching = ev.events_of(history, p.event)
    candidates = [e for e in matching if p.rank is None or e.rank == p.rank]
    steps = ev.events_of(history, "target.step")
    found = Latencies()
    undetected: list[Event] = []
    for op in ops:
        # Strictly after: an event at the very same instant cannot have been caused by the fault.
        first = next((e for e in candidates if e.ts_ns > op.ts_ns), None)
        if first is None:
            undetected.append(op)
            found.evidence.append(ev.cite(history, op, f"no event matching {where} after it"))
            continue
        latency = ev.seconds(first.ts_ns - op.ts_ns)
        found.evidence.append(ev.cite(history, op))
        found.evidence.append(ev.cite(history, first, f"{ev.fmt_seconds(latency)} after {ev.describe(op) or op.kind}"))
        if p.exclusive and p.rank is not None:
            earliest = next(e for e in matching if e.ts_ns > op.ts_ns)
            if earliest.rank != p.rank:
                found.evidence.append(ev.cite(history, earliest, "first detection, on another rank"))
                found.problems.append(
                    f"the first {p.event!r} after {ev.describe(op)} named rank {earliest.rank}, not {p.rank}"
                )
        if p.within_steps is not None:
            at_fault = _highest_step(steps, op.ts_ns)
            at_detection = first.get_int("step")
            if at_detection is None:
                at_detection = _highest_step(steps, first.ts_ns)
            taken = max(0, (at_detection or 0) - (at_fault or 0))
            found.evidence.append(
                f"{taken} step(s) from the fault (step {at_fault}) to the detection (step {at_detection})"
            )
            if taken > p.within_steps:
                found.problems.append(f"detection of {ev.describe(op)} came {taken} steps later, over {p.within_steps}")
        found.add(latency, op)

    if undetected:
        first_missed = undetected[0]
        found.missed = (
            f"{len(undetected)} of {len(ops)} op(s) of {p.fault!r} were never detected: no event matching "
            f"{where} after {ev.describe(first_missed)} at {ev.fmt_offset(history, first_missed.ts_ns)}"
        )
    return judge_latency(
        verdict,
        found,
        p.within,
        too_slow=lambda latency, op: f"detection of {ev.describe(op)} took {ev.fmt_seconds(latency)}",
        passed=f"all {len(ops)} op(s) of {p.fault!r} detected",
        worst_op=ev.describe,
    )


def _highest_step(steps: list[Event], before_ns: int) -> int | None:
    """The highest ``target.step`` reported at or before ``before_ns`` (None before the first step)."""
    reached = [step for e in steps if e.ts_ns <= before_ns and (step := e.get_int("step")) is not None]
    return max(reached) if reached else None
