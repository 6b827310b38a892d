"""Lineage checks: is what training committed the same as a fault-free run, and was each sample used once.

- ``matches_golden``: the run's final model digest equals the golden (fault-free) run's digest.
- ``exactly_once``: along the committed lineage (what the final model state actually reflects, after
  restarts rolled back uncheckpointed steps) every sample id was trained exactly once and no step is missing.
"""

from __future__ import annotations

import json
from functools import partial
from typing import TYPE_CHECKING

from pydantic import BaseModel, JsonValue

from chaos.checks._evidence import (
    attempt_of,
    capped,
    cite,
    describe,
    events_of,
    narrow,
    step_events,
    step_of,
)
from chaos.checks.base import CheckParams, CheckResult, register_check
from chaos.history.timeline import RUNNER_GOLDEN, TARGET_CHECKPOINT, TARGET_DIGEST, TARGET_RESUME, Event, History

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


class MatchesGoldenParams(CheckParams):
    """``matches_golden`` takes no parameters; the runner records the golden digest (``runner.golden``)."""


@register_check(
    CHECK_MATCHES_GOLDEN,
    MatchesGoldenParams,
    summary="the run's final model digest equals the golden (fault-free) run's digest",
    needs_golden=True,
)
def matches_golden(history: History, params: BaseModel, scenario: Scenario) -> CheckResult:
    """Compare the final ``target.digest`` with the last ``runner.golden`` digest (full strings).

    The run's digest is taken from rank 0 (else the lowest rank present, else rank-less events), from its
    highest attempt, latest on ties. measured = its first 12 characters; bound = ``== golden <12 chars>``.
    ``unknown`` names whichever of the two digests is missing; ``fail`` when they differ.
    """
    narrow(params, MatchesGoldenParams)
    verdict = partial(CheckResult, check=CHECK_MATCHES_GOLDEN, name=CHECK_MATCHES_GOLDEN)
    digests = [e for e in events_of(history, TARGET_DIGEST) if e.get_str("digest")]
    goldens = [e for e in events_of(history, RUNNER_GOLDEN) if e.get_str("digest")]
    missing: list[str] = []
    if not digests:
        missing.append("no target.digest event with a digest: the job never reported its final model digest")
    if not goldens:
        missing.append("no runner.golden event with a digest: the golden run's digest was not recorded")
    golden = goldens[-1] if goldens else None
    golden_digest = golden.get_str("digest") if golden is not None else None
    bound = None if golden_digest is None else f"== golden {golden_digest[:SHORT_DIGEST]}"
    if missing:
        return verdict(
            status="unknown",
            bound=bound,
            reason="; ".join(missing),
            evidence=[cite(history, e) for e in (digests[-1:] + goldens[-1:])],
        )
    assert golden is not None and golden_digest is not None  # both lists are non-empty past the guard

    speaker = min((e.rank for e in digests), key=_rank_key)
    # events_of is time-ordered, so max over (attempt, position) is "highest attempt, latest ts on ties".
    final = max(
        ((attempt_of(e), index, e) for index, e in enumerate(digests) if e.rank == speaker),
        key=lambda item: (item[0], item[1]),
    )[2]
    run_digest = final.get_str("digest") or ""
    evidence = [
        cite(history, final, f"digest {run_digest[:SHORT_DIGEST]}"),
        cite(history, golden, f"golden {golden_digest[:SHORT_DIGEST]}"),
    ]
    verdict = partial(verdict, measured=run_digest[:SHORT_DIGEST], bound=bound, evidence=evidence)
    if run_digest == golden_digest:
        return verdict(status="pass", reason="final digest equals the golden digest")
    reason = f"final digest {run_digest[:SHORT_DIGEST]} ({describe(final)}) differs from golden {golden_digest[:SHORT_DIGEST]}"
    run_step, golden_step = step_of(final), step_of(golden)
    if run_step is not None and golden_step is not None and run_step != golden_step:
        # Different end steps explain a mismatch without any corruption: say so, it changes the diagnosis.
        reason += f"; the run ended at step {run_step} but the golden run at step {golden_step}"
    return verdict(status="fail", reason=reason)


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
    summary="along the committed lineage every sample id is trained exactly once and no step is skipped",
)
def exactly_once(history: History, params: BaseModel, scenario: Scenario) -> CheckResult:
    """Unique sample ids along the committed lineage (see :func:`committed_lineage`).

    ``fail`` when a sample id appears more than once across all ranks' committed steps, or a rank's
    committed steps are not contiguous from 1 (or from the step a run-initial resume started at) to its
    final step; up to 10 duplicate ids and missing steps are listed. ``unknown`` when no ``target.step``
    carries ``samples``, or (absent a failure) some committed step lacks them.
    """
    narrow(params, ExactlyOnceParams)
    verdict = partial(
        CheckResult, check=CHECK_EXACTLY_ONCE, name=CHECK_EXACTLY_ONCE, bound="each sample once", unit=" samples"
    )
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
