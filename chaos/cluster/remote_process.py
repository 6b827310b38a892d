"""What the remote transports (SSH, Docker) share: the shell text they run, their process type, their clock.

Neither transport's client library is imported here, so each transport loads only its own (the Docker
transport never needs paramiko, the SSH one never the Docker SDK).

Contracts worth knowing:

* :func:`remote_command` is the ONE place that turns an argv into text for a remote shell (every word
  through ``shlex.quote``); :func:`spawn_command` adds the constant fragments around it. The shell ``exec``s
  the command, so a reported pid is the command's own.
* :class:`RemoteProcess` behaves like the parts of :class:`subprocess.Popen` the harness uses; signals go
  through the host's own ``kill``, run by the owning transport.
"""

from __future__ import annotations

import io
import re
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol, TypeVar

from chaos.cluster.base import Closing, Completed, Spawner, TransportError, signal_name
from chaos.cluster.inventory import Host

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_POLL_MIN_S = 0.02
_POLL_MAX_S = 0.2
# The long-lived loop that answers each newline on its stdin with the host's clock (see estimate_clock).
CLOCK_LOOP = ["sh", "-c", "while read -r _; do date +%s%N; done"]


def remote_command(
    argv: Sequence[str],
    sudo: bool = False,
    *,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
) -> str:
    """The remote shell text that runs ``argv`` and nothing else: ``[cd -- DIR && ]exec [sudo -n --] [env K=V…] ARGV``.

    Every word is quoted with ``shlex.quote``, so no argument is ever interpreted by the shell. ``exec``
    makes the shell's pid the command's pid. ``env`` names must be identifiers (ValueError otherwise).
    """
    if not argv:
        raise ValueError("an empty argv cannot be run")
    words: list[str] = ["sudo", "-n", "--"] if sudo else []
    if env:
        for name in env:
            if not _ENV_NAME.match(name):
                raise ValueError(f"environment variable name {name!r} is not a valid identifier")
        words += ["env", *(f"{name}={value}" for name, value in env.items())]
    words += list(argv)
    text = "exec " + " ".join(shlex.quote(word) for word in words)
    return f"cd -- {shlex.quote(cwd)} && {text}" if cwd is not None else text


def run_command(argv: Sequence[str], sudo: bool = False) -> str:
    """The shell text for a ``run``: the shell's pid (the command's: it ``exec``s) as the first stderr line,
    so a timed-out command's process group can be killed (:func:`~chaos.cluster.base.kill_reported_group`)."""
    return "echo $$ >&2; " + remote_command(argv, sudo) + " </dev/null"


WATCHER_MARK = "exec 3<&0 </dev/null; echo $$ >&2; "
"""Starts the shell text of a spawn with ``kill_with_parent``: its watcher subshell (a child of the command,
whose command line is this text and the command's own) carries it, so process selectors can skip it."""


def spawn_command(quoted: str, kill_with_parent: int | None, *, sudo: bool = False, guard_parent: bool = False) -> str:
    """The shell text around :func:`remote_command` output ``quoted`` for a spawn: stdin /dev/null, the
    command's pid as the first stderr line, stdout+stderr merged.

    With ``kill_with_parent`` a watcher (a background subshell holding the channel's stdin as fd 3) delivers
    that signal to ``$$`` (the command: the shell exec's it) when stdin ends without a ``done`` line, i.e. the
    harness went away without seeing the exit. ``guard_parent``: signal only while ``$$`` is still the
    watcher's parent, so a finished command's reused pid is never hit (/proc/self/stat field 4 is the ppid;
    field 2, "(sh)", has no spaces).
    """
    if kill_with_parent is None:
        return f"exec </dev/null; echo $$ >&2; {quoted} 2>&1"
    kill = ("sudo -n " if sudo else "") + f"kill -s {signal_name(kill_with_parent)} $$"
    if guard_parent:
        kill = f'read -r _ _ _ ppid _ </proc/self/stat; [ "$ppid" = $$ ] && {kill}'
    return (
        WATCHER_MARK
        + f'{{ while read -r line <&3; do [ "$line" = done ] && exit 0; done; {kill}; }} >/dev/null 2>&1 & '
        f"{quoted} 2>&1 3<&-"
    )


@dataclass(frozen=True)
class ClockEstimate:
    """Host clock vs harness clock: add ``offset_s`` to a host timestamp to put it on the harness timeline.

    The true offset lies within ``offset_s ± error_s`` (half the best round trip), assuming neither clock
    jumped while sampling.
    """

    offset_s: float
    error_s: float
    rtt_s: float
    samples: int


