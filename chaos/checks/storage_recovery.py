"""Storage recovery checks (after Lablup's report): the restore straggler, and saves retried with backoff.

Both judge the job's account against what the ``storage`` fault layer itself reports (``storage.hit`` events,
recorded at heal from the daemon's own counts: op, path, errno, count, first/last and the hit times), so a job
cannot pass by claiming a recovery the layer never forced on it.

- ``restore_straggler_named``: after a read-latency fault on one rank's checkpoint files, the slowest
  ``target.restore`` {duration_s} of the restored attempt is that rank's; names it, its excess over the next
  slowest rank, and the time to resume (from the restarted attempt's first ``target.start`` to its first
  ``target.step``).
- ``retried_with_backoff``: a transient error window (``eio``/``enospc``) over saves; the failed attempts
  (the job's ``target.checkpoint_retry``, or, for a job that reports none, the bursts of errors the layer
  returned) are at least ``min_attempts``, at most ``max_attempts``, their gaps grow by ``growth`` (until
  ``cap``), the job neither gave up (``target.checkpoint_failed``), crashed nor restarted, the layer returned
  no more errors than such attempts explain (no tight loop), and a ``target.checkpoint`` committed after the
  last failure.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, NamedTuple

from pydantic import Field

from chaos.checks._evidence import (
    Verdict,
    applied_ops,
    attempt_of,
    capped,
    cite,
    events_of,
    fmt_offset,
    fmt_seconds,
    missing_fault_reason,
    seconds,
    step_of,
    verdict_of,
)
from chaos.checks.base import CheckParams, CheckResult, register_check
from chaos.event_kinds import (
    STORAGE_HIT,
    TARGET_CHECKPOINT,
    TARGET_CHECKPOINT_FAILED,
    TARGET_CHECKPOINT_RETRY,
    TARGET_EXIT,
    TARGET_RESTORE,
    TARGET_START,
    TARGET_STEP,
)
from chaos.history.timeline import Event, History
from chaos.spec.units import Duration

if TYPE_CHECKING:
    from chaos.spec.scenario import Scenario

CHECK_STRAGGLER = "restore_straggler_named"
CHECK_RETRIED = "retried_with_backoff"

BURST_S = 0.05
"""Errors the layer returned less than this apart belong to one attempt (one save touches several files)."""
ERRORS_PER_ATTEMPT = 16
"""The most errors one failed save attempt plausibly meets (create, write, fsync, cleanup of several files):
more than ``max_attempts`` times this is a tight loop, whatever the job reports."""
GROWTH_SLACK = 0.9
"""A gap may fall this much short of ``growth`` x the previous one (timer and scheduling noise)."""
TIE_S = 2.0
"""A job's retry counts as caused by the fault when it lies within this of the errors the layer returned."""
_RANK_IN_PATH = re.compile(r"(?:^|[/_.-])rank[-_]?(\d+)(?=$|[/_.-])")


def _hits(history: History, fault: str) -> list[Event]:
    return [e for e in events_of(history, STORAGE_HIT) if e.get_str("fault") == fault]


def _number(event: Event, key: str) -> float | None:
    value = event.data.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _times(hit: Event) -> list[int]:
    raw = hit.data.get("times_ns")
    found = [t for t in raw if isinstance(t, int) and not isinstance(t, bool)] if isinstance(raw, list) else []
    return found or [hit.ts_ns]


def _describe_hit(history: History, hit: Event) -> str:
    what = hit.data.get("errno_name") or f"delayed {fmt_seconds(_number(hit, 'latency_s') or 0.0)}"
    last = hit.get_int("last_ns") or hit.ts_ns
    return (
        f"storage.hit {hit.get_str('op')} {hit.get_str('path')} {what} x{hit.get_int('count')} "
        f"from {fmt_offset(history, hit.ts_ns)} to {fmt_offset(history, last)}"
    )


def _is_error(hit: Event) -> bool:
    return hit.data.get("errno_name") is not None


def _is_delayed_read(hit: Event) -> bool:
    return hit.data.get("errno_name") is None and hit.get_str("op") == "read"


class _Forced(NamedTuple):
    """What the storage layer forced on the job: the fault's first applied op, the hits judged, their evidence."""

    op: Event
    hits: list[Event]
    evidence: list[str]


