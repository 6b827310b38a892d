"""Checks for silent data corruption: was it caught, by whom, and did it reach the model?

- ``sdc_detected``: a detection (``detect.sdc`` by default) follows each firing of the fault within N steps,
  and names the right culprit rank; a firing whose effect was masked (no detection, and every rank ended
  equal to the golden run) is reported as masked, not missed.
- ``step_blocked``: the corruption never reached the optimizer: every rank's final digest equals the golden
  run's although the fault fired (a retried in-transit fault costs one retry, not a corrupted model).
- ``no_false_positives``: no detection in the golden (fault-free) run, nor before the first fault.
"""

from __future__ import annotations

import fnmatch
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from chaos.checks._evidence import (
    applied_ops,
    capped,
    cite,
    events_of,
    label,
    missing_fault_reason,
    step_of,
    verdict_of,
)
from chaos.checks.base import CheckParams, CheckResult, register_check
from chaos.checks.lineage import MatchesGoldenParams, compare_with_golden, matches_golden
from chaos.event_kinds import DETECT_SDC, FAULT_APPLIED, RUNNER_GOLDEN
from chaos.history.timeline import Event, History

if TYPE_CHECKING:
    from chaos.spec.scenario import Scenario

CHECK_SDC_DETECTED = "sdc_detected"
CHECK_STEP_BLOCKED = "step_blocked"
CHECK_NO_FALSE_POSITIVES = "no_false_positives"


class SdcDetectedParams(CheckParams):
    """Which fault, how many steps late a detection may come, which events count, whether to check the culprit,
    and the verdict for firings whose effect was masked."""

    fault: str
    within_steps: int = Field(default=0, ge=0, description="0: detected in the injected step itself")
    event: str = Field(default=DETECT_SDC, description="glob of detection events that count")
    culprit: bool = Field(default=True, description="the detection must name the corrupted rank")
    if_masked: Literal["unknown", "pass", "fail"] = Field(
        default="unknown",
        description=(
            "verdict when the only problems are masked firings (no detection, and every rank ended equal to "
            "the golden run): unknown (nothing proves the guard catches an effective corruption), fail (the "
            "scenario requires that the fault took effect), pass (masked faults are acceptable)"
        ),
    )


def _culprit(event: Event) -> int | None:
    """The rank a detection blames: ``culprit_rank`` when the detector localizes (the key is there), None when
    that localization named nobody (ambiguous, unexplained); a detector without localization (no key, e.g.
    the anomaly guard, which reports on the rank it judged) blames the event's rank. An unlocalized checksum
    detection must not borrow the rank that happened to report it: it would pass on the faulted rank."""
    if "culprit_rank" in event.data:
        return event.get_int("culprit_rank")
    return event.rank


def _blame_problem(window: list[Event], rank: int | None, step: int) -> str | None:
    """Why the detections of one firing (``window``) do not name ``rank``, or None when they do: some must
    blame it, and none of those that localize (carry ``culprit_rank``) may name nobody or another rank."""
    blamed = [_culprit(d) for d in window]
    localized = [b for d, b in zip(window, blamed, strict=True) if "culprit_rank" in d.data]
    if rank in blamed and all(b == rank for b in localized):
        return None
    named = sorted({"nobody" if b is None else f"rank {b}" for b in blamed})
    return f"detections at step {step} name {', '.join(named)}, not rank {rank}"


def _masking(history: History) -> tuple[bool, str]:
    """Whether the run's final state shows every fault's effect was masked: the last ``runner.golden``
    carries per-rank digests and every rank's final digest equals its golden one. The text says why, or why
    not (evidence for a miss: without golden data a masked fault cannot be told from a missed one)."""
    comparison = compare_with_golden(history)
    if comparison is None:
        return False, "no runner.golden: a masked firing cannot be told from a missed one"
    if not comparison.per_rank:
        return False, "runner.golden carries no per-rank digests: a masked firing cannot be told from a missed one"
    if not comparison.all_equal:
        return False, (
            "some rank's final model differs from the golden run's (or reported none), so a firing without "
            "detection cannot be shown masked"
        )
    ranks = ", ".join("none" if r is None else str(r) for r in comparison.finals)
    return True, f"every rank's final digest equals the golden run's (rank(s) {ranks})"


