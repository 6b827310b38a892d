"""Clock faults end to end. ``scenarios/clock-jump-forward.yaml`` (rank 0's wall clock +1h for 3 s) passes on
``tests/jobs/user_heartbeat.py`` (its peer watchdog times heartbeats on the monotonic clock) and FAILS on the same
job with ``--watchdog-clock wall`` (it compares wall-clock stamps: rank 1 looks an hour silent, the watchdog
aborts the job): the same fault, the verdict decided by the job's code. Two runs, each shared by the assertions
on it. Then the harness is SIGKILLed while a clock fault holds: its dead-man removes the offset file after the
grace, and nothing of the run is left."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import yaml
from support import ROOT, mlchaos, pids_mentioning, read_jsonl, scenario_yaml, spawn_harness, ticker, wait_for

from chaos.run.orchestrator import RunOptions, execute
from chaos.run.result import EXIT_FAIL, EXIT_PASS, RunResult
from chaos.spec.scenario import load_scenario
from injectors.clock import shim

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not shim.library().is_file(), reason=f"the clock shim is not built ({shim.library()}): make setup"
    ),
]

SCENARIO = ROOT / "scenarios" / "clock-jump-forward.yaml"


@pytest.fixture(scope="module")
def monotonic_job(e2e_report_root: Path) -> RunResult:
    return execute(load_scenario(SCENARIO), RunOptions(report_root=e2e_report_root, scenario_file=SCENARIO))


@pytest.fixture(scope="module")
def wall_job(e2e_report_root: Path, tmp_path_factory: pytest.TempPathFactory) -> RunResult:
    spec = yaml.safe_load(SCENARIO.read_text())
    spec["name"] = "clock-jump-forward-wall-job"
    spec["target"]["script"] = str(ROOT / spec["target"]["script"])
    spec["target"]["args"] += ["--watchdog-clock", "wall"]
    source = tmp_path_factory.mktemp("clock") / "clock-jump-forward-wall.yaml"
    source.write_text(yaml.safe_dump(spec))
    return execute(load_scenario(source), RunOptions(report_root=e2e_report_root, scenario_file=source))


def _explain(result: RunResult) -> object:
    return result.error, result.ended_by, [(r.check, r.status, r.reason) for r in result.results]


def _applied_once_and_healed(result: RunResult) -> None:
    [applied] = result.history.of("fault.applied")
    [healed] = result.history.of("fault.healed")
    assert applied.data["injector"] == "clock" and applied.data["description"] == "wall clock of rank 0 +3600s"
    assert applied.get_int("seen_step") is not None and healed.ts_ns > applied.ts_ns
    assert not result.history.of("fault.failed")
    # Healed: the op's offset file is gone, and no other file is in force in the run's clock folder.
    assert not any(p for p in shim.folder_of(result.run_dir).iterdir() if not p.name.startswith(".")), result.run_dir
    # The jumped rank's own reports stay on the machine's clock (they would be an hour off otherwise).
    stamps = [event.ts_ns for event in result.history.events]
    assert max(stamps) - min(stamps) < 600 * 10**9


def test_a_watchdog_on_the_monotonic_clock_rides_a_forward_jump_out(monotonic_job: RunResult) -> None:
    result = monotonic_job
    assert result.exit_code == EXIT_PASS, _explain(result)
    assert {r.check: r.status for r in result.results} == {"completes": "pass", "restarts_at_most": "pass"}
    _applied_once_and_healed(result)
    # The job kept training through the jump: rank 0 reported steps while its clock was an hour ahead.
    [applied], [healed] = result.history.of("fault.applied"), result.history.of("fault.healed")
    during = {e.get_int("step") for e in result.history.of("target.step") if applied.ts_ns < e.ts_ns < healed.ts_ns}
    assert len(during) >= 3, during


def test_a_watchdog_on_the_wall_clock_kills_the_healthy_job(wall_job: RunResult) -> None:
    result = wall_job
    assert result.exit_code == EXIT_FAIL, _explain(result)
    assert {r.check: r.status for r in result.results}["completes"] == "fail", _explain(result)
    _applied_once_and_healed(result)
    log = (result.run_dir / "target.log").read_text()
    assert "watchdog: rank 1 silent for 3600s" in log, log[-2000:]
    [exited] = result.history.of("target.exit")
    assert exited.get_int("code") not in (0, None), exited.data


FAULT_S, GRACE_S = 4.0, 2.0


def test_the_dead_man_removes_the_offset_file_when_the_harness_is_killed(tmp_path: Path) -> None:
    """A command target printing its wall clock, the clock jumping +1h after 1 s: the harness is SIGKILLed once
    the job shows the jump; the job dies with it, and the dead-man removes the offset file at duration + grace."""
    env = {**os.environ, "MLCHAOS_STATE_DIR": str(tmp_path / "state")}
    marker = f"clock-job-{uuid.uuid4().hex[:8]}"
    jump = {"name": "jump", "type": "clock", "params": {"jump": "+1h"}, "trigger": {"after": "1s"}}
    target = ticker(600, say=f"print('tick', i, round(time.time()), '{marker}', flush=True)")
    scenario = tmp_path / "clock.yaml"
    scenario.write_text(
        scenario_yaml(
            "clock-harness-killed",
            1,
            target,
            faults=[{**jump, "duration": f"{FAULT_S}s"}],
            safety={"heal_grace": f"{GRACE_S}s", "max_duration": "120s"},
        )
    )
    reports = tmp_path / "reports"
    harness = spawn_harness("run", scenario, "--report-dir", reports, "--no-golden", env=env)
    try:

        def offset_files() -> list[Path]:
            return [p for p in reports.glob("*/clock/*") if not p.name.startswith(".")]

        def jumped() -> bool:  # the job printed a wall clock an hour past the harness's
            lines = [line.split() for log in reports.glob("*/target.log") for line in log.read_text().splitlines()]
            return any(len(w) == 4 and w[0] == "tick" and int(w[2]) - time.time() > 3000 for w in lines)

        assert wait_for(jumped, 60), "the job's wall clock never jumped"
        [offset] = offset_files()
        harness.send_signal(signal.SIGKILL)
        harness.wait(timeout=10)
        killed = time.monotonic()
        assert wait_for(lambda: not offset.exists(), FAULT_S + GRACE_S + 15), f"{offset} is still in force"
        assert time.monotonic() - killed < FAULT_S + GRACE_S + 15

        def journal() -> list[dict[str, object]]:
            return [r for j in (tmp_path / "state" / "journal").rglob("*.jsonl") for r in read_jsonl(j)]

        # The dead-man journals its heal just after its revert: wait for the record, never read it once.
        assert wait_for(lambda: any(r.get("by") == "deadman" for r in journal()), 10), journal()
        assert wait_for(lambda: pids_mentioning(marker) == [], 15), "the job outlived the harness"
        assert offset_files() == []
        cleanup = mlchaos("cleanup", env=env, timeout=60)
        assert cleanup.returncode == 0 and "nothing to heal" in cleanup.stdout, cleanup.stdout + cleanup.stderr
    finally:
        if harness.poll() is None:
            harness.kill()
        for pid in pids_mentioning(marker):
            subprocess.run(["kill", "-9", str(pid)], check=False)
