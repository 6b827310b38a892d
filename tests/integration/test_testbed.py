"""The testbed and the SSH transport, for real: network namespaces, one OpenSSH sshd per host, paramiko.

Skips (with the reason) where a testbed cannot be built: not root, no ``ip netns``, no sshd.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import signal
import subprocess
from pathlib import Path

import pytest
from support import wait_for

from chaos.cluster.base import TransportError
from chaos.cluster.inventory import Inventory
from chaos.cluster.ssh import SshTransport, UnknownHostKeyWarning, fan_out, remote_command
from chaos.testbed import namespaces as tb

Transports = dict[str, SshTransport]


def _root_addresses() -> set[str]:
    out = subprocess.run(["ip", "-4", "-j", "addr"], capture_output=True, text=True, check=True).stdout
    return {info["local"] for entry in json.loads(out) for info in entry["addr_info"]} - {"127.0.0.1"}


# --- pure: how commands reach the remote shell --------------------------------------------------------------


def test_remote_command_quotes_every_word() -> None:
    hostile = ["echo", "$(touch /tmp/pwned)", "a b", "it's", ";rm -rf /", "`id`"]
    text = remote_command(hostile)
    assert text.startswith("exec ")
    assert shlex.split(text)[1:] == hostile  # the shell sees exactly these words, nothing expanded
    assert remote_command(["id"], sudo=True) == "exec sudo -n -- id"
    assert remote_command(["ls"], env={"A": "x y"}, cwd="/tmp/a b") == "cd -- '/tmp/a b' && exec env 'A=x y' ls"
    with pytest.raises(ValueError, match="not a valid identifier"):
        remote_command(["true"], env={"A;rm": "x"})
    with pytest.raises(ValueError, match="empty argv"):
        remote_command([])


# --- the hosts ------------------------------------------------------------------------------------------------


def test_each_host_is_its_own_namespace(testbed: Inventory, testbed_transports: Transports) -> None:
    own_netns = os.readlink("/proc/self/ns/net")
    seen: set[str] = set()
    for host in testbed.hosts:
        transport = testbed_transports[host.name]
        assert transport.run(["hostname"], check=True).stdout.strip() == host.name
        addresses = transport.run(["ip", "-4", "addr"], check=True).stdout
        assert f"inet {host.address}/24" in addresses
        assert not any(f"inet {a}/" in addresses for a in _root_addresses())  # not the machine's stack
        # Every testbed host's name resolves on every host (a per-namespace hosts file), as a cluster's DNS does.
        for other in testbed.hosts:
            found = transport.run(["getent", "hosts", other.name], check=True).stdout.split()
            assert found[:2] == [other.address, other.name], found
        netns = transport.run(["readlink", "/proc/self/ns/net"], check=True).stdout.strip()
        assert netns != own_netns
        seen.add(netns)
    assert len(seen) == len(testbed.hosts)


def test_run_reports_exit_codes_and_stderr(testbed_transports: Transports) -> None:
    h1 = testbed_transports["h1"]
    done = h1.run(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")
    with pytest.raises(TransportError, match="exited 3 on h1"):
        h1.run(["sh", "-c", "exit 3"], check=True)
    assert h1.run(["no-such-command-chaos"]).returncode == 127


def test_run_timeout_kills_the_remote_command(testbed: Inventory, testbed_transports: Transports) -> None:
    h2 = testbed_transports["h2"]
    marker = "chaos-tb-timeout-marker"
    with pytest.raises(TransportError, match="timed out after 1s on h2"):
        h2.run(["sh", "-c", f"sleep 30; : {marker}"], timeout=1)
    namespace = testbed.host("h2").labels["netns"]

    def gone() -> bool:
        pids = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True).stdout.split()
        return not any(
            marker.encode() in Path(f"/proc/{p}/cmdline").read_bytes() for p in pids if Path(f"/proc/{p}").exists()
        )

    assert wait_for(gone, 5)


def test_fan_out_reaches_every_host_in_parallel(testbed: Inventory, testbed_transports: Transports) -> None:
    transports = list(testbed_transports.values())
    names = fan_out(transports, lambda t: t.run(["hostname"], check=True).stdout.strip(), max_parallel=2)
    assert names == [t.host for t in transports]
    with pytest.raises(TransportError, match=r"3 of 3 hosts failed: h1: TransportError"):
        fan_out(transports, lambda t: t.run(["false"], check=True))


def test_put_writes_atomically_and_reads_back(testbed_transports: Transports, tmp_path: Path) -> None:
    h3 = testbed_transports["h3"]
    target = tmp_path / "chaos-tb-put.bin"
    payload = bytes(range(256)) * 64
    h3.put(payload, str(target))
    h3.put(payload[::-1], str(target))  # replaces in place
    remote_sum = h3.run(["sha256sum", str(target)], check=True).stdout.split()[0]
    assert remote_sum == hashlib.sha256(payload[::-1]).hexdigest()
    assert target.read_bytes() == payload[::-1]  # hosts share this filesystem
    assert [p.name for p in tmp_path.iterdir()] == ["chaos-tb-put.bin"]  # no temporary left
    with pytest.raises(TransportError, match="cannot write"):
        h3.put(b"x", "/nonexistent-dir-chaos/f")


def test_spawn_gives_pid_stream_and_signals(testbed_transports: Transports) -> None:
    h1 = testbed_transports["h1"]
    proc = h1.spawn(["sh", "-c", 'echo "started $$"; echo oops >&2; exec sleep 30'], env={"CHAOS_X": "1"})
    assert proc.stdout is not None
    assert proc.stdout.readline() == f"started {proc.pid}\n".encode()  # the pid IS the command's
    assert proc.stdout.readline() == b"oops\n"  # stderr merged into stdout
    assert h1.run(["ps", "-o", "comm=", "-p", str(proc.pid)]).stdout.strip() == "sleep"
    assert proc.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.2)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == -signal.SIGTERM  # like Popen: killed by a signal reads as -signum
    assert proc.poll() == -signal.SIGTERM
    proc.send_signal(signal.SIGTERM)  # already gone: a no-op, as for Popen

    done = h1.spawn(["sh", "-c", 'echo "$CHAOS_X in $PWD"; exit 4'], env={"CHAOS_X": "v"}, cwd=Path("/tmp"))
    assert done.wait(timeout=10) == 4
    assert done.stdout is not None and done.stdout.read() == b"v in /tmp\n"


def test_kill_with_parent_fires_when_the_connection_drops(testbed: Inventory) -> None:
    watcher = SshTransport.for_host(testbed, "h2")
    doomed = SshTransport.for_host(testbed, "h2")
    try:
        proc = doomed.spawn(["sleep", "60"], kill_with_parent=signal.SIGTERM)
        assert watcher.run(["kill", "-0", str(proc.pid)]).ok
        doomed.close()  # what a SIGKILLed harness looks like from the host: the connection ends
        assert wait_for(lambda: not watcher.run(["kill", "-0", str(proc.pid)]).ok, 10)

        normal = watcher.spawn(["sh", "-c", "exit 0"], kill_with_parent=signal.SIGKILL)
        assert normal.wait(timeout=10) == 0  # ends normally; the watcher stands down
    finally:
        watcher.close()
        doomed.close()


def test_reconnects_after_a_dropped_connection(testbed_transports: Transports) -> None:
    h3 = testbed_transports["h3"]
    assert h3.run(["true"]).ok
    h3.connect().close()  # the session dies under the transport
    assert h3.run(["hostname"], check=True).stdout.strip() == "h3"


def test_clock_offset_is_small_and_bounded(testbed_transports: Transports) -> None:
    h1 = testbed_transports["h1"]
    estimate = h1.clock_estimate()
    # Same kernel clock: the true offset is 0, so it must lie within the reported bound (plus slack).
    assert abs(estimate.offset_s) <= estimate.error_s + 0.005
    assert 0 < estimate.rtt_s < 1
    assert abs(h1.clock_offset()) < 1.0


# --- host keys ------------------------------------------------------------------------------------------------


def test_changed_host_key_is_refused_even_with_accept_unknown(testbed: Inventory, tmp_path: Path) -> None:
    assert testbed.known_hosts is not None
    keys = {line.split()[0]: line.split(maxsplit=1)[1] for line in testbed.known_hosts.read_text().splitlines()}
    h1, h2 = testbed.host("h1"), testbed.host("h2")
    forged = tmp_path / "known_hosts"
    forged.write_text(f"{h1.address} {keys[h2.address]}\n")  # h2's real key filed under h1's address
    for accept in (False, True):
        transport = SshTransport(h1, known_hosts=forged, accept_unknown=accept)
        with pytest.raises(TransportError) as caught:
            transport.run(["true"])
        message = str(caught.value)
        assert "HOST KEY MISMATCH for h1" in message
        assert str(forged) in message and "ssh-keygen -R" in message
        transport.close()


def test_unknown_host_needs_accept_unknown(testbed: Inventory, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    h3 = testbed.host("h3")
    strict = SshTransport(h3, known_hosts=empty)
    with pytest.raises(TransportError, match=r"host h3 \(.*\) is not in .*known_hosts.*ssh-keyscan"):
        strict.run(["true"])
    lenient = SshTransport(h3, known_hosts=empty, accept_unknown=True)
    try:
        with pytest.warns(UnknownHostKeyWarning, match="h3"):
            assert lenient.run(["hostname"]).stdout.strip() == "h3"
        assert empty.read_text() == ""  # trusted for this transport only, never written back
    finally:
        lenient.close()


# --- lifecycle: a second testbed beside the session one -------------------------------------------------------


def _leftovers(layout: tb.Layout) -> list[str]:
    found: list[str] = []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    found += [line for line in netns.splitlines() if line.startswith(layout.ns_prefix)]
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    found += [line for line in links.splitlines() if f" {layout.root_link}@" in line or f" {layout.root_link}:" in line]
    sshd = subprocess.run(["pgrep", "-f", str(layout.state_dir)], capture_output=True, text=True).stdout
    found += [f"process {pid}" for pid in sshd.split()]
    rules = subprocess.run(["iptables", "-S"], capture_output=True, text=True).stdout
    found += [line for line in rules.splitlines() if "chtb" in line or "chaos-tb" in line]
    etc = Path("/etc/netns")  # the per-host hosts files
    found += [str(d) for d in (etc.iterdir() if etc.exists() else ()) if d.name.startswith(layout.ns_prefix)]
    return found


def test_up_is_idempotent_repairs_and_down_leaves_nothing(testbed: Inventory, tmp_path: Path) -> None:
    state = tmp_path / "second"
    layout = tb.Layout.of(state)
    try:
        first = tb.up(2, state)
        assert {h.address for h in first.hosts}.isdisjoint(h.address for h in testbed.hosts)  # coexists
        pids = [h.sshd_pid for h in tb.status(state).hosts]
        assert tb.up(2, state) == first
        assert [h.sshd_pid for h in tb.status(state).hosts] == pids  # reused, not restarted

        # Break it: kill h1's sshd, delete h2's namespace. `up` repairs both, with the same host keys.
        assert pids[0] is not None
        os.kill(pids[0], signal.SIGKILL)
        subprocess.run(["ip", "netns", "del", layout.host_ns(2)], check=True)
        assert not tb.status(state).healthy
        assert tb.up(2, state) == first
        assert tb.status(state).healthy
        for host in first.hosts:
            with SshTransport.for_host(first, host.name) as transport:
                assert transport.run(["hostname"], check=True).stdout.strip() == host.name

        smaller = tb.up(1, state)
        assert [h.name for h in smaller.hosts] == ["h1"]
        assert layout.host_ns(2) not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    finally:
        tb.down(state)
    assert _leftovers(layout) == []
    assert not state.exists()
    assert tb.down(state) == []  # already down: nothing to do, no error


def test_down_finishes_a_half_built_testbed(tmp_path: Path) -> None:
    reason = tb.unsupported_reason()
    if reason is not None:
        pytest.skip(reason)
    state = tmp_path / "half"
    layout = tb.Layout.of(state)
    try:
        subprocess.run(["ip", "netns", "add", layout.hub], check=True)  # as if `up` died right after this
        subprocess.run(["ip", "netns", "add", layout.host_ns(1)], check=True)
        assert tb.status(state).built
    finally:
        lines = tb.down(state)
    assert any(layout.hub in line for line in lines)
    assert _leftovers(layout) == []


def test_cli_up_status_down(testbed: Inventory, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from chaos.cli.commands import app

    state = tmp_path / "cli"
    runner = CliRunner()
    try:
        result = runner.invoke(app, ["testbed", "up", "--hosts", "1", "--state-dir", str(state)])
        assert result.exit_code == 0, result.output
        assert result.stdout.strip().splitlines()[-1] == str(state.resolve() / "inventory.yaml")
        status = runner.invoke(app, ["testbed", "status", "--state-dir", str(state)])
        assert status.exit_code == 0 and "h1" in status.stdout, status.output
    finally:
        down = runner.invoke(app, ["testbed", "down", "--state-dir", str(state)])
    assert down.exit_code == 0, down.output
    assert _leftovers(tb.Layout.of(state)) == []
    assert runner.invoke(app, ["testbed", "status", "--state-dir", str(state)]).exit_code == 1
