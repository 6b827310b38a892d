"""Checkpoint checks: after a checkpoint fault, the job resumed only from a checkpoint it verified, and from the one
it should have fallen back to.

Evidence: ``fault.checkpoint`` {fault, op, mode, path, checkpoint, step} (what a ``checkpoint_*`` fault damaged:
the file, the checkpoint it belongs to as the job reported it, and that checkpoint's step when known; recorded
by the injector when the damage is done) and the job's ``target.resume`` {step, attempt, path, verified} and
``target.checkpoint`` {step, path} reports. A ``fault.checkpoint`` with ``torn: false`` (a torn-write window
in which no save came) damaged nothing.

A resume "is" the damaged checkpoint when its path is the damaged checkpoint, the damaged file, or a directory
holding the damaged file, or when its step is the damaged checkpoint's step. A resume "verified" only when the
job says so (``verified: true``, as the reference trainer reports after checking every rank's file against its
manifest); a job that loads what it finds and reports nothing about it did not verify.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from chaos.checks._evidence import capped, cite, events_of, step_events, step_of, verdict_of
from chaos.checks.base import CheckParams, CheckResult, register_check
from chaos.event_kinds import FAULT_CHECKPOINT, TARGET_CHECKPOINT, TARGET_RESUME, TARGET_START
from chaos.history.timeline import Event, History

if TYPE_CHECKING:
    from chaos.spec.scenario import Scenario

CHECK_VERIFIED = "resumed_from_verified_checkpoint"
CHECK_FELL_BACK = "fell_back_to"
NEEDS_DAMAGE = "aim a checkpoint fault (checkpoint_corrupt, checkpoint_torn_write) at the files the job saves"
"""What gives both checks their evidence (their ``to_add``): a checkpoint the fault damaged."""


def _norm(path: str | None) -> str | None:
    return None if not path else os.path.normpath(path)


def _inside(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


@dataclass(frozen=True)
class Damage:
    """One checkpoint a fault damaged: when, which file, which checkpoint (path, step) it belongs to."""

    event: Event
    path: str | None
    checkpoint: str | None
    step: int | None

    def names(self, event: Event) -> bool:
        """True when ``event`` (a resume or a checkpoint report) names this damaged checkpoint: by its step when
        the damage's step is known, else by path (the damaged file, its checkpoint, or a directory holding it)."""
        if self.step is not None:
            return step_of(event) == self.step
        where = _norm(event.get_str("path"))
        if where is None:
            return False
        return any(d is not None and (_inside(d, where) or _inside(where, d)) for d in (self.path, self.checkpoint))

    def holds_at(self, history: History, ts_ns: int) -> bool:
        """True when the damage is still there at ``ts_ns``: done before it, and the job did not write that
        checkpoint anew in between (a ``target.checkpoint`` naming it after the damage)."""
        if self.event.ts_ns >= ts_ns:
            return False
        return not any(
            self.event.ts_ns < e.ts_ns < ts_ns and self.names(e) for e in events_of(history, TARGET_CHECKPOINT)
        )


def damages(history: History, fault: str | None) -> list[Damage]:
    """The checkpoints the fault (every checkpoint fault when ``fault`` is None) damaged, in time order."""
    found = []
    for event in events_of(history, FAULT_CHECKPOINT):
        if (fault is not None and event.get_str("fault") != fault) or event.data.get("torn") is False:
            continue
        found.append(Damage(event, _norm(event.get_str("path")), _norm(event.get_str("checkpoint")), step_of(event)))
    return found


def _no_damage(history: History, fault: str | None) -> str:
    which = f"fault {fault!r}" if fault else "any checkpoint fault"
    windows = [e for e in events_of(history, FAULT_CHECKPOINT) if e.data.get("torn") is False]
    if windows:
        return f"{which} damaged no checkpoint (no save came while the torn-write watcher was armed)"
    return f"no fault.checkpoint event: {which} never damaged a checkpoint file"


class VerifiedParams(CheckParams):
    """``fault``: the checkpoint fault judged (default: every checkpoint fault in the run)."""

    fault: str | None = Field(default=None, description="the checkpoint fault's name (default: all of them)")


@register_check(CHECK_VERIFIED, VerifiedParams, to_add=NEEDS_DAMAGE)
def resumed_from_verified_checkpoint(history: History, p: VerifiedParams, scenario: Scenario | None) -> CheckResult:
    """every resume after a checkpoint fault loaded a checkpoint the job verified, never the damaged one

    ``fail`` when a resume after the damage did not report ``verified: true`` or loaded the damaged
    checkpoint; ``pass`` when every such resume (at least one) verified and avoided it; ``unknown`` when no
    checkpoint was damaged or the job never resumed after the damage."""
    verdict = verdict_of(CHECK_VERIFIED, p.fault, bound="verified, not damaged")
    hits = damages(history, p.fault)
    if not hits:
        return verdict(status="unknown", reason=_no_damage(history, p.fault))
    first = hits[0].event.ts_ns
    resumes = [e for e in events_of(history, TARGET_RESUME) if e.ts_ns > first]
    damage_lines = [cite(history, d.event, f"damaged {d.path} (checkpoint step {d.step})") for d in hits]
    if not resumes:
        return verdict(
            status="unknown",
            reason="no target.resume after the damage: the job never resumed from a checkpoint after it "
            "(it did not restart, started over, or could not load anything)",
            evidence=capped(damage_lines),
        )
    bad: list[str] = []
    good: list[str] = []
    for resume in resumes:
        loaded = next((d for d in hits if d.holds_at(history, resume.ts_ns) and d.names(resume)), None)
        if loaded is not None:
            bad.append(cite(history, resume, f"loaded the damaged checkpoint {loaded.checkpoint or loaded.path}"))
        elif resume.data.get("verified") is not True:
            bad.append(cite(history, resume, "loaded without verifying it (the job reported no verification)"))
        else:
            good.append(cite(history, resume, f"verified {resume.get_str('path')}"))
    if bad:
        return verdict(
            status="fail",
            measured=float(len(bad)),
            unit=" bad resumes",
            reason=f"{len(bad)} of {len(resumes)} resumes after the damage loaded an unverified or damaged checkpoint",
            evidence=capped([*bad, *damage_lines]),
        )
    return verdict(
        status="pass",
        measured=0.0,
        unit=" bad resumes",
        reason=f"all {len(resumes)} resumes after the damage loaded a verified checkpoint other than the damaged one",
        evidence=capped([*damage_lines, *good]),
    )


