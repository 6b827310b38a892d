"""The node health check's probes, config and actions, without a Slurm (scontrol is a stand-in that records)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from chaos.slurm import healthcheck as hc
from chaos.slurm import healthcheck_probes as probes
from chaos.slurm.healthcheck_xid import NODE_FATAL, XIDS, scan, xid_line

XID79 = "Nov 24 10:11:12 h2 kernel: [ 8123.456789] " + xid_line(79, pid=4242)


def test_the_fatal_codes_are_the_seeds_reboot_and_reset_codes() -> None:
    assert NODE_FATAL == (79, 119, 145, 149)
    assert set(XIDS) == {31, 43, 79, 94, 119, 145, 149}


def test_scan_reads_syslog_dmesg_and_old_driver_forms_and_forgets_earlier_boots() -> None:
    text = "\n".join(
        [
            "Nov 24 09:00:00 h2 kernel: [  100.000000] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen",
            "Nov 24 09:30:00 h2 kernel: [    0.000000] Linux version 6.1.0-18-amd64",  # a reboot
            "[   50.000001] NVRM: Xid (PCI:0000:86:00): 43, pid=9, name=python3, channel 0x00000010",
            "[   51.000000] NVRM: Xid (0000:86:00): 119, pid='N/A', Timeout waiting for RPC from GSP",
            "[   52.000000] e1000e: eth0 NIC Link is Up",
        ]
    )
    found = scan(text)
    assert [(x.code, x.pci, x.lineno) for x in found] == [(43, "0000:86:00", 3), (119, "0000:86:00", 4)]
    # the kernel's uptime going backwards is a reboot too
    assert scan("[ 900.000000] " + xid_line(79) + "\n[ 3.000000] booted\n") == []


def test_xid_probe_fails_only_on_a_fatal_code(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("[ 1.000000] " + xid_line(94) + "\n[ 2.000000] " + xid_line(31) + "\n")
    assert probes.xid([log, tmp_path / "missing.log"], NODE_FATAL).ok
    log.write_text(log.read_text() + XID79 + "\n")
    finding = probes.xid([log], NODE_FATAL)
    assert not finding.ok and finding.detail.startswith("79 on PCI:0000:3b:00 (GPU has fallen off the bus.)")
    assert hc.drain_reason(finding).startswith("mlchaos-hc: xid 79 on PCI:0000:3b:00")


def test_storage_probe_passes_on_a_working_dir_and_fails_in_bounded_time_on_a_hung_one(tmp_path: Path) -> None:
    assert probes.storage(tmp_path, 5.0, "h1").ok
    assert list(tmp_path.iterdir()) == []  # the probe file is removed
    assert not probes.storage(tmp_path / "missing", 5.0, "h1").ok
    # A FIFO where the probe file goes: open() for writing blocks forever, as I/O on a stalled FUSE mount does.
    os.mkfifo(tmp_path / ".mlchaos-hc-h2")
    started = time.monotonic()
    finding = probes.storage(tmp_path, 1.0, "h2")
    assert not finding.ok and finding.detail == f"{tmp_path} did not answer within 1s"
    assert time.monotonic() - started < 10


def test_peers_from_slurm_conf_and_the_majority_rule() -> None:
    conf = "SlurmdPort=6999\nNodeName=DEFAULT CPUs=2\nNodeName=h1 NodeAddr=10.0.0.2 CPUs=2\n"
    conf += "NodeName=h[2-3] NodeAddr=10.0.0.[3-4] Port=7000\n# NodeName=h9\n"
    assert probes.peers_from_conf(conf, "h2") == [
        probes.Peer("h1", "10.0.0.2", 6999),
        probes.Peer("h3", "10.0.0.4", 7000),
    ]
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with socket.socket() as unused:
            unused.bind(("127.0.0.1", 0))
            closed = unused.getsockname()[1]  # bound, not listening: refused
            up, down = probes.Peer("a", "127.0.0.1", port), probes.Peer("b", "127.0.0.1", closed)
            assert probes.peers([up, down], 1.0, 0.5).ok  # the other side of a partition misses one peer
            cut_off = probes.peers([down, probes.Peer("c", "127.0.0.1", closed)], 1.0, 0.5)
            assert not cut_off.ok and cut_off.detail.startswith("2/2 unreachable: b(")
    assert probes.peers([], 1.0, 0.5).ok


def test_a_peer_that_starts_listening_a_moment_later_is_not_counted_unreachable() -> None:
    """slurmd runs the check as it starts; a peer started a moment later is asked again before it counts."""
    import threading

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]  # bound, not yet listening: refused at first
        late = threading.Timer(0.3, listener.listen)
        late.start()
        try:
            assert probes.peers([probes.Peer("late", "127.0.0.1", port)], 1.0, 1.0, retry_after=1.0).ok
        finally:
            late.cancel()
        with socket.socket() as unused:
            unused.bind(("127.0.0.1", 0))
            never = probes.Peer("never", "127.0.0.1", unused.getsockname()[1])
            assert not probes.peers([never], 1.0, 1.0, retry_after=0.2).ok


def test_memory_floor(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 8000000 kB\nMemAvailable: 204800 kB\n")
    assert probes.memory(200, meminfo).ok
    low = probes.memory(201, meminfo)
    assert not low.ok and low.detail == "200 MiB available (< 201)"


def test_cpu_quota_is_the_tightest_along_the_cgroup_path(tmp_path: Path) -> None:
    mount = probes.CpuMount(1, tmp_path, "/")
    job = tmp_path / "slurm" / "job7"
    job.mkdir(parents=True)
    for folder, quota in ((tmp_path, "-1"), (tmp_path / "slurm", "20000"), (job, "-1")):
        (folder / "cpu.cfs_quota_us").write_text(quota)
        (folder / "cpu.cfs_period_us").write_text("100000")
    assert probes.cgroup_dir(mount, "4:memory:/x\n1:cpu:/slurm/job7\n") == job
    assert probes.cpu_limit(mount, job) == (0.2, tmp_path / "slurm")
    v2 = probes.CpuMount(2, tmp_path, "/")
    (job / "cpu.max").write_text("50000 100000\n")
    assert probes.cpu_limit(v2, job) == (0.5, job)
    mountinfo = "30 25 0:26 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n"
    assert probes.cpu_mount(mountinfo) == probes.CpuMount(1, Path("/sys/fs/cgroup/cpu"), "/")


def test_cpu_probe_sees_a_throttled_job_process(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # This process plays a job process in a cgroup held to 0.1 CPU.
    (tmp_path / "cpu.cfs_quota_us").write_text("10000")
    (tmp_path / "cpu.cfs_period_us").write_text("100000")
    monkeypatch.setattr(probes, "cpu_mount", lambda text: probes.CpuMount(1, tmp_path, "/"))
    assert not probes.cpu(0.5).ok
    assert "limited to 0.1 CPU" in probes.cpu(0.5).detail
    assert probes.cpu(0.05).ok


class FakeScontrol(hc.Scontrol):
    def __init__(self, config: hc.HealthCheckConfig, state: str = "IDLE", reason: str | None = None) -> None:
        super().__init__(config, runner=self._fake)
        self.calls: list[list[str]] = []
        self.state, self.reason = state, reason

    def _fake(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        self.calls.append(argv[1:])
        if argv[1:3] == ["-o", "show"]:
            reason = f" Reason={self.reason} [root@2026-11-24T10:00:00]" if self.reason else ""
            line = f"NodeName=h2 Arch=x86_64 State={self.state}{reason} Partitions=chaos\n"
            return subprocess.CompletedProcess(argv, 0, line, "")
        return subprocess.CompletedProcess(argv, 0, "", "")


def _config(**changes: object) -> hc.HealthCheckConfig:
    return hc.HealthCheckConfig.model_validate({"node": "h2", "peers": None, "cpu": None, **changes})


FAIL = [probes.Finding("xid", False, "79 on PCI:0000:3b:00"), probes.Finding("storage", False, "x")]
PASS = [probes.Finding("xid", True, "none")]


def test_a_failing_node_drains_itself_once_and_never_overwrites_another_reason() -> None:
    config = _config()
    scontrol = FakeScontrol(config)
    assert hc.act(config, "h2", FAIL, scontrol) == "drained: mlchaos-hc: xid 79 on PCI:0000:3b:00"
    assert scontrol.calls[-1] == ["update", "nodename=h2", "state=drain", "reason=mlchaos-hc: xid 79 on PCI:0000:3b:00"]
    operator = FakeScontrol(config, "IDLE+DRAIN", "disk swap")
    assert hc.act(config, "h2", FAIL, operator) == "already drained (disk swap)"
    assert all(call[0] != "update" for call in operator.calls)


def test_a_passing_node_is_never_touched_and_resumed_only_when_configured() -> None:
    quiet = FakeScontrol(_config())
    assert hc.act(_config(), "h2", PASS, quiet) == "healthy" and quiet.calls == []
    mine = FakeScontrol(_config(resume=True), "IDLE+DRAIN", "mlchaos-hc: xid 79")
    assert hc.act(_config(resume=True), "h2", PASS, mine).startswith("resumed")
    assert mine.calls[-1] == ["update", "nodename=h2", "state=resume"]
    theirs = FakeScontrol(_config(resume=True), "IDLE+DRAIN", "disk swap")
    assert hc.act(_config(resume=True), "h2", PASS, theirs) == "healthy"
    assert all(call[0] != "update" for call in theirs.calls)


def test_scontrol_gets_path_and_slurm_conf_from_the_config() -> None:
    scontrol = hc.Scontrol(_config(slurm_conf="/etc/x/slurm.conf", path="/opt/slurm/bin"))
    assert scontrol.env == {"PATH": "/opt/slurm/bin", "SLURM_CONF": "/etc/x/slurm.conf"}


def test_config_is_strict_and_sections_can_be_turned_off(tmp_path: Path) -> None:
    path = tmp_path / "hc.yaml"
    path.write_text(yaml.safe_dump({"xid": None, "memory": {"min_available_mb": 1}, "peers": None, "cpu": None}))
    config = hc.load_config(path)
    assert config.xid is None and config.storage is None
    path.write_text("memory: {min_availble_mb: 1}\n")
    with pytest.raises(ValueError, match="min_availble_mb"):
        hc.load_config(path)


def test_the_written_program_runs_with_an_empty_environment(tmp_path: Path) -> None:
    """slurmd runs the program with only SLURMD_NODENAME and PWD: no PATH, no PYTHONPATH, no SLURM_CONF."""
    log, xid = tmp_path / "hc-{node}.log", tmp_path / "xid-{node}.log"
    settings = {"log": str(log), "xid": {"logs": [str(xid)]}, "peers": None, "cpu": None, "scontrol": "/bin/false"}
    config = tmp_path / "hc.yaml"
    config.write_text(yaml.safe_dump(settings))
    program = hc.write_program(tmp_path / "mlchaos-hc", config)
    assert program.read_text().startswith(f"#!{sys.executable}\n")
    done = subprocess.run([str(program)], env={"SLURMD_NODENAME": "h5", "PWD": "/"}, cwd="/", capture_output=True)
    assert done.returncode == 0, done.stderr
    assert " h5 healthy in " in (tmp_path / "hc-h5.log").read_text()
    (tmp_path / "xid-h5.log").write_text(XID79 + "\n")
    done = subprocess.run([str(program)], env={"SLURMD_NODENAME": "h5", "PWD": "/"}, cwd="/", capture_output=True)
    assert done.returncode == 2  # scontrol (here /bin/false) could not drain: said, not hidden
    assert "ERROR scontrol" in (tmp_path / "hc-h5.log").read_text().splitlines()[-1]
