"""One long-lived command channel per SSH host: a plain ``sh`` reading its commands from the channel, so a
command costs no new SSH session (no sshd fork, no login shell, no channel open and close round trips).

The protocol needs nothing on the host but a POSIX ``sh``:

* The channel runs :data:`OPEN_COMMAND`: the login shell prints its pid (the first stdout line, so a timed-out
  command can be killed with its process group) and ``exec``s ``sh -s mlchaos-command-channel``, which reads
  its script from the channel's stdin and runs each complete command as it arrives. ``sh`` reads its script in
  blocks, so a large request costs no per-byte ``read``.
* A request is ONE brace group: the command's shell text (from
  :func:`~chaos.cluster.remote_process.remote_command`, the one place an argv becomes shell text: every word
  through ``shlex.quote``) run in a subshell with stdin from /dev/null, then two sentinels carrying a fresh
  random marker: ``\\n<marker> <exit status>\\n`` on stdout and ``\\n<marker>\\n`` on stderr. The shell runs
  nothing before the closing ``}`` has arrived; but at EOF a request missing only its last newline is whole,
  so a request is sent again (on a new channel) only when not one byte of it left: else its fate is unknown.
* One request in flight per channel (the caller's lock); the reply is what the channel carried before the
  sentinels. The marker is 128 random bits drawn per request, so no output forges it.

What differs from one session per command: the reply comes when the command exits, not when its output closes
(a detached child's later output is not part of it: dropped, unless it arrives while a later request runs), and a death by signal reads as ``128 + signum`` (``sh``'s
``$?``), not ``-signum``. When the harness goes away (``close()``, a dropped connection, a killed harness) the
shell reads EOF and exits: nothing is left on the host.
"""

from __future__ import annotations

import time
import uuid

import paramiko

from chaos.cluster.base import TransportError

LOOP_NAME = "mlchaos-command-channel"
OPEN_COMMAND = f"echo $$; exec sh -s {LOOP_NAME}"
_POLL_S = 0.05
_CHUNK = 65536


class NotSent(TransportError):
    """Not one byte of the request left, so it did not run: safe to send again."""


class Lost(TransportError):
    """The channel closed while a request was in flight: whether the command ran is unknown."""


class TimedOut(TransportError):
    """No reply within the timeout; ``pid`` is the shell's (its process group holds the command), if known."""

    def __init__(self, message: str, pid: int | None) -> None:
        super().__init__(message)
        self.pid = pid


def request_text(command: str, marker: str) -> str:
    """The text of one request: ``command`` (shell text from ``remote_command``) in a subshell, then the
    sentinels. ``marker`` is letters, digits and dashes only (it is not quoted)."""
    return f"{{ ( {command} ) </dev/null; printf '\\n%s %s\\n' {marker} \"$?\"; printf '\\n%s\\n' {marker} >&2; }}\n"


