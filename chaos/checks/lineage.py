"""Lineage checks: is what training committed the same as a fault-free run, and was each sample used once.

- ``matches_golden``: every rank's final model digest equals the golden (fault-free) run's digest of that rank.
- ``exactly_once``: along the committed lineage (what the final model state actually reflects, after
  restarts rolled back uncheckpointed steps) every sample id was trained exactly once and no step is missing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from pydantic import JsonValue

from chaos.checks._evidence import (
    attempt_of,
    capped,
    cite,
    describe,
    events_of,
    step_events,
    step_of,
    verdict_of,
)
from chaos.checks.base import CheckParams, CheckResult, register_check
from chaos.event_kinds import RUNNER_GOLDEN, TARGET_CHECKPOINT, TARGET_DIGEST, TARGET_RESUME
from chaos.history.timeline import Event, History

if TYPE_CHECKING:
    from chaos.spec.scenario import Scenario

CHECK_MATCHES_GOLDEN = "matches_golden"
CHECK_EXACTLY_ONCE = "exactly_once"
SHORT_DIGEST = 12
MAX_LISTED = 10


def _rank_key(rank: int | None) -> tuple[int, int]:
    # Integer ranks first, lowest first; rank None (a job-level or single-process event) after them.
    return (1, 0) if rank is None else (0, rank)


# ---------------------------------------------------------------------------------------------------------
# matches_golden

RANKLESS_KEY = "none"
"""The key of rank-less digests (a job run without torchrun, no ``RANK``) in ``runner.golden``'s ``digests``."""


def rank_key(rank: int | None) -> str:
    """``rank`` as a key of ``runner.golden``'s ``digests`` map (JSON object keys are strings)."""
    return RANKLESS_KEY if rank is None else str(rank)


def _parse_rank_key(key: str) -> tuple[bool, int | None]:
    # (valid, rank): "3" -> rank 3, "none" -> rank-less; anything else is not a rank key.
    if key == RANKLESS_KEY:
        return True, None
    try:
        return True, int(key)
    except ValueError:
        return False, None


def final_digests(history: History) -> dict[int | None, Event]:
    """Each rank's final ``target.digest`` that carries a digest string: from its highest attempt, the latest
    on ties (None keys rank-less reports). Both the run and the golden run are read this way."""
    finals: dict[int | None, tuple[int, int, Event]] = {}
    # events_of is time-ordered, so (attempt, position) orders "highest attempt, latest ts on ties".
    for index, event in enumerate(events_of(history, TARGET_DIGEST)):
        if not event.get_str("digest"):
            continue
        current = finals.get(event.rank)
        if current is None or (attempt_of(event), index) >= current[:2]:
            finals[event.rank] = (attempt_of(event), index, event)
    return {rank: finals[rank][2] for rank in sorted(finals, key=_rank_key)}


def golden_rank_digests(golden: Event) -> dict[int | None, str] | None:
    """The per-rank final digests a ``runner.golden`` event carries (``digests``: rank key -> digest), or None
    when it carries none (a history recorded before the golden run kept every rank's digest)."""
    recorded = golden.data.get("digests")
    if not isinstance(recorded, dict) or not recorded:
        return None
    digests: dict[int | None, str] = {}
    for key, value in recorded.items():
        valid, rank = _parse_rank_key(key)
        if valid and isinstance(value, str) and value:
            digests[rank] = value
    return digests or None


@dataclass(frozen=True)
class GoldenComparison:
    """Every rank's final digest against the golden run's digest of the same rank.

    ``expected``: rank -> golden digest (the golden's one ``digest`` for every reporting rank when
    ``per_rank`` is False: an older history); ``differ``: ranks whose final digest is not their golden one;
    ``silent``: ranks the golden run reported that reported no final digest here although they ran (some
    event of theirs is in this run); ``unseen``: such ranks that never appear in this run; ``extra``: ranks
    that reported a digest here but not in the golden run.
    """

    golden: Event
    per_rank: bool
    finals: dict[int | None, Event]
    expected: dict[int | None, str]
    differ: list[int | None]
    silent: list[int | None]
    unseen: list[int | None]
    extra: list[int | None]

    @property
    def all_equal(self) -> bool:
        """Every rank of the golden run reported a final digest here and each equals its golden digest."""
        return bool(self.finals) and not (self.differ or self.silent or self.unseen or self.extra)


