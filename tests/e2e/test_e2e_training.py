"""End to end against a real torchrun DDP job: kill-rank and slow-rank pass; broken recovery is caught; a fault
that never fires yields unknown, not pass. (freeze-rank as shipped is judged in tests/e2e/test_pytest_xdist.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from support import ROOT

from chaos.history.timeline import FAULT_APPLIED, FAULT_HEALED
from chaos.run.orchestrator import RunOptions, execute
from chaos.run.result import EXIT_FAIL, EXIT_PASS, RunResult
from chaos.spec.scenario import Scenario, load_scenario

pytestmark = pytest.mark.slow


@pytest.fixture
def report_root(e2e_report_root: Path) -> Path:
    # The session's root, so each golden run is computed once and reused from its cache.
    return e2e_report_root


def _scenario(name: str, **target_updates: object) -> Scenario:
    scenario = load_scenario(ROOT / "scenarios" / f"{name}.yaml")
    if target_updates:
        scenario = scenario.model_copy(update={"target": scenario.target.model_copy(update=target_updates)})
    return scenario


def _statuses(result) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {r.check: r.status for r in result.results}


def test_kill_rank_detects_recovers_and_matches_golden(kill_rank_run: RunResult) -> None:
    result = kill_rank_run
    assert result.exit_code == EXIT_PASS, (result.error, [r.model_dump() for r in result.results])
    assert set(_statuses(result).values()) == {"pass"}
    assert len(result.history.of(FAULT_APPLIED)) == 1
    assert result.history.of("target.restart"), "torchrun never restarted the worker group"
    detection = next(r for r in result.results if r.check == "detected_within")
    assert isinstance(detection.measured, float) and 0 < detection.measured < 30
    for name in ("run.json", "history.jsonl", "junit.xml", "report.html"):
        assert (result.run_dir / name).exists()


# freeze-rank as shipped runs in tests/e2e/test_pytest_xdist.py, which asserts its heal and its detection.


# A recovery that skips the optimizer's restore fails matches_golden: judged on a user job (test_e2e_user_resume)
# and, with the reference trainer's sabotage switch, in tests/integration/test_ddp_trainer.py.


def test_step_trigger_past_the_end_is_unknown_not_pass(report_root: Path) -> None:
    scenario = _scenario("kill-rank")
    fault = scenario.faults[0]
    late = fault.model_copy(update={"trigger": fault.trigger.model_copy(update={"at_step": 10_000})})
    scenario = scenario.model_copy(update={"faults": [late]})
    result = execute(scenario, RunOptions(report_root=report_root))
    statuses = _statuses(result)
    assert statuses["detected_within"] == "unknown" and statuses["recovered_within"] == "unknown"
    assert not result.history.of(FAULT_APPLIED)
    assert result.exit_code == EXIT_FAIL


def test_slow_rank_changes_nothing_but_pace(report_root: Path) -> None:
    result = execute(_scenario("slow-rank"), RunOptions(report_root=report_root))
    assert result.exit_code == EXIT_PASS, (result.error, [r.model_dump() for r in result.results])
    assert len(result.history.of(FAULT_HEALED)) == 1
    assert not result.history.of("target.restart")