class CommandChannel:
    """The long-lived shell on one host, behind an open paramiko channel. Not thread-safe: one request at a
    time (the owning transport holds a lock)."""

    def __init__(self, channel: paramiko.Channel, host: str) -> None:
        self._channel = channel
        self.host = host
        self.pid: int | None = None
        self._out = bytearray()
        self._err = bytearray()

    @classmethod
    def open(cls, transport: paramiko.Transport, host: str, timeout: float) -> CommandChannel:
        """Start the shell on a new session of ``transport``; does not wait for it (its pid line comes with
        the first reply). Raises what opening a session raises."""
        channel = transport.open_session(timeout=timeout)
        try:
            channel.exec_command(OPEN_COMMAND)
        except BaseException:
            channel.close()
            raise
        return cls(channel, host)

    def usable(self, transport: paramiko.Transport) -> bool:
        """Whether a request can be sent: open, on ``transport`` (the live connection), shell not gone."""
        channel = self._channel
        return (
            not channel.closed
            and not channel.eof_received
            and not channel.exit_status_ready()
            and channel.get_transport() is transport
            and transport.is_active()
        )

    def close(self) -> None:
        """Close the channel: the shell reads EOF and exits (after the command it runs, if any)."""
        self._channel.close()

    def run(self, command: str, timeout: float) -> tuple[int, bytes, bytes]:
        """Run the shell text ``command``; (exit status, stdout, stderr). Raises :class:`NotSent` (nothing ran),
        :class:`Lost` or :class:`TimedOut` (the command may have run; the channel must not be reused)."""
        marker = "mlchaos-" + uuid.uuid4().hex
        deadline = time.monotonic() + timeout
        self._discard_stale()
        data = request_text(command, marker).encode()
        sent = 0
        self._channel.settimeout(max(0.1, deadline - time.monotonic()))  # a full window waits, up to the deadline
        try:
            while sent < len(data):
                step = self._channel.send(data[sent:])
                if step <= 0:  # paramiko's answer once the channel is at EOF or closed
                    raise EOFError("the channel is closed")
                sent += step
        except TimeoutError:
            if sent == 0:
                raise NotSent(f"the command channel on {self.host} took nothing in {timeout:.0f}s") from None
            raise TimedOut(f"the command channel on {self.host} stopped reading a request", self.pid) from None
        except (OSError, EOFError, paramiko.SSHException) as exc:
            kind = NotSent if sent == 0 else Lost
            raise kind(f"cannot send to the command channel on {self.host}: {exc}") from None
        out_end = b"\n" + marker.encode() + b" "
        while True:
            self._take_pid()
            at = self._out.find(out_end) if self.pid is not None else -1
            line_end = self._out.find(b"\n", at + len(out_end)) if at >= 0 else -1
            if line_end >= 0:
                break
            self._wait(deadline, stdout=True)
        status_text = bytes(self._out[at + len(out_end) : line_end]).strip()
        out = bytes(self._out[:at])
        del self._out[: line_end + 1]
        err_end = b"\n" + marker.encode() + b"\n"
        while (where := self._err.find(err_end)) < 0:
            self._wait(deadline, stdout=False)
        err = bytes(self._err[:where])
        del self._err[: where + len(err_end)]
        if not status_text.isdigit():
            raise Lost(f"the command channel on {self.host} replied {status_text!r} for an exit status")
        return int(status_text), out, err

    def _take_pid(self) -> None:
        if self.pid is None and b"\n" in self._out:
            first, _, rest = bytes(self._out).partition(b"\n")
            if not first.strip().isdigit():
                raise Lost(f"the command channel on {self.host} did not start: {first[:200]!r}")
            self.pid = int(first)
            self._out[:] = rest

    def _discard_stale(self) -> None:
        """Drop what came after the last reply (output of a detached child of an earlier command)."""
        channel = self._channel
        while channel.recv_ready():
            self._out += channel.recv(_CHUNK)
        while channel.recv_stderr_ready():
            self._err += channel.recv_stderr(_CHUNK)
        self._take_pid()
        if self.pid is not None:
            self._out.clear()
        self._err.clear()

    def _wait(self, deadline: float, *, stdout: bool) -> None:
        """Receive more of stdout (``stdout``, draining stderr meanwhile so no window stalls) or of stderr;
        :class:`Lost` at EOF, :class:`TimedOut` past ``deadline``."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimedOut(f"no reply from the command channel on {self.host}", self.pid)
        channel = self._channel
        channel.settimeout(min(_POLL_S, left))
        try:
            chunk = channel.recv(_CHUNK) if stdout else channel.recv_stderr(_CHUNK)
        except TimeoutError:
            chunk = None
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise Lost(f"the command channel on {self.host} failed: {exc}") from None
        if chunk == b"":
            raise Lost(f"the command channel on {self.host} closed")
        if chunk is not None:
            (self._out if stdout else self._err).extend(chunk)
        if stdout:
            while channel.recv_stderr_ready():
                self._err += channel.recv_stderr(_CHUNK)
