"""The Slurm client's pure parts: hostlists, ``scontrol -o`` lines, ``sacct --parsable2`` lines, the argv it
builds (through a recording transport) and the testbed's slurm.conf. Real Slurm: tests/integration/test_slurm_testbed.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.cluster.base import Completed
from chaos.slurm import JobNotFound, SlurmClient, SlurmError, expand_hostlist
from chaos.slurm.client import parse_accounting, parse_job, parse_node
from chaos.testbed.slurm_conf import ConfPaths, SlurmConfError, SlurmSettings, conf_text

# Real 22.05 output (trimmed), from the testbed.
JOB = (
    "JobId=7 JobName=train UserId=root(0) GroupId=root(0) JobState=COMPLETED Reason=None Dependency=(null) "
    "Requeue=1 Restarts=2 BatchFlag=1 Reboot=0 ExitCode=0:0 SubmitTime=2026-11-24T22:01:42 "
    "StartTime=2026-11-24T22:01:43 EndTime=Unknown AllocNode:Sid=localhost:20925 NodeList=h[1-2] BatchHost=h1 "
    "CPUs/Task=1 Command=/tmp/a b/job.sh WorkDir=/tmp/a b StdOut=/tmp/a b/out-7.txt Power= "
)
NODE = (
    "NodeName=h2 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 NodeAddr=10.213.162.12 NodeHostName=h2 "
    "State=IDLE+DRAIN ThreadsPerCore=1 Partitions=chaos  AllocTRES= CapWatts=n/a "
    "Reason=chaos test: x=1 y [root@2026-11-24T22:02:00]"
)


def test_hostlists_expand_like_slurm() -> None:
    assert expand_hostlist("h[1-3,5]") == ["h1", "h2", "h3", "h5"]
    assert expand_hostlist("gpu[08-10],login") == ["gpu08", "gpu09", "gpu10", "login"]
    assert expand_hostlist("r[1-2]n[1-2]") == ["r1n1", "r1n2", "r2n1", "r2n2"]
    assert expand_hostlist("h1") == ["h1"]
    assert expand_hostlist("(null)") == [] and expand_hostlist("None assigned") == [] and expand_hostlist("") == []
    with pytest.raises(ValueError, match="unbalanced"):
        expand_hostlist("h[1-2")


def test_job_line_parses_with_spaces_in_paths() -> None:
    job = parse_job(JOB)
    assert (job.job_id, job.name, job.state, job.nodes, job.batch_host) == (7, "train", "COMPLETED", ("h1", "h2"), "h1")
    assert (job.exit_code, job.exit_signal, job.restarts, job.requeue) == (0, 0, 2, True)
    assert job.end_time is None and job.start_time is not None and job.start_time.second == 43
    assert job.fields["WorkDir"] == "/tmp/a b" and job.fields["CPUs/Task"] == "1"


def test_node_line_keeps_a_reason_with_spaces_and_equals() -> None:
    node = parse_node(NODE)
    assert (node.name, node.address, node.state, node.flags) == ("h2", "10.213.162.12", "IDLE", frozenset({"DRAIN"}))
    assert node.reason == "chaos test: x=1 y"
    assert node.drained and node.responding and not node.available
    down = parse_node(
        "NodeName=h3 NodeAddr=10.0.0.3 State=DOWN*+DRAIN Reason=Not responding [slurm@2026-01-01T00:00:00]"
    )
    assert down.state == "DOWN" and down.flags == {"DRAIN", "NOT_RESPONDING"} and not down.responding
    assert down.reason == "Not responding"
    idle = parse_node("NodeName=h1 NodeAddr=10.0.0.1 State=IDLE")
    assert idle.available and idle.reason is None


def test_accounting_line() -> None:
    record = parse_accounting("7|train|CANCELLED by 0|0:15|h[1-2]|2026-11-24T22:01:42|2026-11-24T22:01:43|Unknown")
    assert (record.job_id, record.state, record.exit_code, record.exit_signal) == ("7", "CANCELLED", 0, 15)
    assert record.nodes == ("h1", "h2") and record.end_time is None
    with pytest.raises(SlurmError, match="fields"):
        parse_accounting("7|train")


class Recorder:
    """A transport that answers every command with one canned result and keeps the argv lists."""

    host = "login1"

    def __init__(self, code: int = 0, out: str = "", err: str = "") -> None:
        self.code, self.out, self.err = code, out, err
        self.calls: list[list[str]] = []

    def run(self, argv: list[str], *, timeout: float = 30.0, check: bool = False) -> Completed:
        self.calls.append(argv)
        return Completed(tuple(argv), self.code, self.out, self.err)


def test_commands_are_argv_lists_under_the_given_conf() -> None:
    rec = Recorder(out="42;chaos-tb-ab12\n")
    client = SlurmClient(rec, conf="/s/slurm.conf", completion_log=True)
    assert client.submit(Path("/j/x.sh"), nodes=2, ntasks_per_node=1, job_name="t", requeue=True) == 42
    assert rec.calls[-1] == [
        "env",
        "SLURM_CONF=/s/slurm.conf",
        "sbatch",
        "--parsable",
        "--nodes=2",
        "--ntasks-per-node=1",
        "--job-name=t",
        "--requeue",
        "/j/x.sh",
    ]
    client.drain("h1", "bad; rm -rf /")  # one argv word: nothing for a shell to see
    assert rec.calls[-1][-1] == "reason=bad; rm -rf /"
    rec.out = ""
    client.accounting(42)
    assert rec.calls[-1][:5] == ["env", "SLURM_CONF=/s/slurm.conf", "sacct", "--completion", "--parsable2"]
    with pytest.raises(ValueError):
        client.drain("h1 h2", "x")
    with pytest.raises(ValueError):
        client.drain("h1", "two\nlines")
    with pytest.raises(ValueError, match="not an option"):
        client.submit("/j/x.sh", extra=["/other.sh"])
    plain = SlurmClient(Recorder(out="NodeName=h1 State=IDLE\n"))
    assert plain.nodes()[0].name == "h1"


def test_errors_quote_slurm_and_name_unknown_jobs() -> None:
    missing = SlurmClient(Recorder(1, err="slurm_load_jobs error: Invalid job id specified\n"))
    with pytest.raises(JobNotFound, match="Invalid job id"):
        missing.job(99)
    down = SlurmClient(
        Recorder(1, err="sbatch: error: Batch job submission failed: Unable to contact slurm controller")
    )
    with pytest.raises(SlurmError, match="Unable to contact slurm controller") as caught:
        down.submit("/j/x.sh")
    assert caught.value.returncode == 1 and caught.value.argv[0] == "sbatch"
    absent = SlurmClient(Recorder(127, err="env: 'sbatch': No such file or directory"), conf="/c")
    with pytest.raises(SlurmError, match="not installed on login1"):
        absent.submit("/j/x.sh")
    garbled = SlurmClient(Recorder(0, out="Submitted batch job\n"))
    with pytest.raises(SlurmError, match="no job id"):
        garbled.submit("/j/x.sh")


def _paths(root: Path) -> ConfPaths:
    return ConfPaths(
        root / "munge.socket", root / "ctld", root / "ctld.pid", root / "ctld.log", root / "slurmd", root / "jc.log"
    )


def _one_node_conf(state_dir: Path) -> str:
    """slurm.conf of a one-node cluster with the default settings, its state under ``state_dir``."""
    return conf_text(
        cluster="c",
        controller_host="c",
        controller_address="1.1.1.1",
        controller_port=1,
        nodes=[("h1", "x")],
        paths=_paths(state_dir),
        settings=SlurmSettings(),
    )


def test_conf_has_the_hooks_and_refuses_what_slurm_conf_cannot_hold() -> None:
    settings = SlurmSettings(
        health_check_program=Path("/opt/hc.sh"), health_check_interval=30, requeue_exit=(75, 99), cpus=2
    )
    text = conf_text(
        cluster="chaos-tb-ab12",
        controller_host="chaos-tb-ab12-ctld",
        controller_address="10.213.1.1",
        controller_port=16817,
        nodes=[("h1", "10.213.1.11"), ("h2", "10.213.1.12")],
        paths=_paths(Path("/var/tb/chaos-tb-slurm")),
        settings=settings,
    )
    lines = set(text.splitlines())
    for expected in (
        "ClusterName=chaos-tb-ab12",
        "SlurmctldHost=chaos-tb-ab12-ctld(10.213.1.1)",
        "HealthCheckProgram=/opt/hc.sh",
        "HealthCheckInterval=30",
        "RequeueExit=75,99",
        "ReturnToService=2",
        "ProctrackType=proctrack/linuxproc",
        "JobCompType=jobcomp/filetxt",
        "SlurmdSpoolDir=/var/tb/chaos-tb-slurm/slurmd/%n",
        "NodeName=h2 NodeHostname=h2 NodeAddr=10.213.1.12 CPUs=2 State=UNKNOWN",
        "PartitionName=chaos Nodes=h1,h2 Default=YES MaxTime=INFINITE State=UP",
    ):
        assert expected in lines, expected
    assert "HealthCheckProgram" not in _one_node_conf(Path("/v"))
    for bad in (
        SlurmSettings(health_check_program=Path("relative.sh")),
        SlurmSettings(health_check_program=Path("/a b/hc.sh")),
        SlurmSettings(requeue_exit=(0,)),
        SlurmSettings(slurmd_timeout=1),
    ):
        with pytest.raises(SlurmConfError):
            bad.check()
    with pytest.raises(SlurmConfError, match="state dir"):
        _one_node_conf(Path("/tmp/with space"))


def test_a_state_dir_too_long_for_a_job_steps_socket_is_refused_with_the_length_to_use() -> None:
    """slurmstepd's socket is <spool>/<node>/<node>_<job>.<step>: past 107 characters every job is requeued
    and held, so ``up`` refuses the state dir first and says how long it may be."""
    from chaos.testbed.slurm import _check_socket_paths
    from chaos.testbed.slurm_daemons import SlurmLayout
    from chaos.testbed.system import TestbedError

    _check_socket_paths(SlurmLayout(Path("/tmp/tb") / "chaos-tb-slurm", "ab12", "chaos-tb"), 3)
    long_dir = Path("/tmp/pytest-of-root/pytest-53/popen-gw0/test_down_stops_daemons_and_ru0/tb")
    with pytest.raises(TestbedError, match=r"h3_67108863\.4294967291 is 1\d\d characters.* at most (\d+) char"):
        _check_socket_paths(SlurmLayout(long_dir / "chaos-tb-slurm", "ab12", "chaos-tb"), 3)
