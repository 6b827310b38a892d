"""A partition WITHOUT a duration, the harness SIGKILLed mid-fault: its dead-man removes the rule within the
scenario's max_duration + heal_grace. Before every fault had a dead-man, such a rule stayed until someone ran
``mlchaos cleanup``; each test first sees the rule still in place right after the kill, so it can fail.

Two ways a switch runs: the local reverter process (the harness itself runs inside a network namespace and
partitions its own host), and the ``sh`` switch on a remote SSH host of the namespace testbed.
"""

from __future__ import annotations

import json
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
from support import (
    CLI,
    REACH_SSHD,
    ROOT,
    cut_off,
    mlchaos,
    scenario_yaml,
    spawn_harness,
    ticker,
    wait_for,
    write_inventory,
)

from chaos.cluster.inventory import Inventory

pytestmark = pytest.mark.slow

MAX_S, GRACE_S = 20.0, 2.0  # the switch of a duration-less fault fires at MAX_S + GRACE_S after the apply


def _rules(namespace: str) -> str:
    argv = ["ip", "netns", "exec", namespace, "iptables", "-S"]
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60).stdout


def _ours(namespace: str) -> bool:
    text = _rules(namespace)
    return "CHAOS-" in text or "mlchaos:" in text


def _journal_records(state: Path) -> list[dict[str, object]]:
    found = []
    for journal in (state / "journal").rglob("*.jsonl"):
        found += [json.loads(line) for line in journal.read_text().splitlines() if line.strip()]
    return found


def _kill_switches(state: Path) -> None:
    """Leave no dead-man of ours running whatever happened (each is verified to be one before it is signalled)."""
    from chaos.safety import deadman

    for record in _journal_records(state):
        if record.get("kind") == "deadman" and isinstance(record.get("pid"), int):
            deadman.disarm(int(record["pid"]))  # type: ignore[call-overload]


def _healed_after_kill(namespace: str, applied_seen: float) -> float:
    """Seconds from the apply until no rule of ours is left (fails the test past max_duration + grace + slack)."""
    assert _ours(namespace), "the rule was gone right after the kill: the test could not have failed"
    while _ours(namespace):
        waited = time.monotonic() - applied_seen
        assert waited < MAX_S + GRACE_S + 20, f"the rule is still there {waited:.0f}s after the apply"
        time.sleep(0.25)
    return time.monotonic() - applied_seen


def _unusable() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces, iptables)"
    missing = [tool for tool in ("ip", "iptables") if shutil.which(tool) is None]
    return f"{missing[0]} is not installed" if missing else None


@pytest.fixture
def harness_netns() -> Iterator[tuple[str, str]]:
    """A network namespace with one veth pair (10.216.N.1/24 on one end) for a harness to run in: (its name, an
    address on that subnet that nobody has, to partition from)."""
    if (why := _unusable()) is not None:
        pytest.skip(why)
    name = f"chaos-dl-{uuid.uuid4().hex[:6]}"
    subnet = f"10.216.{os.getpid() % 200 + 20}"
    subprocess.run(["ip", "netns", "add", name], check=True, timeout=60)
    try:
        for argv in (
            ["link", "add", "v0", "type", "veth", "peer", "name", "v1"],  # no dummy module on every kernel
            ["addr", "add", f"{subnet}.1/24", "dev", "v0"],
            ["link", "set", "v0", "up"],
            ["link", "set", "v1", "up"],
            ["link", "set", "lo", "up"],
        ):
            subprocess.run(["ip", "-n", name, *argv], check=True, timeout=60)
        yield name, f"{subnet}.9"
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False, timeout=60)


