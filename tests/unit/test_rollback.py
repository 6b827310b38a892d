"""Rollback after a late-detected SDC: the pure decision (chaos.reference.rollback) and the check
``rolled_back_before_corruption`` (chaos.checks.rollback) on simulated histories (tests/unit/rollback_histories)."""

from __future__ import annotations

import pytest
from rollback_histories import FAULT, RollbackRun

from chaos.checks.base import CheckResult
from chaos.history.timeline import History
from chaos.plugins.registry import checks
from chaos.reference.rollback import Steps, newest_candidates, rollback_candidates, rollback_step

# --- the decision --------------------------------------------------------------------------------------------


def test_rolls_back_to_the_newest_checkpoint_at_or_before_the_last_clean_step() -> None:
    # Checkpoints every 5, guard every 10: clean at 10, corruption somewhere in (10, 20], detected at 20.
    assert rollback_step([5, 10, 15, 20], last_clean=10, detected=20) == 10
    assert rollback_candidates([20, 5, 15, 10], last_clean=10, detected=20) == [10, 5]
    # The newest checkpoint (20) and the one between the checks (15) may hold the corruption: never chosen.
    assert rollback_step([15, 20], last_clean=10, detected=20) is None
    assert rollback_step([3, 7, 12], last_clean=10, detected=20) == 7


def test_no_clean_step_or_no_old_enough_checkpoint_means_scratch() -> None:
    assert rollback_step([5, 10], last_clean=None, detected=10) is None  # detected at the guard's first check
    assert rollback_step([], last_clean=10, detected=20) is None
    assert rollback_candidates([5], last_clean=None, detected=10) == []


def test_a_checkpoint_at_the_clean_step_itself_counts() -> None:
    assert rollback_step([10], last_clean=10, detected=11) == 10


def test_impossible_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="precede"):
        rollback_step([5], last_clean=20, detected=20)
    with pytest.raises(ValueError, match=">= 0"):
        rollback_step([-5], last_clean=10, detected=20)
    with pytest.raises(ValueError, match=">= 0"):
        rollback_step([5], last_clean=-1, detected=20)


def test_the_broken_policy_takes_the_newest_whatever_it_holds() -> None:
    assert newest_candidates([5, 20, 15, 10]) == [20, 15, 10, 5]


def test_steps_rewind() -> None:
    steps = Steps(1, 5)
    seen: list[int] = []
    for step in steps:
        seen.append(step)
        if step == 4 and len(seen) == 4:
            steps.restart_after(1)
    assert seen == [1, 2, 3, 4, 2, 3, 4, 5]


# --- the check -----------------------------------------------------------------------------------------------


def judge(run: RollbackRun, **params: object) -> CheckResult:
    spec = checks()["rolled_back_before_corruption"]
    return spec.evaluate(
        History.from_events(run.events()), spec.Params.model_validate({"fault": FAULT, **params}), None
    )


def test_the_default_story_passes_with_the_steps_in_the_reason() -> None:
    run = RollbackRun()  # fault 13, checks every 10, checkpoints every 5: detected at 20, back to 10
    result = judge(run)
    assert result.status == "pass", result.reason
    assert result.measured == 10.0 and result.bound == "< 13"
    assert "corrupted at step 13, detected at step 20" in result.reason
    assert "replaying 11 step(s)" in result.reason  # from step 21 back to 10


@pytest.mark.parametrize("style", ["inplace", "resume", "both"])
def test_each_style_of_rollback_passes(style: str) -> None:
    assert judge(RollbackRun(style=style)).status == "pass"  # type: ignore[arg-type]


def test_scratch_is_a_valid_rollback() -> None:
    run = RollbackRun(fault_step=4)  # detected at the first check: nothing verified clean
    assert run.right_target == 0
    result = judge(run)
    assert result.status == "pass", result.reason and result.measured == 0.0


def test_rolling_back_to_the_newest_checkpoint_fails() -> None:
    run = RollbackRun()
    result = judge(run.but(to_step=run.newest_checkpoint))
    assert result.status == "fail"
    assert "rolled back to step 20, at or after the corruption at step 13" in result.reason
    # A checkpoint AT the corruption step already holds it.
    assert judge(run.but(to_step=13, next_offset=1)).status == "fail"


def test_no_rollback_after_the_detection_fails() -> None:
    result = judge(RollbackRun(rollback=False))
    assert result.status == "fail" and "no rank rolled back" in result.reason


def test_a_rollback_that_did_not_replay_fails() -> None:
    result = judge(RollbackRun(next_offset=12))  # says 10, goes on at 22
    assert result.status == "fail" and "its next step was 22, not 11" in result.reason


def test_a_restart_resuming_elsewhere_fails() -> None:
    result = judge(RollbackRun(style="both", resume_step=20))
    assert result.status == "fail" and "then resumed from step 20" in result.reason


def test_stopping_before_the_detection_step_fails() -> None:
    result = judge(RollbackRun(stop_at=20))
    assert result.status == "fail" and "never got past the detection's step 20" in result.reason


def test_ranks_that_did_not_roll_back_fail() -> None:
    result = judge(RollbackRun(only_rank0=True))
    assert result.status == "fail" and "rank 1 kept training after the detection without rolling back" in result.reason


def test_a_later_detection_without_a_rollback_fails() -> None:
    result = judge(RollbackRun(redetect=True))
    assert result.status == "fail" and "came after the last rollback" in result.reason


def test_without_evidence_it_is_unknown() -> None:
    assert judge(RollbackRun(detect=False)).status == "unknown"
    assert judge(RollbackRun(with_fault=False)).status == "unknown"
    assert judge(RollbackRun(to_step_known=False)).status == "unknown"


def test_a_runner_fault_without_a_step_is_placed_by_the_steps_reported_before_it() -> None:
    run = RollbackRun(fault_step_known=False)  # fault.applied lands before step 13's reports: step 13
    result = judge(run)
    assert result.status == "pass", result.reason
    assert result.bound == "< 13"


def test_the_trainer_refuses_a_rollback_without_the_guard() -> None:
    from chaos.reference.trainer import parse_args

    assert parse_args(["--checkpoint-dir", "/nonexistent", "--rollback"]).rollback is True
    with pytest.raises(SystemExit):
        parse_args(["--checkpoint-dir", "/nonexistent", "--rollback", "--consistency-every", "0"])