def _forced(
    history: History, fault: str, verdict: Verdict, kind: Callable[[Event], bool], none: str
) -> _Forced | CheckResult:
    """The layer's hits of ``fault`` of the ``kind`` judged; ``unknown`` instead when the fault never applied or
    the layer reported no such hit (the reason: ``none``)."""
    ops = applied_ops(history, fault)
    if not ops:
        return verdict(status="unknown", reason=missing_fault_reason(history, fault))
    hits = [h for h in _hits(history, fault) if kind(h)]
    evidence = [cite(history, ops[0]), *(_describe_hit(history, h) for h in hits)]
    if not hits:
        return verdict(status="unknown", reason=none, evidence=capped(evidence))
    return _Forced(ops[0], hits, evidence)


# ---------------------------------------------------------------------------------------------------------
# restore_straggler_named


class StragglerParams(CheckParams):
    """Parameters of ``restore_straggler_named``."""

    fault: str = Field(description="the storage fault that slows one rank's checkpoint reads")
    rank: int | None = Field(
        default=None, ge=0, description="the rank whose files it slows (default: read from the delayed paths)"
    )
    min_excess: Duration = Field(default=0.0, ge=0, description="how much slower than every other restore it must be")
    resume_within: Duration | None = Field(
        default=None, gt=0, description="largest time to resume: restarted attempt's first start to its first step"
    )


def _aimed_rank(delayed: list[Event]) -> set[int]:
    return {int(m.group(1)) for hit in delayed if (m := _RANK_IN_PATH.search(hit.get_str("path") or ""))}


@register_check(CHECK_STRAGGLER, StragglerParams)
def restore_straggler_named(history: History, p: StragglerParams, scenario: Scenario | None) -> CheckResult:
    """after a read-latency fault on one rank's checkpoint files, that rank is the slowest restore (named)

    ``pass`` when the slowest ``target.restore`` of the first attempt restored after the fault is the rank
    whose files the layer delayed (by ``min_excess`` over the next slowest) and the job resumed (within
    ``resume_within`` when set); ``fail`` when another rank was slowest, the aimed rank never reported a
    restore while others did, or the job never stepped after it; ``unknown`` when the fault never applied,
    the layer delayed no read (no ``storage.hit``), the delayed paths name no single rank (and ``rank`` is
    not given), fewer than two ranks reported a restore, or the delays fall outside the aimed rank's restore.
    ``measured``: the straggler's excess over the next slowest restore, in seconds."""
    bound = f"slowest restore is the delayed rank's, by > {fmt_seconds(p.min_excess)}"
    verdict = verdict_of(CHECK_STRAGGLER, p.fault, bound=bound, unit="s")
    none = f"the layer of {p.fault!r} delayed no read (no storage.hit of a read): it never hit a restore"
    forced = _forced(history, p.fault, verdict, _is_delayed_read, none)
    if isinstance(forced, CheckResult):
        return forced
    op, delayed, evidence = forced
    ranks = {p.rank} if p.rank is not None else _aimed_rank(delayed)
    if len(ranks) != 1:
        named = ", ".join(map(str, sorted(ranks))) or "none"
        return verdict(
            status="unknown",
            reason=f"the delayed paths name no single rank (ranks found: {named}); give the check's rank",
            evidence=capped(evidence),
        )
    aimed = ranks.pop()
    restores = [e for e in events_of(history, TARGET_RESTORE) if e.rank is not None and e.ts_ns >= op.ts_ns]
    restores = [e for e in restores if _number(e, "duration_s") is not None]
    if not restores:
        return verdict(
            status="unknown",
            reason="no target.restore {duration_s} after the fault: the job reports no restore evidence",
            evidence=capped(evidence),
        )
    attempt = _attempt(history, restores[0])
    first: dict[int, Event] = {}
    for event in restores:
        if _attempt(history, event) == attempt and event.rank is not None:
            first.setdefault(event.rank, event)
    durations = {rank: _number(event, "duration_s") or 0.0 for rank, event in first.items()}
    evidence += [cite(history, e, f"restore took {fmt_seconds(durations[r])}") for r, e in sorted(first.items())]
    if aimed not in first:
        return verdict(
            status="fail",
            reason=f"rank {aimed}, whose files the layer delayed, reported no restore in attempt {attempt}",
            evidence=capped(evidence),
        )
    if len(first) < 2:
        return verdict(
            status="unknown",
            reason=f"only rank(s) {', '.join(map(str, sorted(first)))} reported a restore in attempt {attempt}: "
            "nothing to compare",
            evidence=capped(evidence),
        )
    end = first[aimed].ts_ns
    begin = end - round(durations[aimed] * 1e9)
    inside = [t for h in delayed for t in _times(h) if begin - 1e9 <= t <= end + 1e9]
    if not inside:
        return verdict(
            status="unknown",
            reason=f"none of the delayed reads falls within rank {aimed}'s restore "
            f"({fmt_offset(history, begin)}..{fmt_offset(history, end)}): the fault did not hit it",
            evidence=capped(evidence),
        )
    straggler = max(durations, key=lambda r: (durations[r], -r))
    others = max(d for r, d in durations.items() if r != straggler)
    excess = durations[straggler] - others
    resume, resume_text = _time_to_resume(history, attempt, min(e.ts_ns for e in first.values()))
    evidence.append(resume_text)
    named = f"rank {straggler} was the restore straggler: {fmt_seconds(durations[straggler])} against at most " + (
        f"{fmt_seconds(others)} for the others (+{fmt_seconds(excess)}); {resume_text}"
    )
    if straggler != aimed:
        return verdict(
            status="fail",
            measured=durations[aimed] - max(d for r, d in durations.items() if r != aimed),
            reason=f"{named}, but the layer delayed rank {aimed}'s reads ({fmt_seconds(durations[aimed])})",
            evidence=capped(evidence),
        )
    if excess <= p.min_excess:
        return verdict(
            status="fail",
            measured=excess,
            reason=f"{named}: not more than {fmt_seconds(p.min_excess)} slower",
            evidence=capped(evidence),
        )
    if resume is None or (p.resume_within is not None and resume > p.resume_within):
        bound = "" if p.resume_within is None else f" (bound {fmt_seconds(p.resume_within)})"
        return verdict(status="fail", measured=excess, reason=f"{named}{bound}", evidence=capped(evidence))
    return verdict(status="pass", measured=excess, reason=named, evidence=capped(evidence))