def test_sigkilled_harness_durationless_partition_is_reverted_by_the_local_dead_man(
    harness_netns: tuple[str, str], tmp_path: Path
) -> None:
    namespace, peer = harness_netns
    state = tmp_path / "state"
    env = {**os.environ, "MLCHAOS_STATE_DIR": str(state)}
    marker = f"chaos-dl-target-{uuid.uuid4().hex[:8]}"
    partition = {"name": "cut-forever", "type": "partition", "params": {"peers": [peer]}, "trigger": {"after": "1s"}}
    # no duration: only the dead-man (or a heal) ends it
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        scenario_yaml(
            "durationless-local",
            1,
            ticker(1200, say=f"print('tick', i, '{marker}', flush=True)"),
            faults=[partition],
            safety={"max_duration": f"{MAX_S}s", "heal_grace": f"{GRACE_S}s"},
        )
    )
    harness = subprocess.Popen(
        ["ip", "netns", "exec", namespace, *CLI, "run", str(scenario), "--report-dir", str(tmp_path / "reports")],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert wait_for(lambda: _ours(namespace), 60, interval=0.1), "the partition was never applied"
        applied_seen = time.monotonic()
        harness.send_signal(signal.SIGKILL)  # `ip netns exec` execs the harness: this pid IS the harness
        harness.wait(timeout=10)
        took = _healed_after_kill(namespace, applied_seen)
        assert took >= MAX_S * 0.5, f"healed after {took:.1f}s: too early for the dead-man, something else healed"
        healed_by_deadman = lambda: any(r.get("by") == "deadman" for r in _journal_records(state))  # noqa: E731
        assert wait_for(healed_by_deadman, 10), _journal_records(state)
        cleanup = subprocess.run(
            ["ip", "netns", "exec", namespace, *CLI, "cleanup"], cwd=ROOT, env=env, capture_output=True, text=True
        )
        assert "nothing to heal" in cleanup.stdout, cleanup.stdout + cleanup.stderr
    finally:
        if harness.poll() is None:
            harness.kill()
            harness.wait(timeout=10)
        subprocess.run(["ip", "netns", "exec", namespace, *CLI, "cleanup"], cwd=ROOT, env=env, capture_output=True)
        _kill_switches(state)
        for line in subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split():
            try:
                os.kill(int(line), signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert not _ours(namespace)
    # The partition was really the harness's own host's: the journal names it as applied locally.
    assert any(r.get("kind") == "intent" for r in _journal_records(state))


def test_sigkilled_harness_durationless_partition_is_reverted_by_the_hosts_dead_man(
    testbed: Inventory, tmp_path: Path
) -> None:
    """The acceptance case: a partition without a duration on an SSH host, the harness SIGKILLed mid-fault;
    the host's own switch removes the rule within max_duration + grace."""
    h1 = next(h for h in testbed.hosts if h.name == "h1")
    h2 = next(h for h in testbed.hosts if h.name == "h2")
    target = {
        "type": "command",
        "command": ["ip", "netns", "exec", h1.labels["netns"], sys.executable, "-c", REACH_SSHD, h2.address, 1000],
        "matchers": [{"pattern": r"^(ok|unreachable) (?P<step>\d+)", "event": "target.step"}],
    }
    fault = cut_off("h2", after="1.5s", duration=1)
    del fault["duration"]  # no duration: only the dead-man (or a heal) ends it
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        scenario_yaml(
            "durationless-ssh",
            5,
            target,
            cluster={"transport": "ssh"},
            faults=[fault],
            safety={"max_duration": f"{MAX_S}s", "heal_grace": f"{GRACE_S}s"},
        )
    )
    inventory_file = write_inventory(testbed, tmp_path)
    env = {"MLCHAOS_STATE_DIR": str(tmp_path / "state"), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    harness = spawn_harness(
        "run", scenario, "--inventory", inventory_file, "--report-dir", tmp_path / "reports", env=env
    )
    h2_ns = h2.labels["netns"]
    try:
        assert wait_for(lambda: _ours(h2_ns), 60, interval=0.1), "the partition was never applied"
        applied_seen = time.monotonic()
        harness.send_signal(signal.SIGKILL)
        harness.wait(timeout=10)
        took = _healed_after_kill(h2_ns, applied_seen)
        assert took >= MAX_S * 0.5, f"healed after {took:.1f}s: too early for the dead-man, something else healed"
    finally:
        if harness.poll() is None:
            harness.kill()
            harness.wait(timeout=10)
        # Whatever happened, leave h2 clean: cleanup heals from the journal over SSH.
        mlchaos("cleanup", "--inventory", inventory_file, env=env, timeout=60)
    assert not _ours(h2_ns)