def compare_with_golden(history: History) -> GoldenComparison | None:
    """Compare every rank's final digest (:func:`final_digests`) with the last ``runner.golden`` event's digest
    of the same rank (:func:`golden_rank_digests`); None when there is no ``runner.golden`` with a digest."""
    goldens = [e for e in events_of(history, RUNNER_GOLDEN) if e.get_str("digest")]
    if not goldens:
        return None
    golden = goldens[-1]
    finals = final_digests(history)
    per_rank = golden_rank_digests(golden)
    expected = per_rank if per_rank is not None else dict.fromkeys(finals, golden.get_str("digest") or "")
    seen = {e.rank for e in history.events if e.source == "target"}
    missing = sorted((r for r in expected if r not in finals), key=_rank_key)
    return GoldenComparison(
        golden=golden,
        per_rank=per_rank is not None,
        finals=finals,
        expected=expected,
        differ=[r for r, e in finals.items() if r in expected and e.get_str("digest") != expected[r]],
        silent=[r for r in missing if r in seen],
        unseen=[r for r in missing if r not in seen],
        extra=[r for r in finals if r not in expected],
    )


def _who(rank: int | None) -> str:
    return "the rank-less job" if rank is None else f"rank {rank}"


def _ranks(ranks: list[int | None]) -> str:
    listed = ", ".join(RANKLESS_KEY if r is None else str(r) for r in ranks[:MAX_LISTED])
    return listed + (f" (+{len(ranks) - MAX_LISTED} more)" if len(ranks) > MAX_LISTED else "")


class MatchesGoldenParams(CheckParams):
    """``matches_golden`` takes no parameters; the runner records the golden digests (``runner.golden``)."""


