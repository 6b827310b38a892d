"""The command channel's framing against this machine's own ``sh`` (no SSH, no root): a fake channel feeds a local
``sh -s`` exactly what an SSH exec channel would carry, so replies, failures and their kinds are checked anywhere.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import threading
from collections.abc import Iterator
from typing import IO

import pytest

from chaos.cluster import command_channel
from chaos.cluster.remote_process import remote_command


class _LocalChannel:
    """The parts of a paramiko channel :class:`~chaos.cluster.command_channel.CommandChannel` uses, over a local
    process's pipes (a reader thread per stream)."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
        )
        self._streams: dict[str, queue.Queue[bytes]] = {"out": queue.Queue(), "err": queue.Queue()}
        self._timeout: float | None = None
        self.refuse_send = False
        assert self.proc.stdout is not None and self.proc.stderr is not None
        for name, pipe in (("out", self.proc.stdout), ("err", self.proc.stderr)):
            threading.Thread(target=self._pump, args=(pipe, self._streams[name]), daemon=True).start()

    @staticmethod
    def _pump(pipe: IO[bytes], into: queue.Queue[bytes]) -> None:
        while chunk := os.read(pipe.fileno(), 65536):
            into.put(chunk)
        into.put(b"")

    def send(self, data: bytes) -> int:
        if self.refuse_send:
            raise OSError("Socket is closed")
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()
        return len(data)

    def settimeout(self, timeout: float | None) -> None:
        self._timeout = timeout

    def _recv(self, name: str) -> bytes:
        try:
            chunk = self._streams[name].get(timeout=self._timeout)
        except queue.Empty:
            raise TimeoutError from None
        if chunk == b"":
            self._streams[name].put(b"")  # EOF stays EOF
        return chunk

    def recv(self, _n: int) -> bytes:
        return self._recv("out")

    def recv_stderr(self, _n: int) -> bytes:
        return self._recv("err")

    def recv_ready(self) -> bool:
        return not self._streams["out"].empty()

    def recv_stderr_ready(self) -> bool:
        return not self._streams["err"].empty()

    def close(self) -> None:
        """End the shell and whatever it still runs (its own process group)."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)


@pytest.fixture
def local() -> Iterator[tuple[_LocalChannel, command_channel.CommandChannel]]:
    fake = _LocalChannel(["sh", "-c", command_channel.OPEN_COMMAND])
    try:
        yield fake, command_channel.CommandChannel(fake, "local")  # type: ignore[arg-type]
    finally:
        fake.close()


def test_replies_carry_status_output_and_stderr_whatever_they_hold(
    local: tuple[_LocalChannel, command_channel.CommandChannel],
) -> None:
    fake, channel = local
    assert channel.run(remote_command(["sh", "-c", "printf out; printf err >&2; exit 3"]), 10) == (3, b"out", b"err")
    assert channel.pid == fake.proc.pid  # the login shell's pid line, taken off the first reply
    hostile = "$(touch /nonexistent/x) `id` }\n) ; exit 7\nmlchaos-" + "0" * 32 + " 0\n'\"\\"
    assert channel.run(remote_command(["printf", "%s", hostile]), 10) == (0, hostile.encode(), b"")
    big = "z" * 100_000
    code, out, _ = channel.run(remote_command(["sh", "-c", 'printf %s "$1" | wc -c', "n", big]), 10)
    assert (code, int(out)) == (0, len(big))
    assert channel.run(remote_command(["no-such-command-chaos"]), 10)[0] == 127
    code, out, err = channel.run(
        remote_command(["sh", "-c", "head -c 300000 /dev/zero; head -c 200000 /dev/zero >&2"]), 10
    )
    assert (code, len(out), len(err)) == (0, 300_000, 200_000)
    assert channel.run(remote_command(["echo", "still in step"]), 10) == (0, b"still in step\n", b"")


def test_a_command_sees_no_stdin_and_cannot_eat_the_next_request(
    local: tuple[_LocalChannel, command_channel.CommandChannel],
) -> None:
    _, channel = local
    assert channel.run(remote_command(["cat"]), 10) == (0, b"", b"")  # stdin is /dev/null, not the channel
    assert channel.run(remote_command(["echo", "next"]), 10) == (0, b"next\n", b"")


def test_failures_say_whether_the_command_may_have_run(
    local: tuple[_LocalChannel, command_channel.CommandChannel],
) -> None:
    fake, channel = local
    assert channel.run(remote_command(["true"]), 10)[0] == 0
    with pytest.raises(command_channel.TimedOut) as timed_out:
        channel.run(remote_command(["sleep", "30"]), 0.5)
    assert timed_out.value.pid == fake.proc.pid  # what the transport kills, with its process group

    fake.refuse_send = True
    with pytest.raises(command_channel.NotSent):  # not a byte left: safe to send again elsewhere
        channel.run(remote_command(["true"]), 5)


def test_a_shell_that_dies_under_a_command_is_lost_not_answered(
    local: tuple[_LocalChannel, command_channel.CommandChannel],
) -> None:
    fake, channel = local
    assert channel.run(remote_command(["true"]), 10)[0] == 0
    with pytest.raises(command_channel.Lost):
        channel.run(remote_command(["sh", "-c", "kill -KILL $PPID; sleep 1"]), 10)
    fake.proc.wait(timeout=10)
    assert fake.proc.returncode == -signal.SIGKILL
