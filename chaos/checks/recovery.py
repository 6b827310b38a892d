"""Recovery checks: does training make progress again after a fault, how much work is redone, does it finish.

- ``recovered_within``: time from each applied op of a fault to the first step beyond the highest step
  reached before it.
- ``lost_work_at_most``: steps recomputed because a restarted attempt resumed from an older checkpoint.
- ``completes``: the job ended by itself (not stopped by the harness) with exit code 0.
"""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING

from pydantic import Field

from chaos.checks._evidence import (
    attempt_of,
    capped,
    cite,
    describe,
    events_of,
    fmt_offset,
    fmt_seconds,
    seconds,
    step_events,
    step_of,
    verdict_of,
)
from chaos.checks.base import CheckParams, CheckResult, Status, register_check
from chaos.checks.latency import FaultBound, fault_latencies
from chaos.event_kinds import FAULT_APPLIED, RUNNER_STOP, TARGET_EXIT, TARGET_RESTART, TARGET_RESUME, TARGET_START
from chaos.history.timeline import Event, History

if TYPE_CHECKING:
    from chaos.spec.scenario import Scenario

CHECK_RECOVERED_WITHIN = "recovered_within"
CHECK_LOST_WORK = "lost_work_at_most"
CHECK_COMPLETES = "completes"


# ---------------------------------------------------------------------------------------------------------
# recovered_within


class RecoveredWithinParams(FaultBound):
    """Parameters of ``recovered_within``: ``within`` bounds the time from each fault.applied to the first step
    beyond the pre-fault high-water mark."""


@register_check(CHECK_RECOVERED_WITHIN, RecoveredWithinParams)
def recovered_within(history: History, p: RecoveredWithinParams, scenario: Scenario) -> CheckResult:
    """after each applied op of a fault, training passes its pre-fault highest step within a time bound

    Worst time to progress, in seconds, over the fault's applied ops.

    For an op applied at T: S = highest ``target.step`` step (any rank) at or before T, or the op's own ``step``
    when it names a later one (a fault fired inside step N by the job's agent, ``trigger.phase``: the step it
    hit is N, and a peer finishing step N after it is not recovery); the op is recovered at the first
    ``target.step`` after T with step > S, so merely replaying steps from an older checkpoint does not count. Evidence also gives the time to the first step of a newer attempt (a restart), if any.
    ``fail`` when some op is never followed by progress past S or the worst time exceeds ``within``;
    ``unknown`` when the fault never applied, or an op came before any step (no S to pass).
    """
    found = fault_latencies(history, CHECK_RECOVERED_WITHIN, p.fault, p.within)
    steps = step_events(history)
    stuck: list[tuple[Event, int]] = []
    no_baseline: list[Event] = []
    for op in found.ops:
        before = [e for e in steps if e.ts_ns <= op.ts_ns]
        if not before:
            no_baseline.append(op)
            found.evidence.append(cite(history, op, "no target.step at or before it"))
            continue
        high = max(before, key=lambda e: (step_of(e) or 0, e.ts_ns))
        high_step = step_of(high) or 0
        attempt_then = max(attempt_of(e) for e in before)
        after = [e for e in steps if e.ts_ns > op.ts_ns]
        hit = op.get_int("step")
        if hit is not None and hit > high_step:  # fired inside step `hit`: that step must be passed
            high_step = hit
            found.evidence.append(cite(history, op, f"it hit step {hit} while that step ran"))
        else:
            found.evidence.append(cite(history, op, f"highest step before it: {high_step}"))
        restarted = next((e for e in after if attempt_of(e) > attempt_then), None)
        if restarted is not None:
            # Why a separate line: "time to first step after restart" separates restart cost from the
            # recomputation that follows, which is what a slow recovery usually needs explained.
            since = fmt_seconds(seconds(restarted.ts_ns - op.ts_ns))
            found.evidence.append(cite(history, restarted, f"first step after restart, {since} after the fault"))
        progressed = next((e for e in after if (step_of(e) or 0) > high_step), None)
        if progressed is None:
            stuck.append((op, high_step))
            found.evidence.append(f"no target.step beyond step {high_step} after {describe(op)}")
            continue
        latency = seconds(progressed.ts_ns - op.ts_ns)
        found.evidence.append(cite(history, progressed, f"recovered {fmt_seconds(latency)} after the fault"))
        found.add(latency, op)

    if stuck:
        op, high_step = stuck[0]
        found.missed = (
            f"{len(stuck)} of {len(found.ops)} op(s) of {p.fault!r} never recovered: no step beyond {high_step} "
            f"after {describe(op)} at {fmt_offset(history, op.ts_ns)}"
        )
    if no_baseline:
        op = no_baseline[0]
        found.undecided = (
            f"{describe(op)} was applied at {fmt_offset(history, op.ts_ns)} before any target.step, "
            "so there is no pre-fault step to progress past"
        )
    return found.judge(
        too_slow=lambda latency, op: f"recovery from {describe(op)} took {fmt_seconds(latency)}",
        passed=f"all {len(found.ops)} op(s) of {p.fault!r} recovered",
        worst_op=describe,
    )