@register_check(
    CHECK_MATCHES_GOLDEN,
    MatchesGoldenParams,
    to_add=(
        "add agent = chaos.agent.attach(model, optimizer) (it reports the digest at exit), or emit target.digest "
        "at the end"
    ),
    needs_golden=True,
)
def matches_golden(history: History, p: MatchesGoldenParams, scenario: Scenario) -> CheckResult:
    """every rank's final model digest equals the golden (fault-free) run's digest of that rank

    Compare every rank's final ``target.digest`` with the golden run's digest of the same rank (full strings).

    A rank's final digest is its highest attempt's, latest on ties; the golden digests are the last
    ``runner.golden`` event's ``digests`` (rank key -> digest). A history whose ``runner.golden`` carries
    only ``digest`` (recorded before per-rank digests) compares every rank with that one digest, and says so.
    ``fail`` names every rank whose digest differs, and every rank the golden run reported that ran here
    (some event of its own is in the history) but reported no final digest: the job did not finish on it.
    ``unknown`` when either side is missing altogether, or (absent a failure) a golden rank never appears
    here or a rank reports a digest the golden run had no rank for: nothing to compare.
    measured = the judged rank's digest, first 12 characters (the first differing rank on a failure, else
    the lowest rank); bound = ``== golden <12 chars>`` of that rank.
    """
    verdict = verdict_of(CHECK_MATCHES_GOLDEN)
    digests = [e for e in events_of(history, TARGET_DIGEST) if e.get_str("digest")]
    comparison = compare_with_golden(history)
    missing: list[str] = []
    if not digests:
        missing.append("no target.digest event with a digest: the job never reported its final model digest")
    if comparison is None:
        missing.append("no runner.golden event with a digest: the golden run's digest was not recorded")
    golden_digest = None if comparison is None else comparison.golden.get_str("digest")
    bound = None if golden_digest is None else f"== golden {golden_digest[:SHORT_DIGEST]}"
    if missing:
        golden_events = [] if comparison is None else [comparison.golden]
        return verdict(
            status="unknown",
            bound=bound,
            reason="; ".join(missing),
            evidence=[cite(history, e) for e in (digests[-1:] + golden_events)],
        )
    assert comparison is not None and golden_digest is not None  # both sides are present past the guard

    golden, finals, expected = comparison.golden, comparison.finals, comparison.expected
    evidence: list[str] = []
    if not comparison.per_rank:
        evidence.append(
            "the golden run recorded one digest, not one per rank (an older history): every rank is compared "
            f"with it ({golden_digest[:SHORT_DIGEST]})"
        )
    for rank, event in finals.items():
        run_digest = event.get_str("digest") or ""
        want = expected.get(rank)
        note = f"digest {run_digest[:SHORT_DIGEST]}" + (
            "; no golden digest for this rank" if want is None else f"; golden {want[:SHORT_DIGEST]}"
        )
        evidence.append(cite(history, event, note))
    evidence.append(cite(history, golden, f"golden {golden_digest[:SHORT_DIGEST]}"))

    judged = comparison.differ[0] if comparison.differ else next(iter(finals))
    judged_digest = finals[judged].get_str("digest") or ""
    judged_golden = expected.get(judged, golden_digest)
    verdict = partial(
        verdict,
        measured=judged_digest[:SHORT_DIGEST],
        bound=f"== golden {judged_golden[:SHORT_DIGEST]}",
        evidence=capped(evidence),
    )
    failures: list[str] = []
    for rank in comparison.differ[:MAX_LISTED]:
        final, want = finals[rank], expected[rank]
        got = final.get_str("digest") or ""
        line = (
            f"{_who(rank)} differs from golden {want[:SHORT_DIGEST]}: "
            f"final digest {got[:SHORT_DIGEST]} ({describe(final)})"
        )
        run_step, golden_step = step_of(final), step_of(golden)
        if run_step is not None and golden_step is not None and run_step != golden_step:
            # Different end steps explain a mismatch without any corruption: say so, it changes the diagnosis.
            line += f"; the run ended at step {run_step} but the golden run at step {golden_step}"
        failures.append(line)
    if len(comparison.differ) > MAX_LISTED:
        failures.append(f"rank(s) {_ranks(comparison.differ[MAX_LISTED:])} differ from golden too")
    if comparison.silent:
        failures.append(
            f"rank(s) {_ranks(comparison.silent)} ran but reported no final digest, which the golden run did: "
            "the job did not finish on them"
        )
    unknowns: list[str] = []
    if comparison.unseen:
        unknowns.append(
            f"rank(s) {_ranks(comparison.unseen)} of the golden run never appear in this run: nothing to compare"
        )
    if comparison.extra:
        unknowns.append(f"rank(s) {_ranks(comparison.extra)} reported a digest but the golden run had none for them")
    if failures:
        return verdict(status="fail", reason="; ".join(failures + unknowns))
    if unknowns:
        return verdict(status="unknown", reason="; ".join(unknowns))
    return verdict(
        status="pass", reason=f"every rank's final digest equals the golden digest (rank(s) {_ranks(list(finals))})"
    )


# ---------------------------------------------------------------------------------------------------------
# exactly_once


class ExactlyOnceParams(CheckParams):
    """``exactly_once`` takes no parameters; it reads ``samples`` from ``target.step`` events."""


def _sample_key(value: JsonValue) -> int | str:
    # Sample ids are ints by contract; strings are accepted as ids too, anything else is keyed by its JSON.
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True)


def _id_order(key: int | str) -> tuple[int, int, str]:
    # Numeric ids in numeric order (9 before 10), string ids after them.
    return (1, 0, key) if isinstance(key, str) else (0, key, "")


class Lineage:
    """One rank's committed lineage (see :func:`committed_lineage`).

    ``kept``: step -> the report of it that the final model state reflects; ``floor``: steps <= floor came
    from a checkpoint older than this run (a run-initial resume), so they are not expected here; ``notes``:
    evidence lines about how the lineage was traced.
    """

    def __init__(self) -> None:
        self.kept: dict[int, Event] = {}
        self.floor = 0
        self.notes: list[str] = []