@register_check(CHECK_SDC_DETECTED, SdcDetectedParams, needs_golden=True)
def sdc_detected(history: History, p: SdcDetectedParams, scenario: Scenario) -> CheckResult:
    """each firing of an SDC fault is detected within N steps, naming the corrupted rank; masked ones said so

    measured = worst steps from injection to detection; fail on a miss, a late detection or a wrong culprit.

    A firing with no detection is *masked*, not missed, when no ``event`` detection follows it at all (before
    the fault's next firing; a late one is a late detection) and every rank's final digest equals the golden
    run's digest of that rank (``runner.golden``'s ``digests``): the corruption never changed what training
    ended with (e.g. a flip in an element the model never reads), so no guard could have seen it. That needs
    the golden run (hence ``needs_golden``); without per-rank golden digests a firing without detection stays
    a miss. When masked firings are the only problems the verdict is ``if_masked`` (``unknown`` by default),
    the reason says "masked", and measured is "masked" when no firing was detected at all.
    """
    verdict = verdict_of(CHECK_SDC_DETECTED, p.fault, bound=f"<= {p.within_steps} steps", unit=" steps")
    ops = applied_ops(history, p.fault)
    if not ops:
        return verdict(status="unknown", reason=missing_fault_reason(history, p.fault))
    detections = events_of(history, p.event)
    steps = [step_of(op) for op in ops]
    worst = 0
    detected = 0
    evidence: list[str] = []
    problems: dict[int, str] = {}  # by firing, so reasons keep the firings' order
    undetected: dict[int, str] = {}  # firings with no detection after them at all: a miss, unless masked
    for index, (op, injected_step) in enumerate(zip(ops, steps, strict=True)):
        if injected_step is None:
            return verdict(status="unknown", reason=f"{cite(history, op)} carries no step: not an in-job fault?")
        evidence.append(cite(history, op))
        window = [
            d
            for d in detections
            if d.ts_ns >= op.ts_ns
            and (s := step_of(d)) is not None
            and injected_step <= s <= injected_step + p.within_steps
        ]
        if not window:
            miss = f"no {p.event} within {p.within_steps} step(s) of step {injected_step} (rank {op.rank})"
            # A detection after the window but before the fault's next firing saw this one late: not masked.
            until = min((s for s in steps[index + 1 :] if s is not None and s > injected_step), default=None)
            late = any(
                d.ts_ns >= op.ts_ns
                and ((s := step_of(d)) is None or (injected_step <= s and (until is None or s < until)))
                for d in detections
            )
            (problems if late else undetected)[index] = miss
            continue
        detected += 1
        first = window[0]
        worst = max(worst, (step_of(first) or injected_step) - injected_step)
        evidence.append(cite(history, first, f"culprit {_culprit(first)}"))
        if p.culprit and (problem := _blame_problem(window, op.rank, injected_step)) is not None:
            problems[index] = problem
    masked: list[str] = []
    if undetected:
        is_masked, why = _masking(history)
        evidence.append(why)
        if is_masked:
            masked = [f"step {steps[i]} (rank {ops[i].rank})" for i in sorted(undetected)]
        else:
            problems.update(undetected)
    if problems:
        # A real miss outweighs any masked firing; name those too so the reader does not chase them.
        also = f"; masked (no effect on the final model): {', '.join(masked)}" if masked else ""
        return verdict(
            status="fail",
            measured=float(worst),
            reason="; ".join(problems[i] for i in sorted(problems)) + also,
            evidence=capped(evidence),
        )
    if masked:
        what = (
            f"{len(masked)} of {len(ops)} firing(s) masked: no {p.event}, and every rank's final model equals the "
            f"golden run's, so the corruption had no effect ({', '.join(masked)})"
        )
        if detected:
            what += f"; the other {detected} detected" + (", culprit named" if p.culprit else "")
        consequence = {
            "unknown": "nothing shows the guard would catch an effective corruption",
            "fail": "the scenario requires that the fault took effect (if_masked: fail)",
            "pass": "masked faults are accepted (if_masked: pass)",
        }[p.if_masked]
        return verdict(
            status=p.if_masked,
            # Nothing was detected, so there is no latency to measure: say what happened instead.
            measured=float(worst) if detected else "masked",
            unit=" steps" if detected else "",
            reason=f"{what}: {consequence}",
            evidence=capped(evidence),
        )
    return verdict(
        status="pass",
        measured=float(worst),
        reason=f"all {len(ops)} firing(s) detected" + (", culprit named" if p.culprit else ""),
        evidence=capped(evidence),
    )


