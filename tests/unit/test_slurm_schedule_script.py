"""The self-resubmitting Slurm batch script of ``mlchaos suite schedule --slurm``, executed by bash with a fake
``sbatch`` that records what it was asked (the real-Slurm run is tests/integration/test_slurm_schedule.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from chaos.cli.commands import app
from chaos.suite.slurm_schedule import SlurmSchedule, script_text, write_script


def _schedule(tmp_path: Path, **kw: object) -> SlurmSchedule:
    base: dict[str, object] = {
        "suite": tmp_path / "my suite",  # a space: every value must reach its program as one word
        "script": tmp_path / "s.sbatch",
        "every_s": 90.0,
        "workdir": tmp_path,
        "suite_args": ("--report-dir", str(tmp_path / "rep")),
        "mlchaos": (str(tmp_path / "fake-mlchaos"),),
    }
    return SlurmSchedule(**(base | kw))  # type: ignore[arg-type]


def _run(tmp_path: Path, schedule: SlurmSchedule, env_left: str | None) -> tuple[list[str], list[str]]:
    """Run the script once; (sbatch calls, mlchaos argv) as the fakes recorded them."""
    calls, ran = tmp_path / "sbatch.log", tmp_path / "mlchaos.log"
    for path in (calls, ran):
        path.unlink(missing_ok=True)
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir(exist_ok=True)
    (fake_bin / "sbatch").write_text(f'#!/bin/bash\nprintf "%s|" "$@" >> {calls}\necho >> {calls}\necho 42\n')
    (tmp_path / "fake-mlchaos").write_text(f'#!/bin/bash\nprintf "%s\\n" "$@" > {ran}\n')
    for exe in (fake_bin / "sbatch", tmp_path / "fake-mlchaos"):
        exe.chmod(0o755)
    write_script(schedule)
    env = {k: v for k, v in os.environ.items() if k != "MLCHAOS_RUNS_LEFT"}
    env["PATH"] = f"{fake_bin}:{env['PATH']}"
    if env_left is not None:
        env["MLCHAOS_RUNS_LEFT"] = env_left
    subprocess.run(["bash", str(schedule.script)], env=env, check=True, capture_output=True, timeout=30)
    submitted = calls.read_text().splitlines() if calls.exists() else []
    return submitted, ran.read_text().splitlines()


def test_each_run_submits_the_next_with_the_interval_then_runs_the_suite(tmp_path: Path) -> None:
    schedule = _schedule(tmp_path)
    submitted, ran = _run(tmp_path, schedule, None)
    assert submitted == [f"--parsable|--begin=now+90|--export=ALL,MLCHAOS_RUNS_LEFT=|{schedule.script}|"]
    assert ran == ["suite", "run", str(tmp_path / "my suite"), "--report-dir", str(tmp_path / "rep")]


def test_a_bounded_schedule_counts_down_and_the_last_run_submits_nothing(tmp_path: Path) -> None:
    schedule = _schedule(tmp_path, runs=3)
    first, _ = _run(tmp_path, schedule, None)
    assert "--export=ALL,MLCHAOS_RUNS_LEFT=2" in first[0]
    second, _ = _run(tmp_path, schedule, "2")
    assert "--export=ALL,MLCHAOS_RUNS_LEFT=1" in second[0]
    last, ran = _run(tmp_path, schedule, "1")
    assert last == [] and ran[:2] == ["suite", "run"]  # the last run still runs the suite


def test_header_keeps_runs_apart_and_names_the_job(tmp_path: Path) -> None:
    text = script_text(_schedule(tmp_path, job_name="nightly", partition="debug", slurm_conf=tmp_path / "s.conf"))
    for line in ("#SBATCH --job-name=nightly", "#SBATCH --dependency=singleton", "#SBATCH --partition=debug"):
        assert line in text
    assert f"export SLURM_CONF={tmp_path}/s.conf" in text


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"every_s": 0.5}, "at least 1 second"),
        ({"job_name": "bad name"}, "job name"),
        ({"runs": 0}, "runs must be"),
        ({"suite": Path("relative")}, "absolute"),
        ({"output": Path("/tmp/a b/%j.out")}, "whitespace"),
    ],
)
def test_bad_settings_are_refused(tmp_path: Path, change: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        script_text(_schedule(tmp_path, **change))


def test_cli_writes_the_script_and_refuses_without_slurm(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    script = tmp_path / "n.sbatch"
    cli = CliRunner()
    result = cli.invoke(app, ["suite", "schedule", str(suite), "--slurm", "--every", "6h", "--script", str(script)])
    assert result.exit_code == 0, result.output
    assert "--begin=now+21600" in script.read_text() and os.access(script, os.X_OK)
    refused = cli.invoke(app, ["suite", "schedule", str(suite), "--script", str(script)])
    assert refused.exit_code == 2 and "docs/scheduling.md" in refused.output
    missing = cli.invoke(app, ["suite", "schedule", str(tmp_path / "nope"), "--slurm"])
    assert missing.exit_code == 2 and "no such suite" in missing.output
