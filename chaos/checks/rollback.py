"""Rollback after a late-detected corruption: did the job go back to a checkpoint from BEFORE the corruption?

``rolled_back_before_corruption``: a corruption at step S (a weight bit flip on one rank) is detected at step D > S
(the consistency guard's ``detect.divergence`` by default). Every checkpoint at or after S may hold it (the
poisoned rank's gradients reached every rank through the all-reduce at step S itself), so the job must roll back
to a checkpoint strictly older than S, resume from there and train past D. ``matches_golden`` stays the judge of
the final model; this check says whether the recovery decision was right, with the steps to show it.

Evidence it reads, per rank, after the first detection that follows the fault:

- a rollback: ``target.rollback`` {to_step} (the reference trainer's in-place rollback,
  :mod:`chaos.reference.rollback`), or a ``target.resume`` {step} not preceded by one (a job that restarted
  and resumed: its resume step is where it rolled back to). A ``target.resume`` that follows a
  ``target.rollback`` (a job that rolled back by restarting) must name the same step;
- the rank's next ``target.step`` after the rollback: it must be ``to_step + 1`` (the job resumed where it says);
- a later ``target.step`` beyond the last detection's step (it ran past the detection).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pydantic import Field

from chaos.checks._evidence import (
    capped,
    cite,
    events_of,
    fault_ops,
    first_step_hit,
    missing_fault_reason,
    step_events,
    step_of,
    verdict_of,
)
from chaos.checks.base import CheckParams, CheckResult, register_check
from chaos.event_kinds import DETECT_DIVERGENCE, TARGET_RESUME, TARGET_ROLLBACK, TARGET_STEP
from chaos.history.timeline import Event, History

if TYPE_CHECKING:
    from chaos.spec.scenario import Scenario

CHECK = "rolled_back_before_corruption"


class RolledBackParams(CheckParams):
    """Which fault corrupted the state, and which detections must be followed by a rollback."""

    fault: str | None = Field(
        default=None,
        description="the corrupting fault (its first application is the corruption); null: the first "
        "fault applied in the run",
    )
    event: str = Field(default=DETECT_DIVERGENCE, description="glob of the detections a rollback must follow")


def _step_at(history: History, event: Event) -> int | None:
    """``event``'s step, else the highest ``target.step`` reported by its time (None when there is none)."""
    own = step_of(event)
    if own is not None:
        return own
    return max(
        (s for e in step_events(history) if e.ts_ns <= event.ts_ns and (s := step_of(e)) is not None), default=None
    )


@dataclass
class _Rollback:
    """One rank's rollback: the event, where it went, what the rank did next."""

    event: Event
    to_step: int | None
    resume: Event | None = None  # a target.resume that followed a target.rollback (a restart)
    next_step: Event | None = None
    problems: list[str] = field(default_factory=list)


def _rollbacks(history: History, rank: int | None, after_ns: int) -> list[_Rollback]:
    """Rank ``rank``'s rollbacks after ``after_ns`` in time order, each with the resume and step that followed."""
    found: list[_Rollback] = []
    kinds = (TARGET_ROLLBACK, TARGET_RESUME, TARGET_STEP)
    for event in events_of(history, "target.*"):
        if event.rank != rank or event.ts_ns <= after_ns or event.kind not in kinds:
            continue
        open_ = found[-1] if found and found[-1].next_step is None else None
        if event.kind == TARGET_ROLLBACK:
            found.append(_Rollback(event, event.get_int("to_step")))
        elif event.kind == TARGET_RESUME:
            if open_ is not None and open_.event.kind == TARGET_ROLLBACK and open_.resume is None:
                open_.resume = event
            else:
                found.append(_Rollback(event, step_of(event)))
        elif open_ is not None:
            open_.next_step = event
    return found


def _judge_one(history: History, rb: _Rollback, corrupted: int) -> None:
    """Record on ``rb`` what is wrong with it (nothing: a rollback to before the corruption, resumed there)."""
    who = f"rank {rb.event.rank}" if rb.event.rank is not None else "the job"
    to = rb.to_step
    if to is None:
        rb.problems.append(f"{who}'s {rb.event.kind} names no step: where it rolled back to is unknown")
        return
    if to >= corrupted:
        rb.problems.append(
            f"{who} rolled back to step {to}, at or after the corruption at step {corrupted}: that checkpoint "
            "may already hold it"
        )
    if rb.resume is not None and step_of(rb.resume) != to:
        rb.problems.append(f"{who} rolled back to step {to} but then resumed from step {step_of(rb.resume)}")
    if rb.next_step is not None and step_of(rb.next_step) != to + 1:
        rb.problems.append(
            f"{who} rolled back to step {to} but its next step was {step_of(rb.next_step)}, not {to + 1}"
        )