# ---------------------------------------------------------------------------------------------------------
# lost_work_at_most


class LostWorkParams(CheckParams):
    """Parameters of ``lost_work_at_most``."""

    steps: int = Field(
        ge=0, description="most steps any restart may recompute (highest step reached before it minus resume step)"
    )


def _lowest_rank_first(event: Event) -> tuple[int, int, int]:
    # Rank 0 (or the lowest rank present) speaks for an attempt; rank None (a job-level event) comes last.
    return (1, 0, event.ts_ns) if event.rank is None else (0, event.rank, event.ts_ns)


@register_check(CHECK_LOST_WORK, LostWorkParams)
def lost_work_at_most(history: History, p: LostWorkParams, scenario: Scenario) -> CheckResult:
    """every restart resumes close enough to where training had got that it recomputes at most N steps

    Most steps recomputed by any restart.

    Restarts are the attempts newer than the first one seen on ``target.start``/``step``/``resume``/
    ``restart`` events. For restarted attempt A resuming from step R (its rank-0, else lowest-rank,
    ``target.resume``): recomputed = max(0, highest step reached in attempts < A - R). An attempt without a
    ``target.resume`` but with steps is taken to resume from (its first step - 1), so a silent restart from
    scratch still counts, and so is one whose first step lies at or below its claimed R (the steps it ran
    outrank the claim); one with neither recomputed nothing itself and is skipped.
    ``pass`` with 0 when faults fired but nothing restarted; ``unknown`` when no fault was applied at all
    (nothing could lose work) or no step was recorded.
    """
    verdict = verdict_of(CHECK_LOST_WORK, bound=f"<= {p.steps} steps", unit=" steps")
    applied = events_of(history, FAULT_APPLIED)
    if not applied:
        return verdict(status="unknown", reason="no fault.applied event: no fault fired, so no work could be lost")
    steps = step_events(history)
    if not steps:
        return verdict(status="unknown", reason="no target.step event with a step number: progress was not recorded")

    resumes = [e for e in events_of(history, TARGET_RESUME) if step_of(e) is not None]
    lifecycle = [*steps, *resumes, *events_of(history, TARGET_START), *events_of(history, TARGET_RESTART)]
    first_attempt = min(attempt_of(e) for e in lifecycle)
    restarted = sorted({attempt_of(e) for e in lifecycle} - {first_attempt})
    if not restarted:
        return verdict(
            status="pass",
            measured=0.0,
            reason="no restart: nothing recomputed",
            evidence=[f"{len(applied)} fault op(s) applied, all {len(steps)} steps in attempt {first_attempt}"],
        )

    evidence: list[str] = []
    worst: tuple[int, int] | None = None  # (recomputed, attempt)
    for attempt in restarted:
        earlier = [step_of(e) or 0 for e in steps if attempt_of(e) < attempt]
        reached = max(earlier, default=0)
        own = sorted((e for e in resumes if attempt_of(e) == attempt), key=_lowest_rank_first)
        mine = [step_of(e) or 0 for e in steps if attempt_of(e) == attempt]
        if own:
            resumed_at = step_of(own[0]) or 0
            source = cite(history, own[0])
            if mine and min(mine) - 1 < resumed_at:
                # The steps it ran outrank its claim: an attempt that says "resumed at 20" but trains step 3
                # recomputed from step 3, whatever checkpoint it named.
                resumed_at = min(mine) - 1
                source += f"; but its first step is {min(mine)}, so it resumed from {resumed_at}"
        else:
            if not mine:
                evidence.append(f"attempt {attempt}: no target.resume and no steps, nothing recomputed in it")
                continue
            resumed_at = min(mine) - 1
            source = (
                f"attempt {attempt} has no target.resume; its first step {min(mine)} implies resume from {resumed_at}"
            )
        recomputed = max(0, reached - resumed_at)
        evidence.append(f"{source}; highest earlier step {reached}, recomputed {recomputed}")
        if worst is None or recomputed > worst[0]:
            worst = (recomputed, attempt)

    if worst is None:
        return verdict(
            status="pass",
            measured=0.0,
            evidence=capped(evidence),
            reason="restarted attempts neither resumed nor stepped: nothing recomputed",
        )
    recomputed, attempt = worst
    status: Status = "pass" if recomputed <= p.steps else "fail"
    return verdict(
        status=status,
        measured=float(recomputed),
        evidence=capped(evidence),
        reason=(
            f"worst restart (attempt {attempt}) recomputed {recomputed} step(s)"
            + ("" if status == "pass" else f", over the bound of {p.steps}")
        ),
    )