class _Resumes:
    """Where each attempt resumed from, and which earlier attempt wrote each checkpoint step."""

    def __init__(self, history: History) -> None:
        self.by_rank: dict[tuple[int | None, int], int] = {}
        self.by_attempt: dict[int, tuple[tuple[int, int], int]] = {}
        for event in events_of(history, TARGET_RESUME):  # time order: a later duplicate overrides
            step = step_of(event)
            if step is None:
                continue
            attempt = attempt_of(event)
            self.by_rank[(event.rank, attempt)] = step
            current = self.by_attempt.get(attempt)
            if current is None or _rank_key(event.rank) <= current[0]:
                self.by_attempt[attempt] = (_rank_key(event.rank), step)
        self.checkpoints = [e for e in events_of(history, TARGET_CHECKPOINT) if step_of(e) is not None]

    def step(self, rank: int | None, attempt: int) -> int | None:
        """The rank's own resume step for ``attempt``, else the lowest rank's (rank 0 usually speaks for all)."""
        own = self.by_rank.get((rank, attempt))
        if own is not None:
            return own
        shared = self.by_attempt.get(attempt)
        return None if shared is None else shared[1]

    def attempts(self, rank: int | None) -> set[int]:
        """Attempts with a resume that applies to ``rank``."""
        return {a for (r, a) in self.by_rank if r == rank} | set(self.by_attempt)

    def writer(self, step: int, before: int) -> int | None:
        """The attempt (< ``before``) whose latest ``target.checkpoint`` at ``step`` a resume would load."""
        found = [attempt_of(e) for e in self.checkpoints if step_of(e) == step and attempt_of(e) < before]
        return found[-1] if found else None


def committed_lineage(history: History, steps: list[Event]) -> dict[int | None, Lineage]:
    """The committed lineage of every rank that reported steps, traced backwards from the final attempt.

    ``steps`` are the history's :func:`~chaos.checks._evidence.step_events`; the result maps each rank (None
    for rank-less reports) to its :class:`Lineage`. ``exactly_once`` judges it and the goodput analysis
    (:func:`chaos.analysis.ettr.goodput`) counts its steps as productive.

    The final attempt (the highest with steps or a resume) contributes its steps in (R, its last step], R
    being its resume step. Steps <= R come from the attempt that wrote checkpoint R: the latest earlier
    attempt with a ``target.checkpoint`` at R, else the latest earlier attempt that reported step R, else
    the latest earlier attempt with any step (so a bogus R shows up as missing steps). That attempt
    contributes (its own R, R], and so on back to step 0. Steps an attempt ran past the checkpoint that
    was later resumed from are rolled back, so a restart claiming to resume at R but starting at R + 2 shows
    a missing R + 1 rather than being papered over by the older attempt's R + 1. Without a ``target.resume``
    an attempt is taken to resume just before its first step (0 for the first attempt); within an attempt the
    latest report of a step wins. A run-initial resume from R with no earlier steps starts the lineage at R.
    """
    resumes = _Resumes(history)
    lineages: dict[int | None, Lineage] = {}
    for rank in sorted({e.rank for e in steps}, key=_rank_key):
        by_attempt: dict[int, dict[int, Event]] = {}
        for event in steps:
            if event.rank == rank:  # time-ordered, so the latest report of a step wins
                by_attempt.setdefault(attempt_of(event), {})[step_of(event) or 0] = event
        lineage = lineages[rank] = Lineage()
        current = max(set(by_attempt) | resumes.attempts(rank))
        # The final attempt's last step ends the lineage; one that resumed and died before stepping ends it
        # at its resume step.
        last = by_attempt.get(current)
        upper = max(last) if last else (resumes.step(rank, current) or 0)
        while True:
            own = by_attempt.get(current, {})
            earlier = sorted(a for a in by_attempt if a < current)
            resumed_at = resumes.step(rank, current)
            if resumed_at is None:
                resumed_at = min(own) - 1 if own and earlier else 0
            lineage.kept.update({s: e for s, e in own.items() if resumed_at < s <= upper})
            if resumed_at <= 0:
                break
            writer = resumes.writer(resumed_at, current)
            if writer is None or writer not in by_attempt:
                holders = [a for a in earlier if resumed_at in by_attempt[a]]
                writer = holders[-1] if holders else (earlier[-1] if earlier else None)
            if writer is None:
                lineage.floor = resumed_at
                lineage.notes.append(
                    f"rank {rank} attempt {current} resumed from step {resumed_at} with no earlier steps "
                    "recorded: lineage starts there"
                )
                break
            current, upper = writer, min(resumed_at, upper)
    return lineages


