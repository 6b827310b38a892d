"""The ``slurm`` target and the Slurm node faults on a real Slurm testbed (slurmctld, one slurmd per host).

Each test runs a scenario with ``mlchaos run`` against one shared 3-node testbed (``SlurmdTimeout=5``,
requeue delay 5 s): a 2-node job of a user-style batch script (``srun python3 slurm_steps.py``) completes with
its job/node events in the history; ``node_fail`` on an allocated node makes the controller mark it DOWN and
requeue the job (NODE_FAIL, same id, RUNNING again), and heal brings the node back; ``drain`` sets DRAIN with
its reason and heal resumes it; the ``slurm: allocated`` selector lands faults (a partition too) on a node
of the job. Skips with the reason where the testbed cannot be built (not root, Slurm not installed).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import ROOT, mlchaos, scenario_yaml, standing

from chaos.testbed import namespaces
from chaos.testbed import slurm as slurm_testbed
from chaos.testbed.slurm import SlurmTestbed
from chaos.testbed.slurm_conf import SlurmSettings

pytestmark = pytest.mark.slow

JOBS = ROOT / "tests" / "jobs"


@pytest.fixture(scope="module")
def testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmTestbed]:
    state = tmp_path_factory.mktemp("slurm-target")
    settings = SlurmSettings(slurmd_timeout=5, requeue_delay=5)
    yield from standing(
        slurm_testbed.unsupported_reason(),
        lambda: slurm_testbed.up(3, state, settings=settings),
        lambda: namespaces.down(state),
    )


def _run(
    testbed: SlurmTestbed,
    tmp_path: Path,
    name: str,
    steps: list[str],
    login: dict[str, str] | None = None,
    **sections: Any,
) -> list[dict[str, Any]]:
    """Run a scenario whose target is a 2-node job of ``slurm_steps.py STEPS`` (``login``: target fields that
    reach the cluster through a login node); the run's history (its run.json's check results are in the last
    element's ``checks``)."""
    target = {
        **(login or {}),
        "type": "slurm",
        "script": str(JOBS / "slurm_steps.sbatch"),
        "args": [str(JOBS / "slurm_steps.py"), *steps],
        "nodes": 2,
        "ntasks_per_node": 1,
        "partition": "chaos",
        "env": {"PYTHON": sys.executable},
        "poll_interval": 0.5,
    }
    safety = {"max_duration": 120, "no_progress_timeout": 90}
    text = scenario_yaml(name, 1, target, safety=safety, **sections)
    scenario = tmp_path / f"{name}.yaml"
    scenario.write_text(text)
    inventory = testbed.conf.parent.parent / "inventory.yaml"
    reports = tmp_path / "reports"
    done = mlchaos("run", scenario, "--inventory", inventory, "--report-dir", reports, timeout=240)
    runs = sorted(reports.glob(f"{name}*"))
    assert runs, done.stdout + done.stderr
    history = [json.loads(line) for line in (runs[-1] / "history.jsonl").read_text().splitlines() if line.strip()]
    checks = json.loads((runs[-1] / "run.json").read_text())["checks"]
    return [*history, {"kind": "checks", "checks": checks}]