class StepBlockedParams(CheckParams):
    """The fault whose corrupted gradient must never reach the optimizer."""

    fault: str


@register_check(CHECK_STEP_BLOCKED, StepBlockedParams, needs_golden=True)
def step_blocked(history: History, p: StepBlockedParams, scenario: Scenario) -> CheckResult:
    """the corruption never reached the optimizer: final digest == golden although the fault fired

    ``matches_golden``'s verdict, measure and bound, judged only once the fault fired: ``unknown`` when it
    never applied (a clean final model proves nothing then), else pass/fail/unknown as ``matches_golden``,
    which compares every rank with the golden run; a failure's reason names the ranks that differ.
    Evidence adds the first applied op and every detection that took an action (``data.action`` set, e.g. a retry)."""
    verdict = verdict_of(CHECK_STEP_BLOCKED, p.fault)
    ops = applied_ops(history, p.fault)
    if not ops:
        return verdict(status="unknown", reason=missing_fault_reason(history, p.fault))
    golden = matches_golden(history, MatchesGoldenParams(), scenario)
    reason = golden.reason
    if golden.status == "pass":
        reason = f"fault fired {len(ops)} time(s) and every rank's final model equals the golden model"
    elif golden.status == "fail":
        reason = "a corrupted update reached the model: " + golden.reason
    retries = [cite(history, e) for e in events_of(history, "detect.*") if e.data.get("action")]
    return golden.model_copy(
        update={
            "check": CHECK_STEP_BLOCKED,
            "name": label(CHECK_STEP_BLOCKED, p.fault),
            "reason": reason,
            "evidence": capped([cite(history, ops[0]), *retries, *golden.evidence]),
        }
    )


class NoFalsePositivesParams(CheckParams):
    """Which detection events count as alarms (default: every ``detect.*``)."""

    event: str = "detect.sdc*"


@register_check(
    CHECK_NO_FALSE_POSITIVES,
    NoFalsePositivesParams,
    to_add=(
        "let the golden run happen (a scenario whose checks need it runs it; see runner.golden in the history for"
        " why it failed)"
    ),
    needs_golden=True,
)
def no_false_positives(history: History, p: NoFalsePositivesParams, scenario: Scenario) -> CheckResult:
    """no detection fired in the golden run, nor in this run before the first fault

    measured = alarms without a fault: detections matching ``event`` recorded by the golden run
    (``runner.golden``'s ``detections``) plus those of this run before its first ``fault.applied`` (all of
    them when none applied); ``fail`` when any, ``unknown`` when the golden run's detections were not recorded."""
    verdict = verdict_of(CHECK_NO_FALSE_POSITIVES, bound="== 0")
    goldens = events_of(history, RUNNER_GOLDEN)
    if not goldens or not isinstance(goldens[-1].data.get("detections"), list):
        return verdict(status="unknown", reason="the golden run's detections were not recorded (no runner.golden)")
    recorded = goldens[-1].data["detections"]
    kinds = [str(kind) for kind in recorded] if isinstance(recorded, list) else []
    golden_alarms = [kind for kind in kinds if fnmatch.fnmatchcase(kind, p.event)]
    first_fault = next(iter(events_of(history, FAULT_APPLIED)), None)
    early = [d for d in events_of(history, p.event) if first_fault is None or d.ts_ns < first_fault.ts_ns]
    count = len(golden_alarms) + len(early)
    evidence = [f"golden run: {kind}" for kind in golden_alarms] + [cite(history, d, "before any fault") for d in early]
    if count:
        return verdict(
            status="fail", measured=float(count), reason=f"{count} alarm(s) without a fault", evidence=capped(evidence)
        )
    return verdict(status="pass", measured=0.0, reason="no alarm without a fault")
