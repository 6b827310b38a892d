"""`completes` on real runs of a real process: the harness stopping the job at max_duration, the job failing by
itself, and a kill fault killing it are three different reasons."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import yaml

from chaos.checks.base import CheckResult
from chaos.run.orchestrator import RunOptions, execute
from chaos.run.result import EXIT_FAIL, RunResult
from chaos.spec.scenario import parse_scenario


def _run(
    tmp_path: Path, code: str, faults: list[tuple[dict[str, object], dict[str, object]]], max_duration: str = "60s"
) -> RunResult:
    """Run ``code`` as a command target with ``faults`` ((fault, params) pairs: the params select the job)."""
    marker = f"mlchaos-completes-{uuid.uuid4().hex[:8]}"  # in the job's argv: what a kill fault selects
    scenario = {
        "name": "completes-real",
        "target": {"type": "command", "command": [sys.executable, "-c", code, marker]},
        "faults": [{**fault, "params": {"name": marker, **params}} for fault, params in faults],
        "checks": [{"type": "completes"}],
        "safety": {"max_duration": max_duration, "no_progress_timeout": None},
    }
    return execute(parse_scenario(yaml.safe_dump(scenario)), RunOptions(report_root=tmp_path, golden=False))


def _completes(result: RunResult) -> CheckResult:
    [check] = [r for r in result.results if r.check == "completes"]
    return check


def test_the_harness_stopping_a_job_at_max_duration_is_reported_as_such(tmp_path: Path) -> None:
    result = _run(tmp_path, "import time; time.sleep(60)", [], max_duration="1s")
    check = _completes(result)
    assert result.exit_code == EXIT_FAIL and check.status == "fail" and check.measured is None
    assert check.reason.startswith("the harness stopped the job (max_duration 1s reached) before it finished"), check
    kinds = [e.kind for e in result.history.events]
    assert kinds.index("runner.stop") < kinds.index("target.exit")


def test_a_job_failing_by_itself_is_not_blamed_on_the_harness(tmp_path: Path) -> None:
    result = _run(tmp_path, "import sys; sys.exit(3)", [])
    check = _completes(result)
    assert check.status == "fail" and check.measured == 3.0
    assert check.reason == "the job itself failed with code 3, with no fault applied before it"
    assert not result.history.of("runner.stop"), "the job had exited: the harness stopped nothing"


def test_a_job_killed_by_a_kill_fault_names_the_fault(tmp_path: Path) -> None:
    kill: dict[str, object] = {"name": "kill-job", "type": "kill", "trigger": {"after": "0.5s"}}
    result = _run(tmp_path, "import time; time.sleep(60)", [(kill, {"signal": "SIGKILL"})])
    check = _completes(result)
    assert check.status == "fail" and check.measured == -9.0, check
    assert check.reason.startswith("the job was killed by fault 'kill-job': it died of SIGKILL (code -9)"), check


def test_a_name_selector_of_a_command_target_hits_its_job_never_a_stranger(tmp_path: Path) -> None:
    marker = f"mlchaos-scope-{uuid.uuid4().hex[:8]}"
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", marker])  # same argv, not ours
    try:
        scenario = {
            "name": "scoped",
            "target": {"type": "command", "command": [sys.executable, "-c", "import time; time.sleep(60)", marker]},
            "faults": [{"name": "kill-job", "type": "kill", "params": {"name": marker}, "trigger": {"after": "0.5s"}}],
            "checks": [{"type": "completes"}],
            "safety": {"max_duration": "60s", "no_progress_timeout": None},
        }
        result = execute(parse_scenario(yaml.safe_dump(scenario)), RunOptions(report_root=tmp_path, golden=False))
        [applied] = result.history.of("fault.applied")
        assert "target's" in (applied.get_str("description") or ""), applied
        assert _completes(result).measured == -9.0  # the job died of the kill ...
        assert stranger.poll() is None, "the kill hit a process outside the target"  # ... the stranger did not
    finally:
        stranger.kill()
        stranger.wait()