def _attempt(history: History, event: Event) -> int:
    """The restart attempt of ``event``: its own ``attempt``, else that of its rank's latest ``target.start``."""
    if event.get_int("attempt") is not None:
        return attempt_of(event)
    starts = [e for e in events_of(history, TARGET_START) if e.rank == event.rank and e.ts_ns <= event.ts_ns]
    return attempt_of(starts[-1]) if starts else 0


def _time_to_resume(history: History, attempt: int, restored_ns: int) -> tuple[float | None, str]:
    """Seconds from the attempt's first ``target.start`` (the restart) to its first ``target.step`` after
    ``restored_ns`` (its first restore)."""
    starts = [e for e in events_of(history, TARGET_START) if attempt_of(e) == attempt]
    # Only a step after the restore shows the job resumed: a job that reports no attempts puts every step
    # in attempt 0, those from before the fault too.
    steps = [e for e in events_of(history, TARGET_STEP) if attempt_of(e) == attempt and e.ts_ns > restored_ns]
    if not starts:
        return None, f"time to resume unknown: no target.start of attempt {attempt}"
    if not steps:
        return None, f"attempt {attempt} never stepped after its restore: it did not resume"
    took = seconds(steps[0].ts_ns - starts[0].ts_ns)
    return took, f"time to resume {fmt_seconds(took)} (attempt {attempt}: start to step {step_of(steps[0])})"


# ---------------------------------------------------------------------------------------------------------
# retried_with_backoff


class RetryParams(CheckParams):
    """Parameters of ``retried_with_backoff``."""

    fault: str = Field(description="the storage fault (mode eio or enospc) over the checkpoint dir")
    min_attempts: int = Field(
        default=3, ge=3, description="failed attempts needed to judge the backoff (3 or more: two gaps to compare)"
    )  # two attempts make one gap: nothing could show it grew, and the check would pass on a fixed delay
    growth: float = Field(default=1.5, gt=1, description="each gap between failed attempts >= growth x the previous")
    max_attempts: int = Field(default=12, ge=1, description="the most failed attempts a save may take")
    cap: Duration | None = Field(default=None, gt=0, description="a gap this long counts as capped: need not grow")