# ---------------------------------------------------------------------------------------------------------
# completes


class CompletesParams(CheckParams):
    """``completes`` takes no parameters."""


@register_check(
    CHECK_COMPLETES,
    CompletesParams,
    to_add="let the job end by itself within safety.max_duration (the target records its exit code)",
)
def completes(history: History, p: CompletesParams, scenario: Scenario) -> CheckResult:
    """the job ended by itself with code 0 (not stopped by the harness at a limit)

    Whether the job finished on its own, judged on the last ``target.exit``.

    ``pass`` when its code is 0 and the harness did not stop the job. ``fail`` when the harness stopped it
    (a ``runner.stop`` before that exit: the run hit max_duration, no progress, an abort or an interrupt; the
    reason names which, and ``measured`` is empty because the code is the harness's signal, not the job's
    verdict), or when the job's own code is not 0 (``measured`` is the code; the reason tells a job killed
    by a fault's signal, or that died of some other signal, or that failed after faults were applied, from
    one that failed with no fault in play). ``unknown`` when no ``target.exit`` was recorded or the last one
    carries no integer code.
    """
    verdict = verdict_of(CHECK_COMPLETES, bound="== 0")
    exits = events_of(history, TARGET_EXIT)
    stops = events_of(history, RUNNER_STOP)
    if not exits:
        if stops:
            return verdict(
                status="unknown",
                evidence=[cite(history, stops[-1], _stop_reason(stops[-1]))],
                reason=f"the harness stopped the job ({_stop_reason(stops[-1])}) and its exit was never recorded",
            )
        return verdict(status="unknown", reason="no target.exit event: the job's end was never recorded")
    last = exits[-1]
    code = last.get_int("code")
    stop = next((e for e in reversed(stops) if e.ts_ns <= last.ts_ns), None)
    if stop is not None:
        after = f"; it then exited with code {code}" if code is not None else ""
        return verdict(
            status="fail",
            evidence=[cite(history, stop, _stop_reason(stop)), cite(history, last, f"code {code}")],
            reason=f"the harness stopped the job ({_stop_reason(stop)}) before it finished{after}",
        )
    if code is None:
        return verdict(
            status="unknown",
            evidence=[cite(history, last)],
            reason=f"the last target.exit (at {fmt_offset(history, last.ts_ns)}) carries no integer code",
        )
    if code == 0:
        return verdict(status="pass", measured=0.0, evidence=[cite(history, last)], reason="job exited with code 0")
    faults = [e for e in events_of(history, FAULT_APPLIED) if e.ts_ns <= last.ts_ns]
    evidence = [*(cite(history, e) for e in faults[-3:]), cite(history, last, f"code {code}")]
    return verdict(
        status="fail", measured=float(code), evidence=evidence, reason=_failure(history, scenario, code, faults)
    )


def _stop_reason(stop: Event) -> str:
    return stop.get_str("reason") or "no reason recorded"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _fault_signal(scenario: Scenario, fault: str | None) -> int | None:
    """The signal number a fault sends (its params' ``signal``, e.g. a ``kill``), None when it sends none."""
    spec = next((f for f in getattr(scenario, "faults", ()) if f.name == fault), None)  # None: judged offline
    name = getattr(spec.params, "signal", None) if spec is not None else None
    if isinstance(name, str) and name in signal.Signals.__members__:
        return int(signal.Signals[name])
    return None


def _failure(history: History, scenario: Scenario, code: int, faults: list[Event]) -> str:
    """Why a job that ended by itself with ``code`` != 0 failed, as far as the history shows."""
    names = ", ".join(dict.fromkeys(f"{e.get_str('fault')} ({fmt_offset(history, e.ts_ns)})" for e in faults))
    if code < 0:  # a local process killed by a signal reports minus its number
        killer = next((e for e in reversed(faults) if _fault_signal(scenario, e.get_str("fault")) == -code), None)
        if killer is not None:
            return (
                f"the job was killed by fault {killer.get_str('fault')!r}: it died of {_signal_name(-code)} "
                f"(code {code}), the signal that fault sent at {fmt_offset(history, killer.ts_ns)}"
            )
        cause = f"the job died of {_signal_name(-code)} (code {code})"
        return cause + (f", after fault(s) {names} were applied" if faults else ", with no fault applied before it")
    if faults:
        return f"the job failed with code {code} after fault(s) {names} were applied: it did not recover from them"
    return f"the job itself failed with code {code}, with no fault applied before it"
