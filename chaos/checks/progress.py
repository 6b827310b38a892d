"""``progress``: the run never stalled.

The runner watches ``safety.no_progress_timeout``: when no ``target.step`` (or, for a target that must become
ready first, no ready event; or no load activity) arrives for that long it ENDS the run (a safety stop, an
action) and records ``runner.no_progress`` {seconds, step} followed by ``runner.end`` {reason}. Whether the
run passes is this check's call, over those events only.

The orchestrator applies this check to every run whose scenario does not name it and reports it only when it
fails: a stalled run fails whatever else the scenario asked, and a run that never stalled reports exactly the
checks its scenario names.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from pydantic import BaseModel

from chaos.checks._evidence import cite, events_of, narrow
from chaos.checks.base import CheckParams, CheckResult, register_check
from chaos.history.timeline import History

if TYPE_CHECKING:
    from chaos.spec.scenario import Scenario

CHECK_PROGRESS = "progress"
RUNNER_NO_PROGRESS = "runner.no_progress"
RUNNER_END = "runner.end"


class ProgressParams(CheckParams):
    """``progress`` takes no parameters: its bound is the scenario's ``safety.no_progress_timeout``."""


@register_check(
    CHECK_PROGRESS,
    ProgressParams,
    summary="the runner never ended the run for lack of progress (safety.no_progress_timeout)",
)
def progress(history: History, params: BaseModel, scenario: Scenario | None) -> CheckResult:
    """``fail`` when the history holds a ``runner.no_progress`` event (reason: the ``runner.end`` reason that
    follows it, which says what was awaited); ``unknown`` when the scenario switched the watch off
    (``no_progress_timeout: null``), since then nothing could have been seen; ``pass`` otherwise."""
    narrow(params, ProgressParams)
    verdict = partial(CheckResult, check=CHECK_PROGRESS, name=CHECK_PROGRESS)
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
    if scenario is not None and scenario.safety.no_progress_timeout is None:
        return verdict(status="unknown", reason="safety.no_progress_timeout is null: nobody watched for progress")
    return verdict(status="pass", reason="the run was never ended for lack of progress")