def _of(history: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [event for event in history if event["kind"] == kind]


def test_two_node_job_completes_with_its_slurm_events(testbed: SlurmTestbed, tmp_path: Path) -> None:
    checks = [{"type": "completes"}]
    history = _run(testbed, tmp_path, "slurm-completes", ["--steps", "4", "--interval", "0.3"], checks=checks)
    jobs = [event["data"] for event in _of(history, "slurm.job")]
    states = [job["state"] for job in jobs]
    assert "RUNNING" in states and states[-1] == "COMPLETED", jobs
    running = next(job for job in jobs if job["state"] == "RUNNING")
    assert len(running["nodes"]) == 2 and set(running["nodes"]) <= set(testbed.nodes)
    assert {job["job_id"] for job in jobs} == {jobs[0]["job_id"]}
    nodes = {event["data"]["node"] for event in _of(history, "slurm.node")}
    assert nodes == set(testbed.nodes)  # the first observation of every node of the partition
    starts = _of(history, "target.start")
    assert {event["rank"]: event["data"]["host"] for event in starts} == dict(enumerate(running["nodes"]))
    exits = _of(history, "target.exit")
    assert exits[-1]["data"]["code"] == 0 and exits[-1]["data"]["state"] == "COMPLETED"
    assert [check["status"] for check in history[-1]["checks"]] == ["pass"], history[-1]


def test_node_fail_downs_the_node_requeues_the_job_and_heal_brings_it_back(
    testbed: SlurmTestbed, tmp_path: Path
) -> None:
    faults = [{"type": "node_fail", "params": {}, "trigger": {"after": 2}, "hosts": {"slurm": "allocated", "count": 1}}]
    steps = ["--steps", "400", "--interval", "0.3", "--steps-after-restart", "3"]
    history = _run(testbed, tmp_path, "slurm-node-fail", steps, faults=faults)
    applied = _of(history, "fault.applied")
    assert len(applied) == 1, _of(history, "fault.failed")
    victim = applied[0]["data"]["host"]
    jobs = [event["data"] for event in _of(history, "slurm.job")]
    first = next(job for job in jobs if job["state"] == "RUNNING")
    assert victim in first["nodes"]  # the selector picked a node of the allocation
    ended = [job for job in jobs if job["state"] == "NODE_FAIL"]
    assert ended and ended[0]["restarts"] == 0 and victim in ended[0]["nodes"], jobs
    assert any(job["state"] == "REQUEUED" and job["restarts"] == 1 for job in jobs), jobs
    again = [job for job in jobs if job["state"] == "RUNNING" and job["restarts"] == 1]
    assert again and again[0]["job_id"] == first["job_id"], jobs
    assert jobs[-1]["state"] == "COMPLETED" and jobs[-1]["restarts"] == 1
    down = [
        e["data"] for e in _of(history, "slurm.node") if e["data"]["node"] == victim and "DOWN" in e["data"]["state"]
    ]
    assert down and down[0]["reason"] == "Not responding", down
    assert _of(history, "fault.healed")
    node = testbed.client().node(victim)
    assert node.responding and not node.drained and node.state != "DOWN", node


def test_drain_sets_drain_with_the_reason_and_heal_resumes(testbed: SlurmTestbed, tmp_path: Path) -> None:
    controller = testbed.controller.split(":")[0]
    faults = [
        {
            "type": "drain",
            "params": {"reason": "mlchaos test drain"},
            "trigger": {"after": 2},
            "duration": 3,
            "hosts": {"slurm": "allocated", "count": 1},
        },
        {
            "type": "partition",
            "params": {"peers": [controller], "protocol": "icmp"},
            "trigger": {"after": 2},
            "duration": 2,
            "hosts": {"slurm": "allocated", "count": 1},
        },
    ]
    history = _run(testbed, tmp_path, "slurm-drain", ["--steps", "25", "--interval", "0.3"], faults=faults)
    applied = {event["data"]["fault"]: event["data"]["host"] for event in _of(history, "fault.applied")}
    assert set(applied) == {"drain-1", "partition-1"}, _of(history, "fault.failed")
    running = next(e["data"] for e in _of(history, "slurm.job") if e["data"]["state"] == "RUNNING")
    assert set(applied.values()) <= set(running["nodes"])
    victim = applied["drain-1"]
    seen = [e["data"] for e in _of(history, "slurm.node") if e["data"]["node"] == victim]
    drained = [n for n in seen if "DRAIN" in n["state"].split("+")]
    assert drained and drained[0]["reason"] == "mlchaos test drain", seen
    assert "DRAIN" not in seen[-1]["state"].split("+"), seen  # heal resumed it
    assert _of(history, "slurm.job")[-1]["data"]["state"] == "COMPLETED"  # a running job finishes on a drained node
    assert not testbed.client().node(victim).drained


def test_an_existing_cluster_is_driven_through_its_login_node_over_ssh(testbed: SlurmTestbed, tmp_path: Path) -> None:
    # The testbed's h1 plays an existing cluster's login node: sbatch, squeue, scontrol and sacct run THERE, over
    # real OpenSSH (paramiko), with the cluster's slurm.conf named by `conf:`; nothing runs Slurm commands here.
    history = _run(
        testbed,
        tmp_path,
        "slurm-login",
        ["--steps", "4", "--interval", "0.3"],
        checks=[{"type": "completes"}],
        login={"login": "h1", "conf": str(testbed.conf)},
    )
    [started] = _of(history, "runner.target_started")
    assert "login node h1" in started["data"]["target"], started
    states = [event["data"]["state"] for event in _of(history, "slurm.job")]
    assert "RUNNING" in states and states[-1] == "COMPLETED", states
    assert [check["status"] for check in history[-1]["checks"]] == ["pass"], history[-1]
