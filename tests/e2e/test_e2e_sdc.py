"""End to end SDC scenarios against the real DDP job: faults fired by the in-job agent, caught by the guards;
and the same in-transit fault without a guard silently corrupts the model (the checks can fail)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import ROOT

from chaos.history.timeline import FAULT_APPLIED
from chaos.run.orchestrator import RunOptions, execute
from chaos.run.result import EXIT_FAIL, EXIT_PASS
from chaos.spec.scenario import Scenario, load_scenario

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def report_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sdc-reports")


def _load(name: str) -> Scenario:
    return load_scenario(ROOT / "scenarios" / f"{name}.yaml")


def _results(result) -> dict[str, object]:  # type: ignore[no-untyped-def]
    return {r.check: (r.status, r.measured, r.reason) for r in result.results}


# sdc-in-transit as shipped runs in tests/e2e/test_pytest_xdist.py (side by side with three other scenarios),
# which asserts what a run of it must show: the agent fired the flip, the guard caught it in that step, naming
# rank 1. Here: the other two scenarios, and the same fault with the guard removed.
@pytest.mark.parametrize("name", ["sdc-local-gradient", "weight-bitflip-stuck"])
def test_sdc_scenario_passes(name: str, report_root: Path) -> None:
    result = execute(_load(name), RunOptions(report_root=report_root))
    assert result.exit_code == EXIT_PASS, (result.error, _results(result))
    applied = result.history.of(FAULT_APPLIED)
    assert applied and all(e.source == "target" for e in applied), "the in-job agent did not fire the fault"


def test_without_the_guard_the_same_fault_silently_corrupts_the_model(report_root: Path) -> None:
    scenario = _load("sdc-in-transit")
    args = [a for a in scenario.target.args if a not in ("--guard", "checksum")]  # type: ignore[union-attr]
    unguarded = scenario.model_copy(update={"target": scenario.target.model_copy(update={"args": args})})
    result = execute(unguarded, RunOptions(report_root=report_root))
    statuses = {r.check: r.status for r in result.results}
    assert result.history.of(FAULT_APPLIED), "the fault must still fire without the guard"
    assert statuses["sdc_detected"] == "fail" and statuses["step_blocked"] == "fail", _results(result)
    assert result.exit_code == EXIT_FAIL
