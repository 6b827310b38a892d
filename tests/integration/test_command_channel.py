"""The SSH transport's long-lived command channel (:mod:`chaos.cluster.command_channel`), on real testbed hosts:
commands reuse one shell per host instead of a session each, their output, stderr and exit status come back
intact whatever they contain, a channel found dead is re-opened without running anything twice, one that dies
under a command is never retried, and nothing is left on the host once the harness goes away.

The framing is also checked on this machine's own ``sh``: a request cut short anywhere never runs.
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest
from support import wait_for

from chaos.cluster import command_channel
from chaos.cluster.base import TransportError
from chaos.cluster.inventory import Inventory
from chaos.cluster.remote_process import remote_command
from chaos.cluster.ssh import SshTransport
from chaos.safety import remote_deadman


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (testbed hosts are network namespaces: they share this machine's processes)."""
    return Path(f"/proc/{pid}").exists()


def _loops() -> set[int]:
    """Every command-channel shell on this machine (and so on every testbed host)."""
    found = subprocess.run(["pgrep", "-f", command_channel.LOOP_NAME], capture_output=True, text=True, check=False)
    return {int(pid) for pid in found.stdout.split()}


class _Sessions(SshTransport):
    """Counts the SSH sessions (exec channels) the transport opens for ``run`` beside the command channel."""

    sessions = 0

    def _open_channel(self) -> paramiko.Channel:
        self.sessions += 1
        return super()._open_channel()


@pytest.fixture
def h1(testbed: Inventory) -> Iterator[_Sessions]:
    transport = _Sessions(testbed.host("h1"), known_hosts=testbed.known_hosts)
    yield transport
    transport.close()


def test_commands_reuse_one_shell_and_no_session_each(h1: _Sessions) -> None:
    assert h1.run(["true"]).ok
    shell = h1.channel_pid
    assert shell is not None and _alive(shell)
    for _ in range(5):
        parent = h1.run(["sh", "-c", "echo $PPID"], check=True).stdout.strip()
        assert int(parent) == shell  # the command is a child of the channel's shell: no sshd session of its own
    assert h1.channel_pid == shell and h1.sessions == 0


def test_output_status_and_hostile_words_round_trip(h1: SshTransport) -> None:
    done = h1.run(["sh", "-c", "printf out; printf err >&2; exit 3"])
    assert (done.returncode, done.stdout, done.stderr) == (3, "out", "err")
    assert h1.run(["no-such-command-chaos"]).returncode == 127
    hostile = "$(touch /tmp/chaos-pwned) `id` }\n) ; exit 7\nmlchaos-" + "0" * 32 + " 0\n'\"\\"
    echoed = h1.run(["printf", "%s", hostile], check=True)
    assert echoed.stdout == hostile and not Path("/tmp/chaos-pwned").exists()
    big = "x" * 90_000 + "\n" + "y" * 9_000  # an iptables batch's size, as one argv word
    counted = h1.run(["sh", "-c", 'printf %s "$1" | wc -c', "count", big], check=True)
    assert int(counted.stdout) == len(big)
    chatty = h1.run(["sh", "-c", "head -c 3000000 /dev/zero; head -c 2000000 /dev/zero >&2"], check=True, timeout=60)
    assert (len(chatty.stdout), len(chatty.stderr)) == (3_000_000, 2_000_000)  # neither stream stalls the other
    assert h1.run(["echo", "after"], check=True).stdout == "after\n"  # the channel is still in step


def test_a_dead_shell_is_replaced_without_running_anything_twice(h1: SshTransport, tmp_path: Path) -> None:
    log = tmp_path / "ran"
    assert h1.run(["true"]).ok
    first = h1.channel_pid
    assert first is not None
    os.kill(first, 9)  # the host's shell dies between two commands
    assert wait_for(lambda: not _alive(first), 5)
    # ... and the harness has heard so (sshd's close of the channel), as it would before its next command: until
    # then nobody can tell a dead shell from a live one, and a command sent meanwhile is lost, not replayed.
    assert wait_for(lambda: h1._channel is None or not h1._channel.usable(h1.connect()), 5)
    assert h1.run(["sh", "-c", 'echo once >> "$1"', "append", str(log)], check=True).ok
    assert log.read_text() == "once\n"
    assert h1.channel_pid not in (None, first)


