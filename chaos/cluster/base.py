"""The Transport protocol every host access goes through, the small value types it returns, the one way a
child this machine starts is tied to its parent's life (:func:`die_with_parent`), and :class:`Closing`, the
``with`` block of what holds a connection or a file (transports, the journal, the run store)."""

from __future__ import annotations

import ctypes
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Generic, Protocol, Self, TypeVar, runtime_checkable

from chaos.kernel.procfs import parse_stat

_PR_SET_PDEATHSIG = 1


def die_with_parent(signum: int = signal.SIGTERM) -> None:
    """Ask the kernel to send ``signum`` to this process when its parent dies, even by SIGKILL. Call it in a
    child, between fork and exec (``Popen(preexec_fn=...)``). The parent is the THREAD that forked: a child
    started from a thread that ends before it is signalled then."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)


class Closing:
    """``with thing:`` returns ``thing`` and calls its :meth:`close` when the block ends, however it ends
    (an exception still propagates). A subclass says what closing releases."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TransportError(RuntimeError):
    """A command could not be run on a host at all (not: it ran and exited non-zero)."""


@dataclass(frozen=True)
class Completed:
    """A finished command: exit code and captured text."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


class HostProcess(Protocol):
    """A process started on a host by :meth:`Transport.spawn`."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, signum: int) -> None: ...

    @property
    def stdout(self) -> IO[bytes] | None: ...


class Transport(Protocol):
    """Runs argv lists (never shell strings) on one host."""

    host: str

    def run(self, argv: list[str], *, timeout: float = 30.0, check: bool = False) -> Completed:
        """Run to completion; raise TransportError on timeout or when ``check`` and the exit code is non-zero."""
        ...

    def spawn(
        self,
        argv: list[str],
        *,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        kill_with_parent: int | None = None,
    ) -> HostProcess:
        """Start ``argv`` in its own session with stdout+stderr piped; ``kill_with_parent`` is a signal
        delivered to it if the harness dies (so a SIGKILLed harness does not orphan a training job)."""
        ...

    def put(self, data: bytes, path: str) -> None:
        """Write ``data`` to ``path`` on the host atomically."""
        ...

    def clock_offset(self) -> float:
        """Seconds to add to host timestamps to put them on the harness timeline."""
        ...


_Proc = TypeVar("_Proc", covariant=True)


class Spawner(Generic[_Proc]):
    """The keyword surface of :meth:`Transport.spawn`, written once for the transports that implement it
    (here and remote): each says only how it starts ``argv``, in :meth:`_spawn`."""

    def spawn(
        self,
        argv: list[str],
        *,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        kill_with_parent: int | None = None,
    ) -> _Proc:
        """See :meth:`Transport.spawn`; the subclass's :meth:`_spawn` says what its process is."""
        return self._spawn(argv, env, cwd, kill_with_parent)

    def _spawn(
        self, argv: list[str], env: dict[str, str] | None, cwd: Path | None, kill_with_parent: int | None
    ) -> _Proc:
        """Start ``argv`` as :meth:`spawn` promises, the transport's own way."""
        raise NotImplementedError


def signal_name(signum: int) -> str:
    """``15`` -> ``TERM``: names, not numbers, for a host's ``kill`` (numbers differ between architectures)."""
    return signal.Signals(signum).name.removeprefix("SIG")


def host_python(transport: Transport) -> str:
    """The interpreter that runs mlchaos helpers on the transport's host: the harness's own locally, the
    inventory's ``python`` for that host elsewhere (default ``python3``, which must be able to import mlchaos)."""
    python = getattr(transport, "python", None)
    return python if isinstance(python, str) and python else "python3"


@runtime_checkable
class ReadsHostFiles(Protocol):
    """Optional capability: a transport that reads a host file directly (no ``cat`` round trip)."""

    def read_file(self, path: str) -> str | None: ...


def read_host_file(transport: Transport, path: str) -> str | None:
    """The text of a small (pseudo-)file on the transport's host (``/proc``, cgroup files), or None if unreadable.

    Transports with :class:`ReadsHostFiles` (the local one) read it directly; others through ``cat`` (present
    on any host we can reach)."""
    if isinstance(transport, ReadsHostFiles):
        return transport.read_file(path)
    done = transport.run(["cat", path], timeout=15)
    return done.stdout if done.ok else None


def pid_start_time(transport: Transport, pid: int) -> int | None:
    """The kernel start time of ``pid`` on the transport's host (to tell a pid from its reuse); None if gone."""
    parsed = parse_stat(read_host_file(transport, f"/proc/{pid}/stat") or "")
    return None if parsed is None else parsed.start_time


def kill_if_same(
    transport: Transport, pids: dict[int, int | None], signals: tuple[str, ...] = ("CONT", "KILL")
) -> None:
    """Send ``signals`` (in order) to each pid whose start time is still the recorded one; never raises."""
    alive = [str(pid) for pid, start in pids.items() if start is not None and pid_start_time(transport, pid) == start]
    for name in signals if alive else ():
        try:
            transport.run(["kill", "-s", name, *alive], timeout=15)
        except TransportError:
            return


def kill_reported_group(transport: Transport, stderr: bytes) -> None:
    """SIGKILL the process group of a timed-out command that reported its pid as the first stderr line (the
    transports' ``echo $$ >&2`` wrapper; the command leads its own session). Never raises: the timeout is the
    error worth reporting."""
    first = stderr.split(b"\n", 1)[0].strip()
    if first.isdigit():
        try:
            # "-KILL", not "-s KILL": procps kill reads "-s KILL -- -N" as signal N when N <= 64 (small pids
            # are the rule in containers).
            transport.run(["kill", "-KILL", "--", f"-{int(first)}"], timeout=10)
        except TransportError:
            pass
