"""`completes` tells "the job failed" from "the harness stopped it", on hand-made histories.

Defect pinned: when the harness SIGTERMed the job at max_duration (or on no progress, or an interrupt), the
check said "job exited with code 1" (or -15), as if the job had failed by itself; and a job that exits 0 on
SIGTERM (a graceful shutdown handler) passed although it never finished. The orchestrator now records
``runner.stop`` {reason} before it signals a job that is still running, and the check reads it.
"""

from __future__ import annotations

from typing import Any, cast

from chaos.checks.base import CheckResult
from chaos.checks.recovery import RUNNER_STOP
from chaos.history.timeline import Event, History
from chaos.plugins.registry import checks
from chaos.spec.scenario import Scenario, parse_scenario

SECOND = 1_000_000_000


def ev(t: float, kind: str, **data: Any) -> Event:
    return Event(ts_ns=round(t * SECOND), kind=kind, source="runner", data=data)


def judge(events: list[Event], scenario: Scenario | None = None) -> CheckResult:
    spec = checks()["completes"]
    return spec.evaluate(History.from_events(events), spec.Params(), cast(Any, scenario))


RUN = [ev(0.0, "runner.start"), ev(0.5, "runner.target_started"), ev(1.0, "target.step", step=1)]
KILLER = parse_scenario(
    """\
name: k
target: {type: command, command: [sleep, "30"]}
faults:
  - {name: kill-main, type: kill, params: {name: sleep, signal: SIGKILL}, trigger: {after: 1s}}
  - {name: term-main, type: kill, params: {name: sleep, signal: SIGTERM}, trigger: {after: 1s}}
checks: [{type: completes}]
"""
)


def applied(t: float, fault: str) -> Event:
    return ev(t, "fault.applied", fault=fault, op=f"{fault}#1", injector="kill")


def test_the_harness_stopping_the_job_at_its_limit_is_not_the_job_failing() -> None:
    stopped = [
        *RUN,
        ev(60.0, "runner.end", reason="max_duration 60s reached"),
        ev(60.1, RUNNER_STOP, reason="max_duration 60s reached", grace_s=10.0),
        ev(60.3, "target.exit", code=-15),
    ]
    result = judge(stopped)
    assert result.status == "fail" and result.measured is None
    assert result.reason == (
        "the harness stopped the job (max_duration 60s reached) before it finished; it then exited with code -15"
    )
    assert result.evidence[0].startswith("runner.stop at +60.100s; max_duration 60s reached")
    # The same exit without the harness's stop is the job's own: a signal from elsewhere, measured as its code.
    on_its_own = judge([e for e in stopped if e.kind != RUNNER_STOP])
    assert on_its_own.status == "fail" and on_its_own.measured == -15.0
    assert on_its_own.reason == "the job died of SIGTERM (code -15), with no fault applied before it"


def test_a_job_that_exits_0_on_the_harness_sigterm_did_not_complete() -> None:
    # A graceful SIGTERM handler exits 0: without the stop record this passed although the work was cut off.
    graceful = [
        *RUN,
        ev(30.0, RUNNER_STOP, reason="no progress: no target.step for 20s"),
        ev(30.2, "target.exit", code=0),
    ]
    result = judge(graceful)
    assert result.status == "fail"
    assert "the harness stopped the job (no progress: no target.step for 20s)" in result.reason
    assert judge([e for e in graceful if e.kind != RUNNER_STOP]).status == "pass"


def test_an_interrupt_is_named_and_a_stop_after_the_exit_does_not_count() -> None:
    interrupted = [*RUN, ev(5.0, RUNNER_STOP, reason="RunInterrupted: SIGTERM"), ev(5.2, "target.exit", code=-15)]
    assert "the harness stopped the job (RunInterrupted: SIGTERM)" in judge(interrupted).reason
    finished = [*RUN, ev(5.0, "target.exit", code=0), ev(6.0, RUNNER_STOP, reason="load finished")]
    assert judge(finished).status == "pass"
    no_exit = [*RUN, ev(5.0, RUNNER_STOP, reason="max_duration 5s reached")]
    result = judge(no_exit)
    assert result.status == "unknown"
    assert result.reason.startswith(
        "the harness stopped the job (max_duration 5s reached) and its exit was never recorded; "
    )
    assert "to fix: let the job end by itself within safety.max_duration" in result.reason


def test_the_job_failing_by_itself_is_told_from_a_job_a_fault_killed() -> None:
    failed = judge([*RUN, ev(4.0, "target.exit", code=3)], KILLER)
    assert failed.status == "fail" and failed.measured == 3.0
    assert failed.reason == "the job itself failed with code 3, with no fault applied before it"

    killed = judge([*RUN, applied(2.0, "kill-main"), ev(2.1, "target.exit", code=-9)], KILLER)
    assert killed.status == "fail" and killed.measured == -9.0
    assert killed.reason.startswith("the job was killed by fault 'kill-main': it died of SIGKILL (code -9)")
    assert any(line.startswith("fault.applied kill-main") for line in killed.evidence)

    # A fault that sends SIGTERM did not cause a death by SIGKILL: the signal is named, the fault only noted.
    other = judge([*RUN, applied(2.0, "term-main"), ev(2.1, "target.exit", code=-9)], KILLER)
    assert other.reason == "the job died of SIGKILL (code -9), after fault(s) term-main (+2.000s) were applied"

    # torchrun exits 1 when its restarts are spent: the job did not recover from the faults that hit it.
    gave_up = judge([*RUN, applied(2.0, "kill-main"), ev(9.0, "target.exit", code=1)], KILLER)
    assert gave_up.reason == (
        "the job failed with code 1 after fault(s) kill-main (+2.000s) were applied: it did not recover from them"
    )


def test_judged_offline_without_a_scenario_the_fault_is_not_blamed_by_guess() -> None:
    result = judge([*RUN, applied(2.0, "kill-main"), ev(2.1, "target.exit", code=-9)], None)
    assert result.status == "fail"
    assert result.reason == "the job died of SIGKILL (code -9), after fault(s) kill-main (+2.000s) were applied"