def test_a_shell_lost_under_a_command_is_not_retried(h1: SshTransport, tmp_path: Path) -> None:
    log = tmp_path / "ran"
    with pytest.raises(TransportError, match="lost while running sh"):
        h1.run(["sh", "-c", 'echo once >> "$1"; kill -KILL $PPID; sleep 1', "append", str(log)])
    assert log.read_text() == "once\n"  # it ran; its fate was unknown to the harness, so it was not run again
    assert h1.run(["echo", "next"], check=True).stdout == "next\n"


def test_a_timed_out_command_takes_its_shell_with_it(h1: SshTransport) -> None:
    assert h1.run(["true"]).ok
    shell = h1.channel_pid
    assert shell is not None
    marker = "chaos-channel-timeout-marker"
    with pytest.raises(TransportError, match="timed out after 1s on h1"):
        h1.run(["sh", "-c", f"sleep 30; : {marker}"], timeout=1)

    def gone() -> bool:
        found = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True, check=False)
        return not found.stdout.strip() and not _alive(shell)

    assert wait_for(gone, 5)
    assert h1.run(["echo", "again"], check=True).stdout == "again\n"


def test_concurrent_commands_on_one_host_do_not_wait_for_each_other(h1: _Sessions) -> None:
    assert h1.run(["true"]).ok
    results: list[str] = []
    threads = [
        threading.Thread(target=lambda: results.append(h1.run(["sh", "-c", "sleep 1; echo done"]).stdout))
        for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert results == ["done\n"] * 3
    assert h1.sessions >= 1  # the channel was busy: the others took a session of their own


def test_nothing_is_left_on_the_host_after_close_or_a_dropped_connection(testbed: Inventory) -> None:
    before = _loops()
    closed = SshTransport.for_host(testbed, "h2")
    dropped = SshTransport.for_host(testbed, "h3")
    try:
        assert closed.run(["true"]).ok and dropped.run(["true"]).ok
        shells = [closed.channel_pid, dropped.channel_pid]
        assert all(pid is not None and pid in _loops() for pid in shells), shells
        closed.close()
        dropped.connect().close()  # what a killed harness looks like from the host: the connection ends
        assert wait_for(lambda: _loops() <= before, 10), _loops() - before
        assert dropped.run(["hostname"], check=True).stdout.strip() == "h3"  # and it reconnects
    finally:
        closed.close()
        dropped.close()
    assert wait_for(lambda: _loops() <= before, 10)


def test_off_switch_gives_one_session_per_command(testbed: Inventory) -> None:
    transport = _Sessions(testbed.host("h1"), known_hosts=testbed.known_hosts, command_channel=False)
    try:
        for _ in range(3):
            assert transport.run(["true"]).ok
        assert transport.sessions == 3 and transport.channel_pid is None
    finally:
        transport.close()


def test_a_request_cut_short_never_runs(tmp_path: Path) -> None:
    """Every prefix of a request short of its closing brace, then EOF (the channel died while it was sent), runs
    nothing in ``sh``; the whole request runs once and answers with both sentinels. (A prefix missing only the
    last newline is whole at EOF: hence a request is retried only when none of it was sent.)"""
    flag = tmp_path / "ran"
    marker = "mlchaos-" + "ab" * 16
    text = command_channel.request_text(remote_command(["sh", "-c", 'echo hi >> "$1"', "x", str(flag)]), marker)
    cuts = sorted({i for i, char in enumerate(text[:-2]) if char in " \n;}"} | {len(text) - 2})
    assert text.endswith("}\n")
    for cut in cuts:
        subprocess.run(["sh", "-s"], input=text[:cut].encode(), capture_output=True, timeout=10, check=False)
        assert not flag.exists(), f"ran from a prefix of {cut} of {len(text)} characters: {text[:cut]!r}"
    whole = subprocess.run(["sh", "-s"], input=text.encode(), capture_output=True, timeout=10, check=False)
    assert flag.read_text() == "hi\n"
    assert whole.stdout == f"\n{marker} 0\n".encode() and whole.stderr == f"\n{marker}\n".encode()


def test_a_started_remote_switch_always_reports_its_pid(h1: SshTransport) -> None:
    """The switch's pid line comes from its detached child, maybe after ``setsid`` exited; on the channel the
    reply comes at exit, so :func:`remote_deadman.start` waits for the line itself (it came 2 times in 20 before)."""
    for k in range(10):
        mark, pid = remote_deadman.start(h1, f"channel-pid-{k}", ["true"], 30)
        try:
            assert pid is not None and _alive(pid), k
        finally:
            remote_deadman.disarm(h1, mark)