@register_check(
    CHECK_EXACTLY_ONCE,
    ExactlyOnceParams,
    to_add=(
        "pass the loader to the agent: attach(model, optimizer, ddp=ddp, data=loader) (or agent.track(sampler)), "
        "or emit target.step with samples"
    ),
)
def exactly_once(history: History, p: ExactlyOnceParams, scenario: Scenario) -> CheckResult:
    """along the committed lineage every sample id is trained exactly once and no step is skipped

    Unique sample ids along the committed lineage (see :func:`committed_lineage`).

    ``fail`` when a sample id appears more than once across all ranks' committed steps, or a rank's
    committed steps are not contiguous from 1 (or from the step a run-initial resume started at) to its
    final step; up to 10 duplicate ids and missing steps are listed. ``unknown`` when no ``target.step``
    carries ``samples``, or (absent a failure) some committed step lacks them.
    """
    verdict = verdict_of(CHECK_EXACTLY_ONCE, bound="each sample once", unit=" samples")
    steps = step_events(history)
    if not any(isinstance(e.data.get("samples"), list) for e in steps):
        return verdict(
            status="unknown",
            reason="no target.step event carries a samples list: the job does not report which samples it used",
        )

    lineages = committed_lineage(history, steps)
    seen: dict[int | str, list[Event]] = {}
    unreported: list[Event] = []
    missing: list[str] = []
    evidence: list[str] = []
    for rank, lineage in lineages.items():
        evidence.extend(lineage.notes)
        if not lineage.kept:
            continue
        final = max(lineage.kept)
        gaps = [s for s in range(lineage.floor + 1, final + 1) if s not in lineage.kept]
        if gaps:
            missing.append(
                f"rank {rank} missing step(s) {', '.join(map(str, gaps[:MAX_LISTED]))}"
                + (f" (+{len(gaps) - MAX_LISTED} more)" if len(gaps) > MAX_LISTED else "")
            )
        evidence.append(
            f"rank {rank}: committed steps {lineage.floor + 1}..{final} "
            f"from attempt(s) {sorted({attempt_of(e) for e in lineage.kept.values()})}"
        )
        for step in sorted(lineage.kept):
            event = lineage.kept[step]
            samples = event.data.get("samples")
            if not isinstance(samples, list):
                unreported.append(event)
                continue
            for sample in samples:
                seen.setdefault(_sample_key(sample), []).append(event)

    duplicates = sorted((k for k, v in seen.items() if len(v) > 1), key=_id_order)
    # Duplicates lead the evidence: with many ranks the per-rank lines would otherwise push them past the cap.
    evidence[:0] = [
        f"sample {key} used {len(seen[key])} times: {'; '.join(describe(e) for e in seen[key])}"
        for key in duplicates[:MAX_LISTED]
    ]
    verdict = partial(verdict, measured=float(len(seen)))
    if duplicates or missing:
        problems: list[str] = []
        if duplicates:
            listed = ", ".join(str(k) for k in duplicates[:MAX_LISTED])
            more = f" (+{len(duplicates) - MAX_LISTED} more)" if len(duplicates) > MAX_LISTED else ""
            problems.append(f"{len(duplicates)} sample id(s) trained more than once: {listed}{more}")
        problems.extend(missing)
        return verdict(status="fail", reason="; ".join(problems), evidence=capped(evidence))
    if unreported:
        return verdict(
            status="unknown",
            evidence=capped([cite(history, e, "no samples") for e in unreported] + evidence),
            reason=f"{len(unreported)} committed step(s) carry no samples list, so exactly-once cannot be verified",
        )
    return verdict(
        status="pass",
        evidence=capped(evidence),
        reason=f"{len(seen)} sample id(s), each trained exactly once along the committed lineage",
    )
