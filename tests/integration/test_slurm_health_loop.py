"""The health-check loop of seed 000 on a real Slurm testbed: slurmd runs the shipped health check
(:mod:`chaos.slurm.healthcheck`) every few seconds on every node; a ``gpu_xid`` fault on one node (an XID
79 line in its kernel log, over SSH to that host) drains exactly that node with the health check's reason, the
others stay IDLE; heal removes exactly the line; the node stays drained unless ``resume: true``. A FUSE stall
(``storage`` hang) of one node's checkpoint directory drains that node too, and the check never hangs.

Skips (with the reason) without root, ip netns/sshd, Slurm/munge, or (for the stall) FUSE. About 90 s here.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import wait_for
from typer.testing import CliRunner

from chaos.cli.commands import app
from chaos.cluster.local import LocalTransport
from chaos.cluster.ssh import SshTransport
from chaos.plugins.injector import FaultOp, InjectionContext
from chaos.slurm import SlurmClient
from chaos.slurm.healthcheck import write_program
from chaos.testbed import slurm as slurm_testbed
from injectors.gpu_xid import GpuXidInjector, GpuXidParams
from injectors.storage import fuselayer
from injectors.storage.injector import StorageInjector, StorageParams

pytestmark = pytest.mark.slow

INTERVAL = 5  # HealthCheckInterval, seconds
DRAIN_BOUND = 2 * INTERVAL + 10  # ~2 intervals, and room for a busy machine


@dataclass(frozen=True)
class Loop:
    state: Path
    work: Path
    config: Path
    settings: dict[str, Any]
    client: SlurmClient
    inventory: Any

    def hc_log(self, node: str) -> str:
        path = self.work / f"hc-{node}.log"
        return path.read_text() if path.exists() else ""

    def runs(self, node: str) -> int:
        return len(self.hc_log(node).splitlines())

    def configure(self, **changes: Any) -> None:
        self.config.write_text(yaml.safe_dump({**self.settings, **changes}))


def _cli(*args: str) -> None:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output


@pytest.fixture(scope="module")
def loop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loop]:
    reason = slurm_testbed.unsupported_reason()
    if reason is not None:
        pytest.skip(reason)
    state, work = tmp_path_factory.mktemp("slurm-hc"), tmp_path_factory.mktemp("hc")
    for node in ("h1", "h2", "h3"):
        (work / "ckpt" / node).mkdir(parents=True)
    settings: dict[str, Any] = {
        "slurm_conf": str(slurm_testbed.slurm_layout(state).conf),
        "log": str(work / "hc-{node}.log"),
        "xid": {"logs": [str(work / "xid" / "{node}.log")]},
        "storage": {"path": str(work / "ckpt" / "{node}"), "timeout": 3},
        "peers": {"timeout": 1},
        "memory": {"min_available_mb": 16},
        "cpu": {"min_cpus": 0.05},
    }
    config = work / "hc.yaml"
    config.write_text(yaml.safe_dump(settings))
    program = write_program(work / "mlchaos-hc", config)
    try:
        _cli(
            "testbed",
            "up",
            "--slurm",
            "--hosts",
            "3",
            "--state-dir",
            str(state),
            "--health-check",
            str(program),
            "--health-check-interval",
            str(INTERVAL),
        )
        cluster = slurm_testbed.attach(state)
        yield Loop(state, work, config, settings, cluster.client(), cluster.inventory)
    finally:
        CliRunner().invoke(app, ["testbed", "down", "--state-dir", str(state)])
    assert not (state / slurm_testbed.SLURM_DIR).exists()


def _drained(client: SlurmClient, node: str) -> bool:
    return client.node(node).drained


def test_the_check_runs_on_every_node_and_leaves_healthy_nodes_alone(loop: Loop) -> None:
    assert wait_for(lambda: all(loop.runs(n) >= 2 for n in ("h1", "h2", "h3")), timeout=4 * INTERVAL + 20), {
        n: loop.hc_log(n) for n in ("h1", "h2", "h3")
    }
    for node in loop.client.nodes():
        assert node.state == "IDLE" and not node.drained, node
    for name in ("h1", "h2", "h3"):
        last = loop.hc_log(name).splitlines()[-1]
        assert f" {name} healthy in " in last and "peers ok: 2/2 peers reachable" in last, last


def test_an_xid_drains_its_node_within_two_intervals_and_heal_removes_the_line(loop: Loop) -> None:
    client = loop.client
    log = loop.work / "xid" / "h2.log"
    log.parent.mkdir(exist_ok=True)
    log.write_text("Nov 24 10:00:00 h2 kernel: [   12.000000] e1000e: eth0 NIC Link is Up\n")  # a line not ours
    before = log.read_text()
    injector = GpuXidInjector()
    ctx = InjectionContext(transport=SshTransport.for_host(loop.inventory, "h2"))
    params = GpuXidParams(code=79, log=str(loop.work / "xid" / "{host}.log"))
    op = FaultOp(op_id=f"xid-{uuid.uuid4().hex[:6]}", fault="xid", injector="gpu_xid", params=params)
    injector.check(ctx, params)
    applied = injector.prepare(ctx, op)
    assert applied.host == "h2" and applied.state["log"] == str(log)
    healed = False
    try:
        injector.apply(ctx, applied)
        started = time.monotonic()
        added = log.read_text()[len(before) :]
        assert "NVRM: Xid (PCI:0000:3b:00): 79, pid='N/A', name=python3, GPU has fallen off the bus." in added
        assert " h2 kernel: [" in added
        assert wait_for(lambda: _drained(client, "h2"), timeout=DRAIN_BOUND, interval=0.2), client.node("h2")
        took = time.monotonic() - started
        node = client.node("h2")
        assert node.reason is not None and node.reason.startswith("mlchaos-hc: xid 79 on PCI:0000:3b:00"), node
        print(f"gpu_xid -> DRAIN of h2 in {took:.1f}s (HealthCheckInterval {INTERVAL}s)")
        # The healthy nodes ran the check after the fault and stayed IDLE, untouched.
        runs = {n: loop.runs(n) for n in ("h1", "h3")}
        assert wait_for(lambda: all(loop.runs(n) > runs[n] for n in runs), timeout=2 * INTERVAL + 10)
        for name in ("h1", "h3"):
            other = client.node(name)
            assert other.state == "IDLE" and not other.drained and other.reason is None, other
        injector.heal(ctx, applied)
        healed = True
        assert log.read_text() == before  # exactly the added line is gone, the other stays
        # Default: a node the check drained stays drained after it passes again.
        runs_h2 = loop.runs("h2")
        assert wait_for(lambda: loop.runs("h2") >= runs_h2 + 2, timeout=3 * INTERVAL + 10)
        assert " h2 healthy in " in loop.hc_log("h2").splitlines()[-1]  # it passes, and leaves the node be
        assert _drained(client, "h2"), client.node("h2")
        # resume: true (the config is read on every run): the check resumes the node it drained.
        loop.configure(resume=True)
        assert wait_for(lambda: client.node("h2").available, timeout=3 * INTERVAL + 10), client.node("h2")
    finally:
        loop.configure()
        if not healed:
            injector.heal(ctx, applied)
        if _drained(client, "h2"):
            client.resume("h2")


def test_a_fuse_stall_of_the_checkpoint_dir_drains_its_node(loop: Loop) -> None:
    if not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None or fuselayer.binding_problem():
        pytest.skip("FUSE is not available here")
    client = loop.client
    folder = loop.work / "ckpt" / "h3"
    injector, ctx = StorageInjector(), InjectionContext(transport=LocalTransport())
    op = FaultOp(
        op_id=f"stall-{uuid.uuid4().hex[:6]}",
        fault="stall",
        injector="storage",
        params=StorageParams(path=str(folder), mode="hang"),
        duration_s=120.0,
    )
    injector.check(ctx, op.params)
    applied = injector.prepare(ctx, op)
    try:
        injector.apply(ctx, applied)
        started = time.monotonic()
        assert wait_for(lambda: _drained(client, "h3"), timeout=DRAIN_BOUND + 3, interval=0.2), client.node("h3")
        print(f"storage hang -> DRAIN of h3 in {time.monotonic() - started:.1f}s")
        node = client.node("h3")
        assert node.reason is not None and node.reason.startswith("mlchaos-hc: storage "), node
        assert "did not answer within 3s" in node.reason
        # The check itself never hung: h3 keeps logging runs while its directory is stalled.
        runs = loop.runs("h3")
        assert wait_for(lambda: loop.runs("h3") > runs, timeout=2 * INTERVAL + 10), loop.hc_log("h3")
        for name in ("h1", "h2"):
            assert not _drained(client, name), client.node(name)
    finally:
        injector.heal(ctx, applied)
        if _drained(client, "h3"):
            client.resume("h3")
