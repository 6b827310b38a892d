"""A suite as a recurring Slurm job, on the real Slurm testbed: ``mlchaos suite schedule --slurm --submit``
with ``--every 5s --runs 2`` runs a tiny suite twice, as two Slurm jobs (the first submitted its successor
with ``sbatch --begin=now+5``), each run recorded in the run history from the Slurm node, and then stops.

Skips (with the reason) where a Slurm testbed cannot be built (not root, Slurm or munge missing). ~40 s.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import scenario_yaml, standing, wait_for
from typer.testing import CliRunner

from chaos.cli.commands import app
from chaos.slurm.accounting import parse_jobcomp
from chaos.suite.store import RunStore
from chaos.testbed import slurm as slurm_testbed
from chaos.testbed.slurm import SlurmTestbed

pytestmark = pytest.mark.slow


def _up(state: Path) -> SlurmTestbed:
    result = CliRunner().invoke(app, ["testbed", "up", "--slurm", "--hosts", "1", "--state-dir", str(state)])
    assert result.exit_code == 0, result.output
    return slurm_testbed.attach(state)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmTestbed]:
    state = tmp_path_factory.mktemp("sched-tb")
    down = ["testbed", "down", "--state-dir", str(state)]
    yield from standing(slurm_testbed.unsupported_reason(), lambda: _up(state), lambda: CliRunner().invoke(app, down))
    assert not (state / slurm_testbed.SLURM_DIR).exists()


def test_scheduled_suite_runs_twice_as_slurm_jobs_and_is_recorded(cluster: SlurmTestbed, tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    target = {"type": "command", "command": [sys.executable, "-c", "print('trained')"]}
    safety = {"max_duration": "60s", "no_progress_timeout": None}
    (suite / "tiny.yaml").write_text(scenario_yaml("tiny", 1, target, checks=[{"type": "completes"}], safety=safety))
    history = tmp_path / "history.sqlite"
    name = f"mlchaos-sched-{cluster.cluster.removeprefix('chaos-tb-')}"
    client = cluster.client()
    args = ["suite", "schedule", str(suite), "--slurm", "--every", "5s", "--runs", "2", "--submit"]
    args += ["--job-name", name, "--script", str(tmp_path / "nightly.sbatch"), "--slurm-conf", str(cluster.conf)]
    args += [
        "--history",
        str(history),
        "--report-dir",
        str(tmp_path / "reports"),
        "--output",
        str(tmp_path / "job-%j.out"),
    ]
    try:
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        assert "submitted job" in result.output

        def recorded() -> int:
            if not history.exists():
                return 0
            store = RunStore.open(history)
            try:
                return len(store.runs(scenario="tiny"))
            finally:
                store.close()

        def jobs_done() -> list[str]:
            mine = [a for a in parse_jobcomp(cluster.jobcomp_log.read_text()) if _named(cluster, a.job_id, name)]
            return [a.state for a in mine]

        assert wait_for(lambda: recorded() >= 2 and len(jobs_done()) >= 2, timeout=150), (
            recorded(),
            jobs_done(),
            [p.read_text()[-2000:] for p in tmp_path.glob("job-*.out")],
        )
        time.sleep(8)  # a third run would have been submitted and begun by now
        store = RunStore.open(history)
        try:
            runs = store.runs(scenario="tiny")
        finally:
            store.close()
        assert [(r.verdict, r.host) for r in runs] == [("pass", "h1"), ("pass", "h1")]  # ran on the Slurm node
        assert runs[1].started_ts - runs[0].started_ts >= 4.0  # the successor waited for its --begin
        attempts = [a for a in parse_jobcomp(cluster.jobcomp_log.read_text()) if _named(cluster, a.job_id, name)]
        assert [a.state for a in attempts] == ["COMPLETED", "COMPLETED"]
        assert len({a.job_id for a in attempts}) == 2  # two jobs: each run submitted the next
        assert not [j for j in client.queue() if j.name == name and j.state in ("PENDING", "RUNNING")]
    finally:
        for job in client.queue():
            if job.name == name and job.state in ("PENDING", "RUNNING"):
                client.cancel(job.job_id)


def _named(cluster: SlurmTestbed, job_id: int, name: str) -> bool:
    return any(
        line.startswith(f"JobId={job_id} ") and f" Name={name} " in line
        for line in cluster.jobcomp_log.read_text().splitlines()
    )
