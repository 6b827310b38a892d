"""On a job we did not write: ``tests/jobs/user_ddp_resume.py`` (DDP + Adam, a DataLoader with
a DistributedSampler, ``torch.save`` checkpoints every 4 steps, resume from the newest), which imports nothing of
mlchaos but the agent line and reports nothing itself. Through the whole harness (``execute``, golden run and all):

- rank 1 killed at step 10 with one torchrun restart: ``recovered_within``, ``lost_work_at_most``,
  ``exactly_once`` and ``matches_golden`` all pass on evidence the agent reported (steps, sample ids, the
  checkpoints it saw saved, the restarted attempt's resume, every rank's digest), none of them unknown;
- the same job with the classic resume bug (``FORGET_OPTIMIZER=1``: the model restored, Adam's state not) fails
  ``matches_golden``, while the progress checks still pass: only the final state is wrong. The bug is switched
  on in the harness's environment, which the job inherits: a fault-free run never resumes, so its golden run is
  the good job's, read from the cache (the target spec, and with it the golden key, is the same).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support import ROOT, verdicts, write_and_run

from chaos.run.result import RunResult

pytestmark = pytest.mark.slow

STEPS, EVERY, KILL_AT = 16, 4, 10
JOB = ROOT / "tests" / "jobs" / "user_ddp_resume.py"
ARGS = ["--steps", STEPS, "--checkpoint-every", EVERY, "--checkpoint-dir", "{run_dir}/ckpt", "--step-time", 0.2]
KILL = {
    "name": "kill-rank1",
    "type": "kill",
    "params": {"rank": 1, "signal": "SIGKILL"},
    "trigger": {"at_step": KILL_AT, "rank": 1},
}
CHECKS = [
    {"type": "recovered_within", "params": {"fault": "kill-rank1", "within": "90s"}},
    {"type": "lost_work_at_most", "params": {"steps": EVERY + 2}},
    {"type": "exactly_once"},
    {"type": "matches_golden"},
    {"type": "completes"},
]


def run(root: Path, tmp: Path, name: str, extra_args: list[Any]) -> RunResult:
    target = {
        "type": "torchrun",
        "script": str(JOB),
        "nproc_per_node": 2,
        "max_restarts": 1,
        "args": [*ARGS, *extra_args],
    }
    safety = {"max_duration": "240s", "no_progress_timeout": "90s"}
    return write_and_run(root, tmp, name, 5, target, faults=[KILL], checks=CHECKS, safety=safety)


def test_a_killed_rank_of_a_users_resumable_job_is_judged_on_real_evidence(
    e2e_report_root: Path, tmp_path: Path
) -> None:
    result = run(e2e_report_root, tmp_path, "user-resume-kill", [])
    got = verdicts(result)
    assert {check: status for check, (status, _) in got.items()} == dict.fromkeys(got, "pass"), got
    history = result.history
    [applied] = history.of("fault.applied")
    [started] = [e for e in history.of("target.start") if e.rank == 1 and e.get_int("attempt") == 0]
    assert f"rank 1 (pid {started.get_int('pid')})" in (applied.get_str("description") or ""), (applied, started)
    # The evidence is the agent's: a restarted attempt that resumed from a checkpoint it saw saved.
    saved = {e.get_int("step") for e in history.of("target.checkpoint") if e.data.get("seen") == "torch.save"}
    resumes = [e for e in history.of("target.resume") if e.get_int("attempt") == 1]
    assert {e.rank for e in resumes} == {0, 1}, resumes
    resumed_at = resumes[0].get_int("step")
    assert resumed_at in saved and resumed_at is not None and resumed_at % EVERY == 0, (resumes, saved)
    steps = [e for e in history.of("target.step") if e.rank is not None]
    assert all(isinstance(e.data.get("samples"), list) and e.data["samples"] for e in steps)
    assert max(e.get_int("attempt") or 0 for e in steps) == 1  # the restart is in the steps' attempts
    assert {e.rank for e in history.of("target.digest")} == {0, 1}
    lost = next(r for r in result.results if r.check == "lost_work_at_most")
    assert lost.measured is not None and lost.measured >= KILL_AT - resumed_at - 1, lost  # real recomputation
    once = next(r for r in result.results if r.check == "exactly_once")
    assert once.measured == STEPS * 8 * 2, once  # every sample of the epoch, once


def test_a_resume_that_forgets_the_optimizer_fails_matches_golden(e2e_report_root: Path, tmp_path: Path) -> None:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("FORGET_OPTIMIZER", "1")
        result = run(e2e_report_root, tmp_path, "user-resume-forgets-optimizer", [])
    got = verdicts(result)
    status, reason = got["matches_golden"]
    assert status == "fail" and "differs from golden" in reason, got
    for check in ("recovered_within", "lost_work_at_most", "exactly_once", "completes"):
        assert got[check][0] == "pass", got  # progress was fine: only the restored state is wrong