@dataclass(frozen=True)
class _Attempts:
    """The failed attempts judged: their times, the step and rank (None when inferred from storage), the source."""

    times: list[int]
    step: int | None
    rank: int | None
    source: str


def _bursts(times: list[int]) -> list[tuple[int, int]]:
    """Each run of error times less than :data:`BURST_S` apart: (its start, how many errors)."""
    runs: list[tuple[int, int]] = []
    last: int | None = None
    for t in sorted(times):
        if last is None or t - last > BURST_S * 1e9:
            runs.append((t, 0))
        runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        last = t
    return runs


def _job_attempts(history: History, after_ns: int, first_err: int, last_err: int) -> list[_Attempts]:
    """Per (rank, step), the job's own reported failures tied to the layer's errors."""
    series: dict[tuple[int | None, int | None], list[int]] = {}
    for event in events_of(history, TARGET_CHECKPOINT_RETRY):
        if event.ts_ns >= after_ns and first_err - TIE_S * 1e9 <= event.ts_ns <= last_err + TIE_S * 1e9:
            series.setdefault((event.rank, step_of(event)), []).append(event.ts_ns)
    return [
        _Attempts(sorted(ts), step, rank, "the job's target.checkpoint_retry") for (rank, step), ts in series.items()
    ]


@register_check(CHECK_RETRIED, RetryParams)
def retried_with_backoff(history: History, p: RetryParams, scenario: Scenario | None) -> CheckResult:
    """saves failing in a storage error window are retried with growing gaps, then succeed (no crash, no spin)

    See the module docstring. ``unknown`` when the fault never applied, the layer returned no error (no
    ``storage.hit`` with an errno: no save ran in the window) or fewer than ``min_attempts`` failures were seen;
    ``fail`` on a give-up, a crash or restart, a tight loop, gaps that do not grow, or no committed save after
    the last failure. ``measured``: the failed attempts and their gaps."""
    bound = f"{p.min_attempts}..{p.max_attempts} attempts, gaps x{p.growth:g}, then a committed save"
    verdict = verdict_of(CHECK_RETRIED, p.fault, bound=bound)
    none = f"the layer of {p.fault!r} returned no error (no storage.hit with an errno): no save met it"
    forced = _forced(history, p.fault, verdict, _is_error, none)
    if isinstance(forced, CheckResult):
        return forced
    op, errors, evidence = forced
    times = sorted(t for h in errors for t in _times(h))
    first_err, last_err = min(h.ts_ns for h in errors), max(h.get_int("last_ns") or h.ts_ns for h in errors)
    count = sum(h.get_int("count") or 0 for h in errors)
    rate = count / max(seconds(last_err - first_err), 1e-3)
    evidence.append(f"the layer returned {count} error(s) in {fmt_seconds(seconds(last_err - first_err))}")
    series = _job_attempts(history, op.ts_ns, first_err, last_err)
    bursts = _bursts(times)
    densest = max(n for _, n in bursts)
    attempts = (
        max(series, key=lambda a: (len(a.times), -(a.rank or 0)))
        if series
        else _Attempts(
            [t for t, _ in bursts], None, None, "bursts of errors the layer returned (the job reports no retry)"
        )
    )
    gaps = [seconds(b - a) for a, b in zip(attempts.times, attempts.times[1:], strict=False)]
    whose = "" if attempts.rank is None else f" of rank {attempts.rank}"
    step_text = "" if attempts.step is None else f" (step {attempts.step})"
    measured = f"{len(attempts.times)} failed attempt(s), gaps " + (
        "/".join(f"{g:.2f}" for g in gaps) + "s" if gaps else "none"
    )
    evidence.append(
        f"failed attempts{whose}{step_text} from {attempts.source}: "
        + ", ".join(fmt_offset(history, t) for t in attempts.times[:12])
    )
    fail = partial(verdict, status="fail", measured=measured)

    gave_up = [e for e in events_of(history, TARGET_CHECKPOINT_FAILED) if e.ts_ns >= op.ts_ns]
    if gave_up:
        evidence.append(cite(history, gave_up[0]))
        tries = gave_up[0].get_int("attempts")
        return fail(reason=f"the job gave up the save after {tries} attempt(s)", evidence=capped(evidence))
    if count > p.max_attempts * ERRORS_PER_ATTEMPT or densest > ERRORS_PER_ATTEMPT:
        return fail(
            measured=f"{count} errors in {fmt_seconds(seconds(last_err - first_err))}",
            reason=f"a tight loop: the layer returned {count} errors ({rate:.0f}/s, {densest} or more less than "
            f"{fmt_seconds(BURST_S)} apart), more than {p.max_attempts} attempts of a save explain",
            evidence=capped(evidence),
        )
    if len(attempts.times) > p.max_attempts:
        return fail(
            reason=f"{len(attempts.times)} failed attempts, more than {p.max_attempts}", evidence=capped(evidence)
        )
    committed = _committed_after(history, attempts, last_err)
    died = _died(history, first_err, committed)
    if died is not None:
        evidence.append(cite(history, died))
        return fail(
            reason=f"the job {'exited' if died.kind == TARGET_EXIT else 'restarted'} after the first storage error "
            f"at {fmt_offset(history, first_err)} instead of retrying the save",
            evidence=capped(evidence),
        )
    if len(attempts.times) < p.min_attempts:
        return verdict(
            status="unknown",
            measured=measured,
            reason=f"only {len(attempts.times)} failed attempt(s) seen, {p.min_attempts} needed to judge the "
            "backoff (lengthen the error window)",
            evidence=capped(evidence),
        )
    for index in range(1, len(gaps)):
        capped_gap = p.cap is not None and gaps[index] >= p.cap * GROWTH_SLACK
        if not capped_gap and gaps[index] < p.growth * gaps[index - 1] * GROWTH_SLACK:
            return fail(
                reason=f"no backoff: gap {index + 1} ({fmt_seconds(gaps[index])}) is not x{p.growth:g} gap {index} "
                f"({fmt_seconds(gaps[index - 1])})",
                evidence=capped(evidence),
            )
    if committed is None:
        return fail(
            reason=f"no target.checkpoint{step_text} committed after the last failure at "
            f"{fmt_offset(history, attempts.times[-1])}: the save never succeeded",
            evidence=capped(evidence),
        )
    evidence.append(cite(history, committed, "the save succeeded"))
    return verdict(
        status="pass",
        measured=measured,
        reason=f"{len(attempts.times)} failed attempt(s){whose}{step_text} with growing gaps, then the save "
        f"succeeded {fmt_seconds(seconds(committed.ts_ns - attempts.times[-1]))} after the last failure",
        evidence=capped(evidence),
    )


