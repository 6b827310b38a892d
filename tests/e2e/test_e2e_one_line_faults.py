"""The in-job faults on a script as users write it plus the one ``attach`` line (``tests/jobs/user_plain_ddp.py``:
DDP, Adam, its own checkpoint and resume; the test writes the copy and checks the difference is the two lines).

- With ``guard="checksum"`` in that line: one exponent bit of rank 1's gradient flipped in transit at step 10 is
  caught in that step, naming rank 1, and retried (the step is blocked); rank 1 killed inside step 30's gradient
  all-reduce (``phase: allreduce``) is detected, the job resumes, and its end is bit-identical to a fault-free
  run of the same script (``matches_golden`` on both ranks). One run judges both faults.
- Without a guard: a flip of the top mantissa bit of one element of rank 1's Adam state (``exp_avg``) at step 12
  leaves the job exiting 0 with replicas that differ, finitely (an exponent bit would make both ranks' weights
  NaN through the next all-reduce: then they agree); the agent's consistency check (every 10 steps by default)
  reports the divergence and ``ranks_agree`` fails.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support import ROOT, attached_script, detected_and_recovered, run_user_script, verdicts

pytestmark = pytest.mark.slow

JOB = ROOT / "tests" / "jobs" / "user_plain_ddp.py"
ARGS: list[str | float] = ["--checkpoint-dir", "{run_dir}/ckpt", "--step-time", 0.05, "--pg-timeout", 10]


def test_a_flip_in_transit_is_caught_and_a_kill_in_the_all_reduce_recovers_bit_identical(
    e2e_report_root: Path, tmp_path: Path
) -> None:
    job = attached_script(
        JOB, tmp_path / "attached.py", 'chaos.agent.attach(model, optimizer, ddp=ddp, guard="checksum")'
    )
    flip = {
        "name": "flip",
        "type": "grad_corrupt",
        "params": {"site": "in_transit", "rank": 1, "bit": "exponent", "magnitude": "rms"},
        "trigger": {"at_step": 10, "rank": 1},
    }
    kill = {
        "name": "kill",
        "type": "kill",
        "params": {"rank": 1},
        "trigger": {"at_step": 30, "rank": 1, "phase": "allreduce"},
    }
    checks = [
        {"type": "sdc_detected", "params": {"fault": "flip", "within_steps": 0}},
        {"type": "step_blocked", "params": {"fault": "flip"}},
        *detected_and_recovered("kill", "5s", "60s"),
        {"type": "restarts_at_most", "params": {"restarts": 1}},
        {"type": "matches_golden"},
        {"type": "completes"},
    ]
    result = run_user_script(
        e2e_report_root, tmp_path, "one-line-sdc-kill", job, ["--steps", 40, *ARGS], [flip, kill], checks
    )
    got = verdicts(result)
    assert all(status == "pass" for status, _ in got.values()), got
    applied = {e.get_str("fault"): e for e in result.history.of("fault.applied")}
    assert applied["flip"].source == "target" and applied["flip"].get_int("step") == 10
    assert (applied["kill"].get_int("step"), applied["kill"].get_str("phase")) == (30, "allreduce")
    caught = [e for e in result.history.of("detect.sdc") if e.get_int("step") == 10]
    assert {e.rank for e in caught} == {0, 1} and {e.get_int("culprit_rank") for e in caught} == {1}, caught


def test_a_flip_in_one_ranks_adam_state_fails_ranks_agree(e2e_report_root: Path, tmp_path: Path) -> None:
    job = attached_script(JOB, tmp_path / "attached.py", "chaos.agent.attach(model, optimizer, ddp=ddp)")
    flip = {
        "name": "flip-exp-avg",
        "type": "bitflip",
        "params": {"where": "optimizer_state", "state": "exp_avg", "layer": "0.weight", "bit": 22, "rank": 1},
        "trigger": {"at_step": 12, "rank": 1},
    }
    checks = [{"type": "ranks_agree"}, {"type": "completes"}]
    result = run_user_script(e2e_report_root, tmp_path, "one-line-adam-flip", job, ["--steps", 30, *ARGS], flip, checks)
    got = verdicts(result)
    assert got["completes"][0] == "pass", got  # the job exits 0: only the replicas' states tell
    assert got["ranks_agree"][0] == "fail", got
    [applied] = result.history.of("fault.applied")
    assert applied.source == "target" and applied.rank == 1 and applied.get_int("step") == 12, applied.data
    assert result.history.of("detect.divergence"), "the agent's consistency check never reported the divergence"
