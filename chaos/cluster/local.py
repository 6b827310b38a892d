"""The local transport: this machine, through subprocess with argv lists."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from chaos.cluster.base import Completed, Spawner, TransportError, die_with_parent
from chaos.kernel.procfs import read_stat


class HereTransport(Spawner["subprocess.Popen[bytes]"]):
    """``run``/``spawn``/``put`` for transports whose commands are processes of this machine: this machine
    itself (:class:`LocalTransport`) or one of its network namespaces (:class:`~chaos.cluster.netns.NetnsTransport`).

    Subclasses say how this machine runs an argv (:meth:`argv`), how messages name the host
    (:meth:`_where`), and may refuse a result that means the command never ran (:meth:`_check_ran`).
    """

    host: str

    def argv(self, argv: list[str]) -> list[str]:
        """``argv`` as this machine runs it (itself, here)."""
        return argv

    def _where(self) -> str:
        return f"on {self.host}"

    def _launch_error(self, argv: list[str], exc: OSError) -> TransportError:
        """The error when this machine cannot start the command at all."""
        return TransportError(f"cannot run {argv[0]} {self._where()}: {exc}")

    def _check_ran(self, argv: list[str], proc: subprocess.CompletedProcess[str]) -> None:
        """Raise TransportError when ``proc`` says ``argv`` never ran (nothing to check here)."""

    def run(self, argv: list[str], *, timeout: float = 30.0, check: bool = False) -> Completed:
        """Run to completion; raise TransportError when it cannot run, on timeout, or when ``check`` and
        the exit code is non-zero."""
        wrapped = self.argv(argv)
        try:
            proc = subprocess.run(wrapped, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired as exc:
            raise TransportError(f"{argv[0]} timed out after {timeout:.0f}s {self._where()}") from exc
        except OSError as exc:
            raise self._launch_error(argv, exc) from exc
        self._check_ran(argv, proc)
        done = Completed(tuple(argv), proc.returncode, proc.stdout, proc.stderr)
        if check and not done.ok:
            raise TransportError(
                f"{' '.join(argv)} exited {proc.returncode} {self._where()}: {proc.stderr.strip()[:300]}"
            )
        return done

    def _spawn(
        self, argv: list[str], env: dict[str, str] | None, cwd: Path | None, kill_with_parent: int | None
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` in its own session, stdout+stderr piped; the returned process IS the command (its
        pid, its exit code, its signals: ``ip netns exec`` execs it in place), which ``kill_with_parent``
        and callers that signal it rely on."""
        preexec = None
        if kill_with_parent is not None:
            death = kill_with_parent

            def preexec() -> None:
                die_with_parent(death)

        wrapped = self.argv(argv)
        try:
            return subprocess.Popen(
                wrapped,
                env=env,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=preexec,
            )
        except OSError as exc:
            raise TransportError(f"cannot start {wrapped[0]} {self._where()}: {exc}") from exc

    def put(self, data: bytes, path: str) -> None:
        """Write ``data`` to ``path`` atomically (a namespace shares this machine's filesystem)."""
        target = Path(path)
        tmp = target.with_name(f".{target.name}.tmp{os.getpid()}")
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)

    def clock_offset(self) -> float:
        """Always 0: this machine's (and its namespaces') kernel clock is the harness's."""
        return 0.0


class LocalTransport(HereTransport):
    """Runs commands on the harness's own host."""

    host = "local"
    python = sys.executable  # helpers run with the harness's own interpreter (and its packages)

    def read_file(self, path: str) -> str | None:
        """The text of a file on this machine, or None if unreadable (:class:`~chaos.cluster.base.ReadsHostFiles`)."""
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                return handle.read()
        except OSError:
            return None


def process_start_time(pid: int) -> int | None:
    """The kernel's start time of ``pid`` (clock ticks since boot), to tell a pid from its reuse; None if gone."""
    stat = read_stat(pid)
    return None if stat is None else stat.start_time


def process_state(pid: int) -> str | None:
    """One-letter state of ``pid`` (R, S, T for stopped, Z …), or None when it no longer exists."""
    stat = read_stat(pid)
    return None if stat is None else stat.state


def signal_number(name: str | int) -> int:
    """``SIGKILL``/``KILL``/``9`` -> 9; ValueError naming the valid spellings otherwise."""
    if isinstance(name, int):
        return name
    text = name.upper()
    if text.isdigit():
        return int(text)
    if not text.startswith("SIG"):
        text = "SIG" + text
    try:
        return int(signal.Signals[text])
    except KeyError:
        raise ValueError(f"unknown signal {name!r}; use a name such as SIGKILL, SIGTERM or SIGSTOP") from None
