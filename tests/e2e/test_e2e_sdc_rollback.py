"""End to end: the shipped sdc-late-rollback scenario. A weight flip on rank 1 at step 13 goes unnoticed until the
consistency guard's check at step 20; the reference trainer rolls every rank back in place to the checkpoint of
step 10 (the newest the guard had verified clean; 15 and 20 already hold the corruption), replays, and ends
bit-identical to the fault-free run. The same job rolling back to the NEWEST checkpoint (``CHAOS_SABOTAGE=
rollback-newest``) fails rolled_back_before_corruption and matches_golden. Two runs and one golden run: the
sabotage changes only what a rollback does and a fault-free run has none, so the broken job's golden run is the
good one's (set in the harness's environment, which the job inherits, it leaves the cached golden key alone)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import ROOT

from chaos.history.timeline import FAULT_APPLIED, History
from chaos.reference.trainer import ENV_SABOTAGE
from chaos.run.orchestrator import RunOptions, execute
from chaos.run.result import EXIT_FAIL, EXIT_PASS, RunResult
from chaos.spec.scenario import load_scenario

pytestmark = pytest.mark.slow

SOURCE = ROOT / "scenarios" / "sdc-late-rollback.yaml"
CORRUPTED, DETECTED, CLEAN = 13, 20, 10  # the scenario's fault step, the guard's check that sees it, the one before


def _run(report_root: Path) -> RunResult:
    return execute(load_scenario(SOURCE), RunOptions(report_root=report_root, scenario_file=SOURCE))


@pytest.fixture(scope="module")
def good(e2e_report_root: Path) -> RunResult:
    with pytest.MonkeyPatch.context() as env:
        env.delenv(ENV_SABOTAGE, raising=False)
        return _run(e2e_report_root)


@pytest.fixture(scope="module")
def broken(good: RunResult, e2e_report_root: Path) -> RunResult:
    with pytest.MonkeyPatch.context() as env:  # after the good run, whose golden digest it reuses from the cache
        env.setenv(ENV_SABOTAGE, "rollback-newest")
        return _run(e2e_report_root)


def _statuses(result: RunResult) -> dict[str, tuple[str, str]]:
    return {r.check: (r.status, r.reason) for r in result.results}


def _rollbacks(history: History) -> list[tuple[int | None, int | None, int | None, int | None]]:
    return sorted(
        (e.rank, e.get_int("to_step"), e.get_int("detected_step"), e.get_int("last_clean_step"))
        for e in history.of("target.rollback")
    )


def _steps_after_rollback(history: History, rank: int) -> list[int]:
    [rollback] = [e for e in history.of("target.rollback") if e.rank == rank]
    return [
        s for e in history.of("target.step") if e.rank == rank and e.ts_ns > rollback.ts_ns and (s := e.get_int("step"))
    ]


def test_the_reference_trainer_rolls_back_before_the_corruption_and_matches_golden(good: RunResult) -> None:
    statuses = _statuses(good)
    assert good.exit_code == EXIT_PASS, (good.error, statuses)
    assert set(s for s, _ in statuses.values()) == {"pass"}, statuses
    [applied] = good.history.of(FAULT_APPLIED)
    assert applied.source == "target" and applied.rank == 1 and applied.get_int("step") == CORRUPTED
    [divergence] = good.history.of("detect.divergence")
    assert divergence.get_int("step") == DETECTED and divergence.get_int("culprit_rank") == 1
    # Every rank rolled back once, in place (no restart), to step 10: not to 20 or 15, which hold the corruption.
    assert _rollbacks(good.history) == [(r, CLEAN, DETECTED, CLEAN) for r in range(3)]
    assert not good.history.of("target.restart")
    [rollback] = [e for e in good.history.of("target.rollback") if e.rank == 0]
    assert rollback.get_int("from_step") == DETECTED + 1 and rollback.data["removed"] == [15, 20]
    steps = _steps_after_rollback(good.history, 0)
    assert steps[0] == CLEAN + 1 and steps[-1] == 30  # replayed 11..21, then went on to the end
    # After the rollback the guard finds the ranks identical again.
    later = [e for e in good.history.of("guard.consistency") if e.ts_ns > rollback.ts_ns]
    assert later and all(e.data["agree"] is True for e in later)


def test_rolling_back_to_the_newest_checkpoint_fails(broken: RunResult) -> None:
    statuses = _statuses(broken)
    assert broken.exit_code == EXIT_FAIL
    assert statuses["rolled_back_before_corruption"][0] == "fail", statuses
    assert (
        f"rolled back to step {DETECTED}, at or after the corruption at step {CORRUPTED}"
        in (statuses["rolled_back_before_corruption"][1])
    )
    assert statuses["matches_golden"][0] == "fail", statuses  # the model keeps the corruption
    # It was detected just the same, and the job itself finished: only the rollback decision was wrong.
    assert statuses["sdc_detected"][0] == "pass" and statuses["completes"][0] == "pass", statuses
    assert {to for _, to, _, _ in _rollbacks(broken.history)} == {DETECTED}
