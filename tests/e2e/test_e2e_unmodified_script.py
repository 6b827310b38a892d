"""A training script that knows nothing of mlchaos (``tests/jobs/user_plain_ddp.py``: DDP, Adam, its own
checkpoint and resume, gloo with a 10 s process-group timeout), run unmodified through the whole harness.

Its steps come from the zero-line step reporter (the optimizer's own step count), so ``at_step`` triggers fire
and recovery is measured; its detections come from what torch prints when a collective fails, on the rank
that printed it. A kill of rank 1 is seen at once (rank 0's gloo connection is reset); a freeze of rank 1 is
seen when rank 0's all-reduce reaches the job's own 10 s timeout, not when torchrun notices a worker exit
tens of seconds later.

The same script with the one ``attach`` line added (and nothing else: the test writes that copy and checks the
difference is the two lines) gets the digest too: ``matches_golden`` on every rank after a kill and a resume.
That a wrong resume fails ``matches_golden`` on a user's job is judged in test_e2e_user_resume (a resume that
forgets Adam's state).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import ROOT, attached_script, detected_and_recovered, run_user_script, verdicts

from chaos.run.result import RunResult

pytestmark = pytest.mark.slow

JOB = ROOT / "tests" / "jobs" / "user_plain_ddp.py"
PG_TIMEOUT = 10.0


def with_one_line(tmp: Path) -> Path:
    """``user_plain_ddp.py`` with ``import chaos.agent`` and the one ``attach`` line after its DDP wrap."""
    return attached_script(JOB, tmp / "attached.py", "chaos.agent.attach(model, optimizer, ddp=ddp)")


def run(
    root: Path, tmp: Path, name: str, fault: dict[str, Any], checks: list[dict[str, Any]], job: Path = JOB
) -> RunResult:
    args: list[str | float] = ["--steps", 60, "--checkpoint-dir", "{run_dir}/ckpt", "--pg-timeout", PG_TIMEOUT]
    return run_user_script(root, tmp, name, job, args, fault, checks)


def measured(result: RunResult, check: str) -> float:
    value = next(r.measured for r in result.results if r.check == check)
    assert value is not None, check
    return value


def test_a_killed_rank_of_an_unmodified_script_is_detected_and_recovered(e2e_report_root: Path, tmp_path: Path) -> None:
    fault = {"name": "kill-rank1", "type": "kill", "params": {"rank": 1}, "trigger": {"at_step": 20, "rank": 1}}
    checks = [
        *detected_and_recovered("kill-rank1", "5s", "60s"),
        {"type": "restarts_at_most", "params": {"restarts": 1}},
        {"type": "completes"},
    ]
    result = run(e2e_report_root, tmp_path, "unmodified-kill", fault, checks)
    got = verdicts(result)
    assert all(status == "pass" for status, _ in got.values()), got
    steps = result.history.of("target.step")
    assert steps and all(e.data.get("source") == "optimizer" for e in steps), steps[:3]
    [applied] = result.history.of("fault.applied")
    assert max(e.get_int("step") or 0 for e in steps if e.ts_ns < applied.ts_ns) >= 20
    # The resumed attempt reports the true step (Adam's restored count), not a count from 1.
    later = [e for e in steps if e.ts_ns > applied.ts_ns]
    assert min(e.get_int("step") or 0 for e in later) > 10, [e.get_int("step") for e in later[:5]]
    # The first detection is torch's own word, read from the output: rank 0 lost its peer.
    first = next(e for e in result.history.of("detect.*") if e.ts_ns > applied.ts_ns)
    assert first.data.get("signature") in ("peer_lost", "torchrun_worker_failed"), first


def readme_snippet() -> dict[str, Any]:
    """The scenario README.md shows under "Your own training script" (its first YAML block there)."""
    section = (ROOT / "README.md").read_text(encoding="utf-8").split("## Your own training script", 1)[1]
    found = re.search(r"```yaml\n(.*?)```", section, flags=re.S)
    assert found is not None, "README.md lost its 'Your own training script' example"
    snippet: dict[str, Any] = yaml.safe_load(found.group(1))
    return snippet


def test_a_frozen_rank_is_detected_at_the_jobs_own_timeout(e2e_report_root: Path, tmp_path: Path) -> None:
    # The README's example, run: its fault and checks, on the target it shows (this script as it is).
    snippet = readme_snippet()
    target = snippet["target"]
    assert (target["type"], target["nproc_per_node"], target["max_restarts"]) == ("torchrun", 2, 2), target
    assert target["args"] == ["--checkpoint-dir", "{run_dir}/ckpt"], target  # the test adds only steps and timeout
    [fault] = snippet["faults"]
    checks = snippet["checks"]
    assert fault["name"] == "freeze-rank1" and checks[0]["params"]["within"] == f"{PG_TIMEOUT + 1:g}s", snippet
    result = run(e2e_report_root, tmp_path, "unmodified-freeze", fault, checks)
    got = verdicts(result)
    assert all(status == "pass" for status, _ in got.values()), got
    # Detected by rank 0's gloo timeout (not before it: the freeze cannot be seen sooner without a watchdog).
    assert measured(result, "detected_within") >= PG_TIMEOUT - 0.5, got["detected_within"]
    [applied] = result.history.of("fault.applied")
    first = next(e for e in result.history.of("detect.*") if e.ts_ns > applied.ts_ns)
    assert (first.kind, first.rank, first.data.get("detector")) == ("detect.collective_timeout", 0, "gloo"), first


KILL_RANK1 = {"name": "kill-rank1", "type": "kill", "params": {"rank": 1}, "trigger": {"at_step": 20, "rank": 1}}


def test_with_the_one_attach_line_a_killed_rank_resumes_and_matches_golden(
    e2e_report_root: Path, tmp_path: Path
) -> None:
    checks = [
        *detected_and_recovered("kill-rank1", "5s", "60s"),
        {"type": "restarts_at_most", "params": {"restarts": 1}},
        {"type": "lost_work_at_most", "params": {"steps": 10}},
        {"type": "matches_golden"},
        {"type": "completes"},
    ]
    result = run(e2e_report_root, tmp_path, "one-line-kill", KILL_RANK1, checks, job=with_one_line(tmp_path))
    got = verdicts(result)
    assert all(status == "pass" for status, _ in got.values()), got
    steps = result.history.of("target.step")
    assert steps and not any(e.data.get("source") == "optimizer" for e in steps), "the step reporter did not stand down"
    digests = result.history.of("target.digest")
    assert {e.rank for e in digests} == {0, 1}, [e.data for e in digests]
    assert result.history.of("target.resume"), "the resumed attempt's first step was not reported as a resume"
