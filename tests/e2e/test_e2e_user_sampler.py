"""A DataLoader + DistributedSampler script as users write theirs (``tests/jobs/user_sampler_ddp.py``: epochs,
AdamW, a mid-epoch resume that skips the batches its checkpoint trained, gloo with a 10 s timeout), run
unmodified and then with the one ``attach`` line.

Unmodified, a kill of rank 1 is detected, recovered, and the job completes (a freeze at the job's own timeout
is judged on the other unmodified script, test_e2e_unmodified_script). With ``import chaos.agent`` and
``agent = chaos.agent.attach(model, optimizer, ddp=ddp, data=loader)`` added (the test writes that copy and
checks those are the only edits), a kill in the middle of an epoch also passes ``exactly_once`` (every sample of
the three epochs trained once, counting the resumed attempt from the batch the checkpoint ended at) and
``matches_golden`` on both ranks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support import ROOT, attached_script, detected_and_recovered, run_user_script, verdicts

from chaos.run.result import RunResult

pytestmark = pytest.mark.slow

JOB = ROOT / "tests" / "jobs" / "user_sampler_ddp.py"
PG_TIMEOUT = 10.0


def run(root: Path, tmp: Path, name: str, job: Path, fault: dict[str, Any], checks: list[dict[str, Any]]) -> RunResult:
    return run_user_script(
        root, tmp, name, job, ["--checkpoint-dir", "{run_dir}/ckpt", "--pg-timeout", PG_TIMEOUT], fault, checks
    )


def test_unmodified_a_killed_rank_is_detected_and_recovered(e2e_report_root: Path, tmp_path: Path) -> None:
    # A freeze detected at the job's own timeout is judged on the other unmodified script
    # (test_e2e_unmodified_script): the same zero-line evidence, torch's own timeout error.
    fault = {"name": "lose-rank1", "type": "kill", "params": {"rank": 1}, "trigger": {"at_step": 25, "rank": 1}}
    checks = [
        *detected_and_recovered("lose-rank1", "5s", "90s"),
        {"type": "restarts_at_most", "params": {"restarts": 1}},
        {"type": "completes"},
    ]
    result = run(e2e_report_root, tmp_path, "sampler-kill", JOB, fault, checks)
    got = verdicts(result)
    assert all(status == "pass" for status, _ in got.values()), got
    assert all(e.data.get("source") == "optimizer" for e in result.history.of("target.step"))


def test_with_the_one_attach_line_every_sample_is_trained_once_and_matches_golden(
    e2e_report_root: Path, tmp_path: Path
) -> None:
    job = attached_script(JOB, tmp_path / "attached.py", "chaos.agent.attach(model, optimizer, ddp=ddp, data=loader)")
    fault = {"name": "kill-rank1", "type": "kill", "params": {"rank": 1}, "trigger": {"at_step": 35, "rank": 1}}
    checks = [
        *detected_and_recovered("kill-rank1", "5s", "60s"),
        {"type": "lost_work_at_most", "params": {"steps": 10}},
        {"type": "exactly_once"},
        {"type": "matches_golden"},
        {"type": "completes"},
    ]
    result = run(e2e_report_root, tmp_path, "sampler-one-line", job, fault, checks)
    got = verdicts(result)
    assert all(status == "pass" for status, _ in got.values()), got
    resumed = [e for e in result.history.of("target.resume") if e.rank == 1]
    assert resumed and resumed[0].get_int("step") == 30, [e.data for e in resumed]  # mid-epoch: epoch 1, batch 10