def _committed_after(history: History, attempts: _Attempts, last_err: int) -> Event | None:
    """The first ``target.checkpoint`` after the last failure (of the retried step and rank when known)."""
    after = attempts.times[-1] if attempts.step is not None else max(attempts.times[-1], last_err)
    for event in events_of(history, TARGET_CHECKPOINT):
        if event.ts_ns <= after:
            continue
        if attempts.step is not None and step_of(event) != attempts.step:
            continue
        if attempts.rank is not None and event.rank is not None and event.rank != attempts.rank:
            continue
        return event
    return None


def _died(history: History, first_err: int, committed: Event | None) -> Event | None:
    """A non-zero ``target.exit`` or a restarted attempt's ``target.start`` after the first error (and before
    the committed save, when there is one)."""
    until = committed.ts_ns if committed is not None else None
    starts = [e for e in events_of(history, TARGET_START) if e.ts_ns <= first_err]
    attempt_then = max((attempt_of(e) for e in starts), default=0)
    for event in events_of(history, TARGET_EXIT) + events_of(history, TARGET_START):
        if event.ts_ns < first_err or (until is not None and event.ts_ns > until):
            continue
        if event.kind == TARGET_EXIT and (event.get_int("code") or 0) != 0:
            return event
        if event.kind == TARGET_START and attempt_of(event) > attempt_then:
            return event
    return None
