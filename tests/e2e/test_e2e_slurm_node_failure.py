"""The Slurm node-failure run: ``scenarios/slurm-node-failure.yaml`` on a real 3-node Slurm testbed (slurmctld,
one slurmd per host, munge), with mlchaos's health check (every 5 s) and RequeueExit=75.

A node of the running 2-node training job (h2) loses its GPU (``gpu_xid`` 79, the driver's kernel-log line
emulated) and its rank dies with it; the job asks for its requeue. The health check drains h2; the job is
requeued under the same id, resumes from its checkpoint on h1 + h3 (the spare), and matches the golden run.

The same scenario with the health check OFF must fail: h2 comes back IDLE, the requeued job lands on it again,
and ``no_repeat_failure_on_bad_node`` and ``node_drained_within`` fail.

Everything the module starts is torn down at its end (the testbed's ``down`` stops every Slurm daemon and job
step it made); the test asserts none is left. Skipped, with the reason, where the testbed cannot be built (not
root, no netns/sshd) or the Slurm packages are missing.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import ROOT, Runs, verdicts

from chaos.cli.testbed import builtin_health_check
from chaos.run.orchestrator import RunOptions, execute
from chaos.spec.scenario import load_scenario
from chaos.testbed import namespaces as tb
from chaos.testbed import slurm as slurm_testbed
from chaos.testbed.slurm_conf import SlurmSettings

pytestmark = pytest.mark.slow

SCENARIO = ROOT / "scenarios" / "slurm-node-failure.yaml"
REQUEUE_EXIT = 75


def _unsupported() -> str | None:
    return tb.unsupported_reason() or slurm_testbed.unsupported_reason()


def _resume_all(state: Path) -> None:
    conf = state / "chaos-tb-slurm" / "slurm.conf"
    subprocess.run(
        ["scontrol", "update", "nodename=h[1-3]", "state=resume"],
        env={"SLURM_CONF": str(conf), "PATH": "/usr/bin:/bin:/usr/sbin:/sbin"},
        capture_output=True,
        check=False,
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    reason = _unsupported()
    if reason is not None:
        pytest.skip(reason)
    state = tmp_path_factory.mktemp("slurm-tb")
    reports = tmp_path_factory.mktemp("reports")  # one report root: the golden run is computed once
    out: Runs = {}
    try:
        program = builtin_health_check(state)
        for name, settings in (
            (
                "health_check",
                SlurmSettings(health_check_program=program, health_check_interval=5, requeue_exit=(REQUEUE_EXIT,)),
            ),
            ("no_health_check", SlurmSettings(requeue_exit=(REQUEUE_EXIT,))),
        ):
            slurm_testbed.up(3, state, settings=settings)
            _resume_all(state)  # every run starts on a whole cluster
            options = RunOptions(report_root=reports, scenario_file=SCENARIO, inventory=tb.Layout.of(state).inventory)
            out[name] = execute(load_scenario(SCENARIO), options)
        yield out
    finally:
        slurm_testbed.down(state)
        tb.down(state)
        left = subprocess.run(["pgrep", "-af", str(state)], capture_output=True, text=True).stdout
        assert not left.strip(), f"left running after down: {left}"


def test_the_health_check_drains_the_bad_node_and_the_requeued_job_resumes_elsewhere(runs: Runs) -> None:
    result = runs["health_check"]
    got = verdicts(result)
    history = result.history
    drained = [
        e for e in history.of("slurm.node") if e.get_str("node") == "h2" and "DRAIN" in (e.get_str("state") or "")
    ]
    assert drained and (drained[0].get_str("reason") or "").startswith("mlchaos-hc: xid 79"), [e.data for e in drained]
    attempts = [e for e in history.of("slurm.job") if e.get_str("state") == "RUNNING"]
    assert [sorted(e.data["nodes"]) for e in attempts][:1] == [["h1", "h2"]], [e.data for e in attempts]
    later = [e for e in attempts if (e.get_int("restarts") or 0) >= 1]
    assert later and all("h2" not in e.data["nodes"] for e in later), [e.data for e in later]
    assert {e.get_int("job_id") for e in history.of("slurm.job")} == {attempts[0].get_int("job_id")}  # same id
    for check in ("node_drained_within", "requeued_within", "no_repeat_failure_on_bad_node", "matches_golden"):
        assert got[check][0] == "pass", (check, got[check])
    assert result.verdict == "pass", got
    # The sbatch script's torchrun wrote its files under the run dir (PET_LOG_DIR), not a new /tmp/torchelastic_*.
    assert list((result.run_dir / "torchelastic").glob("slurm-*")), list(result.run_dir.iterdir())


def test_with_the_health_check_off_the_requeued_job_lands_on_the_bad_node_and_the_scenario_fails(runs: Runs) -> None:
    got = verdicts(runs["no_health_check"])
    assert got["no_repeat_failure_on_bad_node"][0] == "fail", got
    assert got["node_drained_within"][0] == "fail", got
    assert runs["no_health_check"].verdict == "fail", got
