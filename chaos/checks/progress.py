"""``progress``: the run never stalled.

The runner watches ``safety.no_progress_timeout``: when no ``target.step`` and no rank (re)start (``target.start``,
``target.worker``: a job that restarts is not hung, and a restart of several hosts can take longer than the
steps' usual pace) (or, for a target that must become ready first, no ready event; or no load activity) arrives
for that long it ENDS the run (a safety stop, an
action) and records ``runner.no_progress`` {seconds, step} followed by ``runner.end`` {reason}. Whether the
run passes is this check's call, over those events only.

The orchestrator applies this check to every run whose scenario does not name it and reports it only when it
fails: a stalled run fails whatever else the scenario asked, and a run that never stalled reports exactly the
checks its scenario names.

The runner's word is not the only evidence: two consecutive such events (steps and starts; or the last one and
the job's ``target.exit``) further apart than the timeout (plus :data:`GAP_SLACK_S`) are a stall too, recorded or
not (a history judged again under a tighter timeout, or written by a runner whose watch missed it), so a
missing ``runner.no_progress`` cannot pass it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from chaos.checks._evidence import cite, events_of, fmt_offset, fmt_seconds, seconds, step_events, verdict_of
from chaos.checks.base import CheckParams, CheckResult, register_check
from chaos.event_kinds import RUNNER_END, RUNNER_NO_PROGRESS, TARGET_EXIT, TARGET_START, TARGET_WORKER
from chaos.history.timeline import Event, History

if TYPE_CHECKING:
    from chaos.spec.scenario import Scenario

CHECK_PROGRESS = "progress"
GAP_SLACK_S = 2.0
"""Tolerance on a gap between steps: the runner times the ARRIVAL of events (tailed every 50 ms, with a
per-host clock offset on a multi-node run), the history their own timestamps, so a gap the watch accepted can
read a little longer in the history."""


def longest_gap(steps: list[Event]) -> tuple[float, Event, Event] | None:
    """The longest time between two consecutive ``steps`` (time-ordered), with the steps around it."""
    gaps = [(seconds(b.ts_ns - a.ts_ns), a, b) for a, b in zip(steps, steps[1:], strict=False)]
    return max(gaps, key=lambda gap: gap[0], default=None)


class ProgressParams(CheckParams):
    """``progress`` takes no parameters: its bound is the scenario's ``safety.no_progress_timeout``."""


@register_check(CHECK_PROGRESS, ProgressParams)
def progress(history: History, p: ProgressParams, scenario: Scenario | None) -> CheckResult:
    """the runner never ended the run for lack of progress (safety.no_progress_timeout)

    ``fail`` when the history holds a ``runner.no_progress`` event (reason: the ``runner.end`` reason that
    follows it, which says what was awaited), or two consecutive ``target.step`` events (or the last one and
    the ``target.exit`` after it) lie more than the timeout plus :data:`GAP_SLACK_S` apart; ``unknown`` when
    the scenario switched the watch off (``no_progress_timeout: null``), since then nothing could have been
    seen; ``pass`` otherwise."""
    verdict = verdict_of(CHECK_PROGRESS)
    stalls = events_of(history, RUNNER_NO_PROGRESS)
    if stalls:
        stall = stalls[0]
        ends = [e for e in events_of(history, RUNNER_END) if e.ts_ns >= stall.ts_ns]
        stalled_for = stall.data.get("seconds")
        reason = ends[0].get_str("reason") if ends else None
        return verdict(
            status="fail",
            reason=reason or f"no progress for {stalled_for}s",
            measured=float(stalled_for) if isinstance(stalled_for, (int, float)) else None,
            unit="s",
            evidence=[cite(history, stall)],
        )
    timeout = None if scenario is None else scenario.safety.no_progress_timeout
    if scenario is not None and timeout is None:
        return verdict(status="unknown", reason="safety.no_progress_timeout is null: nobody watched for progress")
    steps = step_events(history)
    alive = sorted(
        [*steps, *events_of(history, TARGET_START), *events_of(history, TARGET_WORKER)], key=lambda e: e.ts_ns
    )
    alive = [e for e in alive if steps and e.ts_ns >= steps[0].ts_ns]  # from the first step on, as the watch
    # The watch runs until the job exits: a stall after the last step, before the exit, counts as well.
    exits = [e for e in events_of(history, TARGET_EXIT) if alive and e.ts_ns > alive[-1].ts_ns][:1]
    gap = longest_gap([*alive, *exits])
    if timeout is not None and gap is not None and gap[0] > timeout + GAP_SLACK_S:
        taken, before, after = gap
        return verdict(
            status="fail",
            reason=f"no target.step or rank start for {fmt_seconds(taken)} (from {fmt_offset(history, before.ts_ns)} to "
            f"{fmt_offset(history, after.ts_ns)}), over safety.no_progress_timeout {fmt_seconds(timeout)}, "
            "though no runner.no_progress was recorded",
            measured=taken,
            unit="s",
            bound=f"<= {fmt_seconds(timeout)}",
            evidence=[cite(history, before, "last step before the gap"), cite(history, after, "what ended it")],
        )
    return verdict(status="pass", reason="the run was never ended for lack of progress")