def estimate_clock(host: str, samples: int, ask: Callable[[], str]) -> ClockEstimate:
    """The tightest of ``samples`` round trips of ``ask`` (send a newline to :data:`CLOCK_LOOP`, return its
    reply). Each sample brackets the host's reading between two harness readings, so the midpoint is off by
    at most half that round trip. TransportError when a reply is not a ``date +%s%N`` reading."""
    best: tuple[int, int] | None = None  # (rtt_ns, offset_ns)
    for _ in range(max(1, samples)):
        before = time.time_ns()
        text = ask().strip()
        after = time.time_ns()
        if not text.isdigit():
            raise TransportError(f"{host}: `date +%s%N` printed {text!r}; GNU date is needed for clock sync")
        rtt = after - before
        if best is None or rtt < best[0]:
            best = (rtt, (before + after) // 2 - int(text))
    assert best is not None
    return ClockEstimate(offset_s=best[1] / 1e9, error_s=best[0] / 2e9, rtt_s=best[0] / 1e9, samples=samples)


P = TypeVar("P", bound="RemoteProcess")


class RemoteTransport(Closing, Spawner[P]):
    """What the SSH and Docker transports share around their own connection code: the inventory host,
    its interpreter, the shell text of a spawn, the cached clock offset, the ``with`` block and the shape of
    a finished command. Subclasses provide ``run``, ``put``, ``close``, :meth:`_start` and
    :meth:`clock_estimate`; ``_guard_parent`` says whether the spawn watcher checks its parent (see
    :func:`spawn_command`)."""

    host: str
    spec: Host
    clock_cache_s: float
    _clock: tuple[float, ClockEstimate] | None = None
    _guard_parent = False

    @property
    def python(self) -> str:
        """The interpreter for mlchaos helpers on this host (the inventory's ``python``, else ``python3``)."""
        return self.spec.python or "python3"

    def run(self, argv: list[str], *, timeout: float = 30.0, check: bool = False) -> Completed:
        raise NotImplementedError

    def clock_estimate(self, samples: int = 9) -> ClockEstimate:
        raise NotImplementedError

    def _sudo(self) -> bool:
        """Whether commands run through ``sudo -n`` on the host."""
        return False

    def _spawn(self, argv: list[str], env: dict[str, str] | None, cwd: Path | None, kill_with_parent: int | None) -> P:
        """Start ``argv`` on the host with stdout+stderr merged into the process's ``stdout``; stdin is /dev/null.

        ``env`` is ADDED to the host's (or container's) own environment: the harness's environment means
        nothing there, so pass only what the job needs. ``kill_with_parent``: a watcher on the host delivers
        that signal when the connection (the process's stdin) ends without the harness having seen the
        process exit: harness killed, transport ``close()``d, connection lost.
        """
        quoted = remote_command(argv, self._sudo(), env=env, cwd=str(cwd) if cwd is not None else None)
        command = spawn_command(quoted, kill_with_parent, sudo=self._sudo(), guard_parent=self._guard_parent)
        return self._start(command, list(argv), kill_with_parent is not None)

    def _start(self, command: str, argv: list[str], watched: bool) -> P:
        """Run the shell text ``command`` (from :meth:`_spawn`), read its pid line and return its process;
        TransportError "cannot start" when either fails."""
        raise NotImplementedError

    def clock_offset(self) -> float:
        """Seconds to add to host timestamps to put them on the harness timeline (cached ``clock_cache_s``)."""
        now = time.monotonic()
        if self._clock is None or now - self._clock[0] > self.clock_cache_s:
            self._clock = (now, self.clock_estimate())
        return self._clock[1].offset_s

    def _completed(self, argv: list[str], code: int, out: bytes, stderr: str, check: bool) -> Completed:
        """The :class:`Completed` of a finished command (``stderr`` without the pid line); with ``check`` a
        non-zero exit is a TransportError."""
        done = Completed(tuple(argv), code, out.decode(errors="replace"), stderr)
        if check and not done.ok:
            raise TransportError(f"{shlex.join(argv)} exited {code} on {self.host}: {stderr.strip()[:300]}")
        return done


class _Owner(Protocol):
    """The transport a :class:`RemoteProcess` signals through."""

    host: str

    def run(self, argv: list[str], *, timeout: float = 30.0, check: bool = False) -> Completed: ...


class RemoteProcess:
    """A process started by a remote transport's ``spawn``; behaves like the parts of Popen the harness uses.

    Subclasses provide :meth:`poll` and :meth:`_end_stdin`, and may replace :meth:`_await_exit` (the default
    polls with a growing pause). Signals go through the host's own ``kill``, run by ``owner``.
    """

    def __init__(self, owner: _Owner, pid: int, argv: list[str], watched: bool, raw_stdout: io.RawIOBase) -> None:
        self._owner = owner
        self._pid = pid
        self._argv = argv
        self._watched = watched
        self._released = False
        self._stdout: IO[bytes] = io.BufferedReader(raw_stdout)

    @property
    def pid(self) -> int:
        """The process id in the host's (or container's) pid namespace, what ``kill`` there understands."""
        return self._pid

    @property
    def stdout(self) -> IO[bytes]:
        """stdout and stderr merged, readable line by line; EOF once the process and its children close it."""
        return self._stdout

    def poll(self) -> int | None:
        """The exit code (``-signum`` if killed by a signal), None while running, -1 when its fate is unknown."""
        raise NotImplementedError

    def wait(self, timeout: float | None = None) -> int:
        """Block until exit; subprocess.TimeoutExpired after ``timeout`` seconds (the process keeps running)."""
        if not self._await_exit(timeout):
            raise subprocess.TimeoutExpired(self._argv, timeout or 0.0)
        code = self.poll()
        assert code is not None
        return code

    def _await_exit(self, timeout: float | None) -> bool:
        """Whether the process exited within ``timeout`` seconds (None: wait for ever)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = _POLL_MIN_S
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(pause if deadline is None else max(0.0, min(pause, deadline - time.monotonic())))
            pause = min(_POLL_MAX_S, pause * 1.5)
        return True

    def send_signal(self, signum: int) -> None:
        """Deliver ``signum`` through the host's ``kill``; a process that already exited is left alone."""
        if self.poll() is not None:
            return
        done = self._owner.run(["kill", "-s", signal_name(signum), "--", str(self._pid)], timeout=30)
        if not done.ok and self.poll() is None:
            raise TransportError(f"cannot signal pid {self._pid} on {self._owner.host}: {done.stderr.strip()}")

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _release_watcher(self) -> None:
        # The host-side watcher signals the process when stdin hits EOF (harness gone); "done" tells it the
        # exit was seen, so it leaves quietly instead of signalling a pid that may be reused.
        if self._watched and not self._released:
            self._released = True
            self._end_stdin(b"done\n")

    def _end_stdin(self, last: bytes) -> None:
        """Send ``last`` on the process's stdin, then close it; connection errors are swallowed."""
        raise NotImplementedError