@register_check(CHECK, RolledBackParams)
def rolled_back_before_corruption(history: History, p: RolledBackParams, scenario: Scenario) -> CheckResult:
    """after a late detection the job rolled back to a checkpoint older than the corruption and ran past it

    measured = the newest step any rank rolled back to; bound = ``< S``, S the corruption's step.

    ``unknown`` when the fault never applied, or no detection (``event``) follows it (nothing to roll back from;
    ``sdc_detected`` judges detection), or a rollback names no step. ``fail`` when no rank rolled back after the
    detection, a rollback went to step S or later (that checkpoint may hold the corruption), a rank's next step
    after its rollback is not the step after the rollback's (or a restart resumed elsewhere), a detection came
    after the last rollback with no rollback after it, or a rank never got past the last detection's step after
    rolling back. ``pass`` otherwise: every rollback after the detection went strictly before S, resumed there,
    and training went on past the detection.
    """
    verdict = verdict_of(CHECK, p.fault)
    ops = fault_ops(history, p.fault)
    if not ops:
        none = "no fault was applied: there is no corruption to roll back from"
        return verdict(status="unknown", reason=none if p.fault is None else missing_fault_reason(history, p.fault))
    op = ops[0]
    corrupted = first_step_hit(history, op)  # its checkpoint, and every later one, may hold the corruption
    bound = f"< {corrupted}"
    evidence = [cite(history, op, f"the corruption: every checkpoint from step {corrupted} on may hold it")]
    detections = [e for e in events_of(history, p.event) if e.ts_ns > op.ts_ns]
    if not detections:
        return verdict(
            status="unknown",
            bound=bound,
            evidence=evidence,
            reason=f"no {p.event} after the fault: nothing to roll back from (sdc_detected judges the detection)",
        )
    first, last = detections[0], detections[-1]
    evidence.append(cite(history, first, "the detection"))
    ranks = sorted(
        {e.rank for e in step_events(history)} | {e.rank for e in events_of(history, TARGET_ROLLBACK)},
        key=lambda r: (r is None, r or 0),
    )
    rollbacks = [rb for rank in ranks for rb in _rollbacks(history, rank, first.ts_ns)]
    if not rollbacks:
        return verdict(
            status="fail",
            bound=bound,
            evidence=evidence,
            reason=f"the corruption was detected at step {_step_at(history, first)} but no rank rolled back after it "
            f"(no {TARGET_ROLLBACK} or {TARGET_RESUME})",
        )
    for rb in rollbacks:
        _judge_one(history, rb, corrupted)
    unnamed = [rb for rb in rollbacks if rb.to_step is None]
    problems = [text for rb in rollbacks if rb.to_step is not None for text in rb.problems]
    newest = max((rb.to_step for rb in rollbacks if rb.to_step is not None), default=None)
    last_rollback = max(rb.event.ts_ns for rb in rollbacks)
    if last.ts_ns > last_rollback:
        problems.append(
            f"the detection at step {_step_at(history, last)} came after the last rollback and none followed it"
        )
    rolled = {rb.event.rank for rb in rollbacks}
    for rank in ranks:
        if rank not in rolled and any(e.rank == rank and e.ts_ns > first.ts_ns for e in step_events(history)):
            who = f"rank {rank}" if rank is not None else "the job"
            problems.append(f"{who} kept training after the detection without rolling back")
    detected = _step_at(history, last)
    for rank in sorted({rb.event.rank for rb in rollbacks}, key=lambda r: (r is None, r or 0)):
        since = max(rb.event.ts_ns for rb in rollbacks if rb.event.rank == rank)
        later = [
            s for e in step_events(history) if e.rank == rank and e.ts_ns > since and (s := step_of(e)) is not None
        ]
        if detected is not None and not any(s > detected for s in later):
            who = f"rank {rank}" if rank is not None else "the job"
            reached = f"step {max(later)}" if later else "no step"
            problems.append(
                f"after rolling back, {who} never got past the detection's step {detected} (reached {reached})"
            )
    for rb in rollbacks[:6]:
        note = f"to step {rb.to_step}" + ("" if rb.next_step is None else f", next step {step_of(rb.next_step)}")
        evidence.append(cite(history, rb.event, note))
    measured = None if newest is None else float(newest)
    if problems:
        return verdict(
            status="fail", measured=measured, bound=bound, reason="; ".join(problems), evidence=capped(evidence)
        )
    if unnamed:
        return verdict(
            status="unknown",
            measured=measured,
            bound=bound,
            evidence=capped(evidence),
            reason="; ".join(text for rb in unnamed for text in rb.problems),
        )
    assert newest is not None
    first_rb = min(rollbacks, key=lambda rb: rb.event.ts_ns)
    from_step = first_rb.event.get_int("from_step")
    replayed = "" if from_step is None else f", replaying {from_step - newest} step(s)"
    return verdict(
        status="pass",
        measured=measured,
        bound=bound,
        evidence=capped(evidence),
        reason=f"corrupted at step {corrupted}, detected at step {_step_at(history, first)}; every rank rolled back "
        f"to step {newest} or older{replayed}, and ran past step {detected}",
    )
