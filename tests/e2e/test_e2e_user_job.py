"""On a job we did not write, through the whole harness (``execute``, golden run and all):
``tests/jobs/user_ddp_adam.py`` (DDP + Adam, 2 gloo ranks, the one-line agent, its own digest).

- A flip in rank 1's Adam ``exp_avg_sq`` at the last step changes only rank 1's final weights: ``matches_golden``
  fails naming rank 1 and only rank 1 (rank 0 still equals golden: the check once compared rank 0 alone and
  passed), and ``ranks_agree`` fails (the job exits 0, so ``completes`` passes).
- A 1-ULP one-step weight flip after backward, healed at the end of its step, leaves every rank equal to golden.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support import ROOT, verdicts, write_and_run

from chaos.run.result import RunResult

pytestmark = pytest.mark.slow

STEPS = 8
JOB = ROOT / "tests" / "jobs" / "user_ddp_adam.py"
TARGET = {"type": "torchrun", "script": str(JOB), "nproc_per_node": 2, "max_restarts": 0, "args": ["--steps", STEPS]}
CHECKS = [{"type": "matches_golden"}, {"type": "ranks_agree"}, {"type": "completes"}]


def run(root: Path, tmp: Path, name: str, params: dict[str, Any], at_step: int) -> RunResult:
    fault = {"name": "flip", "type": "bitflip", "params": params, "trigger": {"at_step": at_step, "rank": 1}}
    safety = {"max_duration": "120s", "no_progress_timeout": "60s"}
    return write_and_run(root, tmp, name, 11, TARGET, faults=[fault], checks=CHECKS, safety=safety)


def test_second_moment_flip_on_rank_1_fails_matches_golden_naming_rank_1(e2e_report_root: Path, tmp_path: Path) -> None:
    params = {
        "where": "optimizer_state",
        "state": "exp_avg_sq",
        "layer": "4.weight",
        "element": 5,
        "bit": 12,
        "phase": "backward",
        "rank": 1,
    }
    result = run(e2e_report_root, tmp_path, "user-adam-second-moment", params, at_step=STEPS)
    [applied] = result.history.of("fault.applied")
    assert applied.rank == 1 and applied.data.get("state") == "exp_avg_sq", applied
    got = verdicts(result)
    status, reason = got["matches_golden"]
    assert status == "fail" and "rank 1 differs from golden" in reason, got
    assert "rank 0 differs" not in reason, reason  # rank 0 never saw the flip: it still equals golden
    assert got["ranks_agree"][0] == "fail", got
    assert got["completes"][0] == "pass", got  # the job exits 0: only the cross-rank checks catch it


def test_one_ulp_weight_flip_healed_leaves_every_rank_golden(e2e_report_root: Path, tmp_path: Path) -> None:
    params = {"where": "weights", "layer": "4.bias", "element": 1, "bit": 0, "phase": "backward", "rank": 1}
    result = run(e2e_report_root, tmp_path, "user-adam-one-ulp", params, at_step=3)
    assert [e.rank for e in result.history.of("fault.applied")] == [1]
    assert [e.rank for e in result.history.of("fault.healed")] == [1]
    got = verdicts(result)
    assert got["matches_golden"][0] == "pass", got
    assert got["ranks_agree"][0] == "pass", got
    assert got["completes"][0] == "pass", got
