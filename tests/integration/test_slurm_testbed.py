"""A real Slurm cluster on the namespace testbed: munged and slurmctld here, one slurmd per host namespace,
driven through the typed client (``sbatch``, ``scontrol``, ``squeue``, ``sacct``) the way a scenario will.

Skips (with the reason) where it cannot be built: not root, no ``ip netns``/sshd, Slurm or munge not
installed (``bash scripts/setup.sh`` as root installs them). About 15 s here.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import live_processes, standing, wait_for
from typer.testing import CliRunner

from chaos.cli.commands import app
from chaos.slurm import Job, SlurmClient
from chaos.testbed import slurm as slurm_testbed
from chaos.testbed.slurm import SlurmTestbed

pytestmark = pytest.mark.slow

_FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL", "TIMEOUT", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}


def _leftovers(state: Path, marker: str = "") -> list[str]:
    """Our Slurm daemons (their command lines name the state dir), step daemons and marked job processes."""
    found = []
    for proc in live_processes():
        daemon = proc.comm.removesuffix("-wlm") in ("munged", "slurmctld", "slurmd")
        ours = daemon and str(state.resolve()).encode() in proc.cmdline
        marked = bool(marker) and marker.encode() in proc.cmdline
        if ours or marked:
            found.append(f"{proc.pid} {proc.comm} {proc.cmdline[:120]!r}")
    return found


def _cli(*args: str) -> str:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def _wait_finished(client: SlurmClient, job_id: int, timeout: float = 60.0) -> Job:
    deadline = time.monotonic() + timeout
    while True:
        job = client.job(job_id)
        if job.state in _FINISHED or time.monotonic() > deadline:
            return job
        time.sleep(0.2)


def _up(state: Path) -> Path:
    _cli("testbed", "up", "--slurm", "--hosts", "3", "--requeue-exit", "75", "--state-dir", str(state))
    return state


@pytest.fixture(scope="module")
def slurm_state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    state = tmp_path_factory.mktemp("slurm-tb")
    down = ["testbed", "down", "--state-dir", str(state)]
    yield from standing(slurm_testbed.unsupported_reason(), lambda: _up(state), lambda: CliRunner().invoke(app, down))
    assert _leftovers(state) == []
    assert not (state / slurm_testbed.SLURM_DIR).exists()


@pytest.fixture(scope="module")
def cluster(slurm_state: Path) -> SlurmTestbed:
    return slurm_testbed.attach(slurm_state)


def test_three_nodes_idle_at_their_host_addresses(cluster: SlurmTestbed) -> None:
    nodes = cluster.client().nodes()
    assert [node.name for node in nodes] == ["h1", "h2", "h3"]
    addresses = {host.name: host.address for host in cluster.inventory.hosts}
    for node in nodes:
        assert node.state == "IDLE" and node.available, node
        assert node.address == addresses[node.name]
    assert cluster.inventory.hosts[0].labels["slurm_node"] == "h1"
    assert cluster.cluster.startswith("chaos-tb-")


def test_each_slurmd_runs_inside_its_hosts_namespace(slurm_state: Path, cluster: SlurmTestbed) -> None:
    status = slurm_testbed.status(slurm_state)
    assert status is not None and status.healthy, status
    for host in cluster.inventory.hosts:
        ns = os.stat(f"/run/netns/{host.labels['netns']}").st_ino
        assert [os.stat(f"/proc/{pid}/ns/net").st_ino for pid in status.slurmd[host.name]] == [ns], host.name
    # The controller and munged stay in the root namespace.
    root = os.stat("/proc/self/ns/net").st_ino
    assert {os.stat(f"/proc/{pid}/ns/net").st_ino for pid in status.slurmctld + status.munged} == {root}


def test_two_node_job_runs_srun_on_its_allocation_and_is_accounted(cluster: SlurmTestbed, tmp_path: Path) -> None:
    script = tmp_path / "hello.sh"
    script.write_text(
        "#!/bin/bash\nsrun hostname\n"
        'srun python3 -c \'import os; print("rank", os.environ["SLURM_PROCID"], os.environ["SLURMD_NODENAME"])\'\n'
        "srun getent hosts h1 h2 h3\n"  # jobs find their peers by name, as users' scripts do
    )
    client = cluster.client()
    job_id = client.submit(
        script, nodes=2, ntasks_per_node=1, job_name="chaos-hello", output=tmp_path / "out-%j.txt", chdir=tmp_path
    )
    job = _wait_finished(client, job_id)
    assert job.state == "COMPLETED" and job.exit_code == 0, job
    assert len(job.nodes) == 2 and set(job.nodes) <= set(cluster.nodes)
    assert job.batch_host == job.nodes[0]
    # The tasks really ran on the allocated nodes: each printed its host's own hostname (its UTS namespace).
    lines = (tmp_path / f"out-{job_id}.txt").read_text().split("\n")
    assert sorted(line for line in lines if line.startswith("h")) == sorted(job.nodes)
    ranks = sorted(line.split()[1:] for line in lines if line.startswith("rank"))
    assert ranks == [["0", job.nodes[0]], ["1", job.nodes[1]]]
    if Path("/etc/netns", cluster.inventory.hosts[0].labels["netns"], "hosts").exists():
        resolved = {tuple(line.split()) for line in lines if line.startswith("10.")}
        assert resolved == {(host.address, host.name) for host in cluster.inventory.hosts}, lines
    assert any(entry.job_id == job_id and entry.state == "COMPLETED" for entry in client.queue())
    records = client.accounting(job_id)
    assert [(r.job_id, r.state, r.nodes, r.exit_code) for r in records] == [(str(job_id), "COMPLETED", job.nodes, 0)]
    assert f"JobId={job_id} " in cluster.jobcomp_log.read_text()


def test_a_drained_node_takes_no_job_until_resumed(cluster: SlurmTestbed, tmp_path: Path) -> None:
    client = cluster.client()
    reason = "chaos test: gpu xid=79 seen"
    client.drain("h3", reason)
    try:
        node = client.node("h3")
        assert node.drained and node.reason == reason, node
        assert not node.available
        script = tmp_path / "all.sh"
        script.write_text("#!/bin/bash\nsrun true\n")
        job_id = client.submit(script, nodes=3, output=tmp_path / "all-%j.txt")
        time.sleep(2)  # several scheduling passes: a 3-node job cannot start while one node is drained
        pending = client.job(job_id)
        assert pending.state == "PENDING" and pending.nodes == (), pending
    finally:
        client.resume("h3")
    assert wait_for(lambda: client.node("h3").available, timeout=20), client.node("h3")
    job = _wait_finished(client, job_id)
    assert job.state == "COMPLETED" and set(job.nodes) == {"h1", "h2", "h3"}, job


def test_requeue_exit_requeues_under_the_same_id_and_sacct_has_every_attempt(
    cluster: SlurmTestbed, tmp_path: Path
) -> None:
    flag = tmp_path / "attempted"
    script = tmp_path / "requeue.sh"
    script.write_text(
        f'#!/bin/bash\nif [ ! -e {flag} ]; then touch {flag}; exit 75; fi\necho "attempt $SLURM_RESTART_COUNT"\n'
    )
    client = cluster.client()
    job_id = client.submit(script, nodes=1, requeue=True, output=tmp_path / "rq-%j.txt")
    job = _wait_finished(client, job_id, timeout=90)  # the requeue delay is 10 s, then a scheduling pass
    assert job.state == "COMPLETED" and job.restarts == 1, job
    assert (tmp_path / f"rq-{job_id}.txt").read_text().strip() == "attempt 1"
    attempts = [(r.job_id, r.state, r.exit_code) for r in client.accounting(job_id)]
    assert attempts == [(str(job_id), "FAILED", 75), (str(job_id), "COMPLETED", 0)]


def test_up_again_reuses_the_running_cluster(slurm_state: Path, cluster: SlurmTestbed) -> None:
    before = slurm_testbed.status(slurm_state)
    again = slurm_testbed.up(3, slurm_state, settings=slurm_testbed.SlurmSettings(requeue_exit=(75,)))
    assert again.controller == cluster.controller and again.conf == cluster.conf
    assert slurm_testbed.status(slurm_state) == before
    refused = CliRunner().invoke(app, ["testbed", "up", "--slurm", "--docker", "--state-dir", str(slurm_state)])
    assert refused.exit_code == 1 and "not supported with --docker" in refused.output


def test_down_stops_daemons_and_running_jobs_and_removes_files(
    cluster: SlurmTestbed, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A second, one-host Slurm testbed beside the first; torn down while a job runs on it."""
    tmp_path = tmp_path_factory.mktemp("tb2")  # short: a job step's socket path must fit 107 characters
    state = tmp_path / "tb"
    marker = f"chaos-slurm-job-{uuid.uuid4().hex[:8]}"
    try:
        one = slurm_testbed.up(1, state)
        assert one.controller != cluster.controller and one.cluster != cluster.cluster
        script = tmp_path / "long.sh"
        script.write_text(f"#!/bin/bash\nsrun python3 -c 'import time; time.sleep(300)' {marker}\n")
        client = one.client()
        job_id = client.submit(script, nodes=1, output=tmp_path / "long-%j.txt")
        assert wait_for(lambda: client.job(job_id).state == "RUNNING", timeout=90)
        assert wait_for(lambda: _leftovers(state, marker) != [], timeout=90)  # the job's task is running
    finally:
        out = _cli("testbed", "down", "--state-dir", str(state))
    assert "stopped" in out and "removed" in out
    assert _leftovers(state, marker) == []
    assert not state.exists() or list(state.iterdir()) == []
    # The first cluster never noticed.
    assert all(node.available for node in cluster.client().nodes())