class FellBackParams(CheckParams):
    """``step``: the checkpoint step the job must resume from after the damage, or ``newest_intact`` (the newest
    checkpoint the job committed before it resumed, other than a damaged one). ``fault``: as above."""

    step: int | Literal["newest_intact"] = Field(default="newest_intact", description="expected resume step")
    fault: str | None = Field(default=None, description="the checkpoint fault's name (default: all of them)")


def newest_intact(history: History, hits: list[Damage], before_ns: int) -> tuple[int | None, list[int]]:
    """The newest step the job reported committed before ``before_ns`` that no damage hit, and the damaged ones."""
    committed: dict[int, Event] = {}
    for event in events_of(history, TARGET_CHECKPOINT):
        step = step_of(event)
        if step is not None and event.ts_ns < before_ns:
            committed[step] = event
    damaged = sorted(
        step
        for step, event in committed.items()
        if any(event.ts_ns < d.event.ts_ns and d.holds_at(history, before_ns) and d.names(event) for d in hits)
    )
    intact = [step for step in committed if step not in damaged]
    return (max(intact) if intact else None), damaged


@register_check(CHECK_FELL_BACK, FellBackParams, to_add=NEEDS_DAMAGE)
def fell_back_to(history: History, p: FellBackParams, scenario: Scenario | None) -> CheckResult:
    """after a checkpoint fault the job resumed from the expected step (default: the newest intact one)

    ``measured`` is the step the job resumed from at its first restart after the damage (every rank that
    reported it). ``pass`` when every rank resumed from the expected step; ``fail`` when any resumed elsewhere
    (the damaged checkpoint, an older one: work lost for nothing) or the ranks disagree; ``unknown`` without a
    damaged checkpoint, without a resume after it, when a rank that started or stepped in that attempt (after the
    damage) reported no resume (where it resumed from is unknown), or (``newest_intact``) without a committed
    checkpoint to expect."""
    verdict = verdict_of(CHECK_FELL_BACK, p.fault)
    hits = damages(history, p.fault)
    if not hits:
        return verdict(status="unknown", reason=_no_damage(history, p.fault))
    first = hits[0].event.ts_ns
    resumes = [e for e in events_of(history, TARGET_RESUME) if e.ts_ns > first and step_of(e) is not None]
    if not resumes:
        return verdict(
            status="unknown", reason="no target.resume after the damage: the job never fell back to anything"
        )
    attempt = resumes[0].get_int("attempt")
    chosen = [e for e in resumes if e.get_int("attempt") == attempt]
    steps = sorted({step for e in chosen if (step := step_of(e)) is not None})
    damage_lines = [cite(history, d.event, f"damaged {d.path}") for d in hits]
    # One rank's resume is not every rank's: a rank of the same attempt that says nothing may have started over.
    present = [
        e
        for e in [*events_of(history, TARGET_START), *step_events(history)]
        if e.rank is not None and e.ts_ns > first and e.get_int("attempt") == attempt
    ]
    silent = sorted({e.rank for e in present if e.rank is not None} - {e.rank for e in chosen})
    if silent:
        return verdict(
            status="unknown",
            reason=f"rank(s) {', '.join(map(str, silent))} ran in attempt {attempt} but reported no resume: where "
            "they resumed from is unknown",
            evidence=capped([*(cite(history, e) for e in chosen), *damage_lines]),
        )
    if p.step == "newest_intact":
        expected, damaged = newest_intact(history, hits, chosen[0].ts_ns)
        if expected is None:
            return verdict(
                status="unknown",
                reason="no intact checkpoint was committed before the resume: nothing to fall back to",
                evidence=capped(damage_lines),
            )
        why = f"newest intact (damaged: {damaged or 'none committed'})"
    else:
        expected, why = p.step, "as the scenario says"
    bound = f"step {expected} ({why})"
    resume_lines = [cite(history, e, f"path {e.get_str('path')}") for e in chosen]
    measured = float(steps[0]) if len(steps) == 1 else None
    if steps != [expected]:
        reason = (
            f"the ranks resumed from different steps {steps}"
            if len(steps) > 1
            else f"resumed from step {steps[0]}, expected step {expected}"
        )
        return verdict(
            status="fail",
            measured=measured,
            bound=bound,
            reason=reason,
            evidence=capped([*resume_lines, *damage_lines]),
        )
    return verdict(
        status="pass",
        measured=measured,
        bound=bound,
        reason=f"every rank ({len(chosen)}) resumed from step {expected} at attempt {attempt}",
        evidence=capped([*damage_lines, *resume_lines]),
    )
