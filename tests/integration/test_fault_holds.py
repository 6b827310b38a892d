"""Overlapping faults on one target: holds are counted, so healing one fault never releases what another holds.

Real processes (states read from /proc), the real duty-cycle helper, real iptables in real network namespaces.
The process tests drive the registry both ways it runs: in Python on this machine (``LocalTransport``) and
through its ``sh`` script (a transport that is not the local one, as an SSH host would be); both use this
test's state dir, since the script reads ``MLCHAOS_STATE_DIR`` from the environment it inherits.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel
from support import PseudoRemote, parsed, sampled_states, sleeper, wait_for

from chaos.cluster.local import LocalTransport, process_start_time, process_state
from chaos.cluster.netns import NetnsTransport
from chaos.history.timeline import FAULT_OVERLAP, History
from chaos.plan.build import PlannedOp
from chaos.plugins.injector import Applied, FaultOp, InjectionContext
from chaos.report.html import render_html
from chaos.safety.deadman import is_helper
from injectors.network import iptables as netfilter
from injectors.network.faults import PartitionInjector, PartitionParams
from injectors.process import dutycycle
from injectors.process.faults import FreezeInjector, FreezeParams, SlowInjector, SlowParams
from injectors.process.holds import LocalHolds, RemoteHolds, folder

pytestmark = pytest.mark.usefixtures("isolated_state_dir")  # holds and journals in a state dir of this test's own


def op(injector: str, params: BaseModel, duration_s: float) -> FaultOp:
    name = f"{injector}-{uuid.uuid4().hex[:6]}"
    return FaultOp(op_id=f"{name}#1", fault=name, injector=injector, params=params, duration_s=duration_s)


def running(pid: int) -> bool:
    return process_state(pid) in ("R", "S")


def end_helper(record: Applied) -> None:
    helper = record.state.get("helper_pid")
    if isinstance(helper, int) and is_helper(helper, dutycycle.MODULE, record.op_id):
        os.kill(helper, signal.SIGKILL)


def overlaps(history: History) -> list[dict[str, object]]:
    return [dict(e.data) for e in history.of(FAULT_OVERLAP)]


# -- freeze + slow on one process ---------------------------------------------------------------------------------


@pytest.mark.parametrize("freeze_via", ["local", "sh"])
def test_slow_healed_inside_a_freeze_leaves_the_process_stopped_until_the_freeze_heals(
    tmp_path: Path, freeze_via: str
) -> None:
    """The issue's case: healing a slow duty cycle (and each of its run phases) must not SIGCONT a process that
    a freeze still holds. Before counted holds both did, so the freeze ended early and nothing said so."""
    history = History(tmp_path / "history.jsonl")
    local = InjectionContext(LocalTransport(), history=history)
    freeze_ctx = local if freeze_via == "local" else InjectionContext(PseudoRemote(), history=history)
    freeze, slow = FreezeInjector(), SlowInjector()
    with sleeper() as child:
        frozen = freeze.prepare(freeze_ctx, op("freeze", FreezeParams(pid=child.pid), 30))
        slowed = slow.prepare(local, op("slow", SlowParams(pid=child.pid, stopped_fraction=0.5, period="200ms"), 30))
        try:
            freeze.apply(freeze_ctx, frozen)
            assert wait_for(lambda: process_state(child.pid) == "T", 5)
            slow.apply(local, slowed)
            # Five periods of the duty cycle: its run phases must leave the frozen process stopped.
            seen = sampled_states(child.pid, 1.0)
            assert set(seen) == {"T"}, f"a run phase of the duty cycle continued a frozen process: {seen}"
            slow.heal(local, slowed)
            assert not is_helper(slowed.state["helper_pid"], dutycycle.MODULE, slowed.op_id)  # type: ignore[arg-type]
            seen = sampled_states(child.pid, 0.5)
            assert set(seen) == {"T"}, f"healing the slow fault ended the freeze early: {seen}"
            freeze.heal(freeze_ctx, frozen)
            assert wait_for(lambda: running(child.pid), 5), "the last hold was released but the process stayed stopped"
        finally:
            end_helper(slowed)
            os.kill(child.pid, signal.SIGCONT)
    recorded = overlaps(history)
    assert [(r["op"], r["phase"], r["with"]) for r in recorded] == [
        (slowed.op_id, "apply", [frozen.op_id]),
        (slowed.op_id, "heal", [frozen.op_id]),
    ], recorded
    assert recorded[1]["stays_stopped"] == [child.pid] and recorded[1]["pids"] == [child.pid]
    assert "stay stopped: still held by" in str(recorded[1]["description"])
    # The report's plan table says it next to the op, not only in the event list.
    ops = [
        PlannedOp(op_id=r.op_id, fault=r.fault, injector=r.injector, trigger="after", at_s=0.0)
        for r in (frozen, slowed)
    ]
    document = {
        "plan": {"ops": [o.model_dump(mode="json") for o in ops]},
        "events": [e.model_dump(mode="json") for e in history],
    }
    text = parsed(render_html(document)).all_text
    assert "overlap +" in text and f"stay stopped: still held by {frozen.op_id}" in text


def test_freeze_healed_inside_a_slow_fault_leaves_the_duty_cycle_running_then_all_heal(tmp_path: Path) -> None:
    """The other order: a freeze applied and healed while a slow fault cycles. The cycle goes on after the freeze
    (its stop phases still stop, its run phases still continue) and the process runs once both are healed."""
    history = History(tmp_path / "history.jsonl")
    ctx = InjectionContext(LocalTransport(), history=history)
    freeze, slow = FreezeInjector(), SlowInjector()
    with sleeper() as child:
        slowed = slow.prepare(ctx, op("slow", SlowParams(pid=child.pid, stopped_fraction=0.5, period="200ms"), 30))
        frozen = freeze.prepare(ctx, op("freeze", FreezeParams(pid=child.pid), 30))
        try:
            slow.apply(ctx, slowed)
            freeze.apply(ctx, frozen)
            assert wait_for(lambda: process_state(child.pid) == "T", 5)
            assert set(sampled_states(child.pid, 0.6)) == {"T"}
            freeze.heal(ctx, frozen)
            seen = sampled_states(child.pid, 1.5)
            assert "T" in seen and any(state in ("R", "S") for state in seen), seen
            slow.heal(ctx, slowed)
            assert wait_for(lambda: running(child.pid), 5)
            assert all(state in ("R", "S") for state in sampled_states(child.pid, 0.5))
        finally:
            end_helper(slowed)
            os.kill(child.pid, signal.SIGCONT)
    recorded = overlaps(history)
    assert [(r["op"], r["phase"]) for r in recorded] == [(frozen.op_id, "apply"), (frozen.op_id, "heal")], recorded
    assert recorded[0]["with"] == [slowed.op_id]
    assert "also held by" in str(recorded[0]["description"])


def test_two_freezes_the_process_runs_only_after_the_second_heals() -> None:
    ctx = InjectionContext(LocalTransport())
    freeze = FreezeInjector()
    with sleeper() as child:
        first = freeze.prepare(ctx, op("freeze", FreezeParams(pid=child.pid), 30))
        second = freeze.prepare(ctx, op("freeze", FreezeParams(pid=child.pid), 30))
        try:
            freeze.apply(ctx, first)
            freeze.apply(ctx, second)
            assert wait_for(lambda: process_state(child.pid) == "T", 5)  # a SIGSTOP lands asynchronously
            freeze.heal(ctx, first)
            assert set(sampled_states(child.pid, 0.3)) == {"T"}
            freeze.heal(ctx, first)  # healing the same fault twice does not count as the other's release
            assert set(sampled_states(child.pid, 0.3)) == {"T"}
            freeze.heal(ctx, second)
            assert wait_for(lambda: running(child.pid), 5)
        finally:
            os.kill(child.pid, signal.SIGCONT)


def test_a_lone_fault_records_no_overlap(tmp_path: Path) -> None:
    history = History(tmp_path / "history.jsonl")
    ctx = InjectionContext(LocalTransport(), history=history)
    with sleeper() as child:
        record = FreezeInjector().prepare(ctx, op("freeze", FreezeParams(pid=child.pid), 30))
        try:
            FreezeInjector().apply(ctx, record)
            FreezeInjector().heal(ctx, record)
            assert wait_for(lambda: running(child.pid), 5)
        finally:
            os.kill(child.pid, signal.SIGCONT)
    assert overlaps(history) == []


# -- the registry itself ------------------------------------------------------------------------------------------


def test_python_and_sh_registries_share_one_folder_and_one_protocol() -> None:
    local, shell = LocalHolds(), RemoteHolds(PseudoRemote())
    with sleeper() as child:
        start = process_start_time(child.pid)
        assert start is not None
        target = [(child.pid, start)]
        try:
            [held] = local.hold(target, "freeze#1", lasts_s=30, holding=True, signal=True)
            assert held.others == () and wait_for(lambda: process_state(child.pid) == "T", 5)
            [seen] = shell.hold(target, "slow#1", lasts_s=30, holding=False, signal=True)
            assert [(h.op_id, h.holding) for h in seen.others] == [("freeze#1", True)] and seen.stays_stopped
            [released] = shell.release(target, "slow#1", signal=True)
            assert released.stays_stopped and process_state(child.pid) == "T"
            [last] = local.release(target, "freeze#1", signal=True)
            assert last.others == () and not last.stays_stopped
            assert wait_for(lambda: running(child.pid), 5)
            assert sorted(p.suffix for p in folder().iterdir()) == [".lock"]  # no hold left behind
        finally:
            os.kill(child.pid, signal.SIGCONT)


def test_a_stale_hold_expires_and_a_recycled_pid_is_never_signalled() -> None:
    holds = LocalHolds()
    with sleeper() as child:
        start = process_start_time(child.pid)
        assert start is not None
        try:
            # A hold whose owner died without releasing it: it counts until it expires, then not at all.
            holds.hold([(child.pid, start)], "dead-owner#1", lasts_s=1, holding=True, signal=True)
            assert wait_for(lambda: process_state(child.pid) == "T", 5)
            [early] = RemoteHolds(PseudoRemote()).release([(child.pid, start)], "other#1", signal=True)
            assert early.stays_stopped and process_state(child.pid) == "T"
            time.sleep(2.1)
            [late] = holds.release([(child.pid, start)], "other#1", signal=True)
            assert late.others == () and wait_for(lambda: running(child.pid), 5)
            # The recorded start time no longer matches: another process owns the pid now, leave it alone.
            os.kill(child.pid, signal.SIGSTOP)
            assert wait_for(lambda: process_state(child.pid) == "T", 5)
            for registry in (holds, RemoteHolds(PseudoRemote())):
                [gone] = registry.release([(child.pid, start + 1)], "freeze#9", signal=True)
                assert gone.gone
                assert set(sampled_states(child.pid, 0.2)) == {"T"}
        finally:
            os.kill(child.pid, signal.SIGCONT)


def test_the_dead_man_revert_alone_continues_the_process_and_drops_only_its_own_hold() -> None:
    """What a dead-man runs when the harness is gone: its op's hold goes (so no stale hold outlives it) and the
    process is continued unconditionally (the last resort), but never a pid whose start time changed."""
    ctx = InjectionContext(LocalTransport())
    freeze = FreezeInjector()
    with sleeper() as child:
        mine = freeze.prepare(ctx, op("freeze", FreezeParams(pid=child.pid), 30))
        other = freeze.prepare(ctx, op("freeze", FreezeParams(pid=child.pid), 30))
        revert = freeze.revert_command(mine)
        assert revert is not None
        try:
            freeze.apply(ctx, mine)
            freeze.apply(ctx, other)
            assert wait_for(lambda: process_state(child.pid) == "T", 5)
            stranger = freeze.revert_command(mine.model_copy(update={"state": {**mine.state, "start_times": [1]}}))
            assert stranger is not None and subprocess.run(stranger, check=False, timeout=30).returncode == 0
            assert set(sampled_states(child.pid, 0.3)) == {"T"}, (
                "the revert signalled a pid that is another process now"
            )
            assert subprocess.run(revert, check=False, timeout=30).returncode == 0
            assert wait_for(lambda: running(child.pid), 5)
            holders = [path.read_text().split()[2] for path in folder().glob("*.hold")]
            assert holders == [other.op_id], holders
        finally:
            freeze.heal(ctx, other)
            os.kill(child.pid, signal.SIGCONT)


# -- network faults: every op has its own chains, so nothing is shared ----------------------------------------------


def _sh(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, check=True, timeout=60)


def _netns_unusable() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    missing = [tool for tool in ("ip", "iptables") if shutil.which(tool) is None]
    return f"{missing[0]} is not installed" if missing else None


ECHO_SERVER = (
    "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(('0.0.0.0', 9000))\n"
    "print('ready', flush=True)\nwhile True:\n    d, peer = s.recvfrom(64); s.sendto(d, peer)\n"
)
ECHO = (
    "import socket, sys\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(0.3)\n"
    "for _ in range(3):\n    try:\n        s.sendto(b'x', (sys.argv[1], 9000)); s.recvfrom(64); sys.exit(0)\n"
    "    except OSError:\n        pass\nsys.exit(1)\n"
)


@pytest.fixture
def pair() -> Iterator[tuple[str, str, str]]:
    """Two namespaces joined by a veth pair (10.215.N.1 <-> .2), a UDP echo on .2; (ns a, ns b, address b)."""
    if (why := _netns_unusable()) is not None:
        pytest.skip(why)
    tag = uuid.uuid4().hex[:6]
    a, b = f"chaos-fh-{tag}-a", f"chaos-fh-{tag}-b"
    subnet = f"10.215.{os.getpid() % 200 + 20}"
    created: list[str] = []
    server = None
    try:
        for ns in (a, b):
            _sh("ip", "netns", "add", ns)
            created.append(ns)
        _sh("ip", "link", "add", "eth0", "netns", a, "type", "veth", "peer", "name", "eth0", "netns", b)
        for index, ns in enumerate((a, b), 1):
            _sh("ip", "-n", ns, "addr", "add", f"{subnet}.{index}/24", "dev", "eth0")
            _sh("ip", "-n", ns, "link", "set", "eth0", "up")
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
        server = subprocess.Popen(["ip", "netns", "exec", b, sys.executable, "-c", ECHO_SERVER], stdout=subprocess.PIPE)
        assert server.stdout is not None and server.stdout.readline().strip() == b"ready"
        yield a, b, f"{subnet}.2"
    finally:
        if server is not None:
            server.kill()
            server.wait()
        for ns in reversed(created):
            subprocess.run(["ip", "netns", "del", ns], check=False, timeout=60)


def _echoes(ns: str, address: str) -> bool:
    argv = ["ip", "netns", "exec", ns, sys.executable, "-c", ECHO, address]
    return subprocess.run(argv, capture_output=True, check=False, timeout=30).returncode == 0


def test_two_partitions_of_one_peer_have_their_own_chains_and_heal_independently(
    pair: tuple[str, str, str],
) -> None:
    """Network rules are never shared: each op installs its own chains, so healing one overlapping partition
    removes only its own; the other keeps dropping until it is healed too."""
    a, _, peer = pair
    ctx = InjectionContext(NetnsTransport(a))
    injector = PartitionInjector()
    assert wait_for(lambda: _echoes(a, peer), 10), "the test link never carried an echo"
    first = injector.prepare(ctx, op("partition", PartitionParams(peers=[peer]), 30))
    second = injector.prepare(ctx, op("partition", PartitionParams(peers=[peer]), 30))
    try:
        chains = [{spec.chain for spec in netfilter.chains_from_state(r.state)} for r in (first, second)]
        assert not chains[0] & chains[1]
        injector.apply(ctx, first)
        injector.apply(ctx, second)
        assert not _echoes(a, peer)
        injector.heal(ctx, first)
        assert not _echoes(a, peer), "healing one partition released the other"
        listing = NetnsTransport(a).run(["iptables", "-S"]).stdout
        assert all(chain in listing for chain in chains[1]) and not any(chain in listing for chain in chains[0])
        injector.heal(ctx, second)
        assert wait_for(lambda: _echoes(a, peer), 5)
        assert "CHAOS" not in NetnsTransport(a).run(["iptables", "-S"]).stdout
    finally:
        injector.heal(ctx, second)
        injector.heal(ctx, first)
