"""The dead-man switch: a detached process that reverts a fault if nobody else healed it in time.

:func:`arm` starts ``python -m chaos.safety.deadman`` fully detached from the harness (own session, stdio on a log
file, no inherited fds, re-parented away from the harness by a double fork), so a SIGKILLed harness, a closed
terminal or a crashed CI runner cannot take it down. It sleeps until its deadline, then, unless the journal
already records the op as healed, runs the revert argv (never a shell) and appends ``healed(by="deadman")``
(or ``failed`` when the revert command fails, leaving the op to cleanup). While it sleeps it re-reads the
journal: :func:`rearm` (a later ``deadman`` record with its pid) moves its deadline, which is how a live
harness keeps a duration-less fault's switch from firing under it. The last read comes right at the deadline,
so a re-arm journaled any time before it counts.

SIGTERM is the cancel signal: before firing, the dead-man exits quietly without reverting. Once it fires it
blocks SIGTERM until the revert and its journal record are done, so a late disarm never tears that pair.
:func:`disarm` checks ``/proc/<pid>/cmdline`` first, so a recycled pid is never signalled.

The same double-fork handshake (:func:`detach`, :func:`start_detached`) starts other host-side helpers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from chaos.cluster.base import Transport, TransportError

MODULE = "chaos.safety.deadman"
PID_PREFIX = "MLCHAOS_PID "
POLL_S = 2.0  # how often a sleeping dead-man re-reads the journal to retire early once the op is healed
REVERT_TIMEOUT_S = 60.0
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]


def python_env() -> dict[str, str]:
    """The environment for ``python -m`` helpers: ours, with this checkout importable even when not installed."""
    env = dict(os.environ)
    parts = [str(_PACKAGE_ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(parts))
    return env


def detach(log_path: Path | None) -> None:
    """Daemonize the calling (single-threaded) helper; only the detached grandchild returns.

    The parent prints ``MLCHAOS_PID <pid>`` on stdout and exits, so whoever started it learns the pid of
    the process that will outlive it, and that process is re-parented to init instead of lingering as the
    harness's child (and then as its zombie). The grandchild gets a new session, ``/`` as cwd and stdio on
    ``log_path`` (or /dev/null), which also closes the pipe its starter reads to EOF.
    """
    sys.stdout.flush()
    child = os.fork()
    if child:
        os.write(1, f"{PID_PREFIX}{child}\n".encode())
        os._exit(0)
    os.setsid()
    os.chdir("/")
    null = os.open(os.devnull, os.O_RDONLY)
    if log_path is not None:
        out = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    else:
        out = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(null)
    os.close(out)


def parse_pid(output: str) -> int | None:
    """The pid announced by :func:`detach` in a helper's stdout, if any."""
    for line in output.splitlines():
        if line.startswith(PID_PREFIX):
            return int(line[len(PID_PREFIX) :].strip())
    return None


def spawn_helper(
    transport: Transport, argv: list[str], *, what: str, env: dict[str, str] | None = None, timeout: float = 30.0
) -> int:
    """Start a self-detaching helper (one that calls :func:`detach`) on the transport's host; return its pid.

    Waits for the starter to exit and reads the announced pid. InjectionError names ``what`` when the helper
    cannot be started or does not announce itself.
    """
    from chaos.plugins.injector import InjectionError

    try:
        proc = transport.spawn(argv, env=env)
        code = proc.wait(timeout=timeout)
        output = ""
        if proc.stdout is not None:
            with proc.stdout:
                output = proc.stdout.read().decode(errors="replace")
    except (TransportError, OSError) as exc:
        raise InjectionError(f"cannot start the {what} on {transport.host}: {exc}") from exc
    helper = parse_pid(output)
    if code != 0 or helper is None:
        raise InjectionError(f"{what} failed to start (exit {code}): {output.strip()[-300:]}")
    return helper


def start_detached(argv: list[str], *, timeout: float = 30.0) -> int:
    """Run a helper that calls :func:`detach` and return the pid of its detached process."""
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        close_fds=True,
        env=python_env(),
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise RuntimeError(f"{argv[2] if len(argv) > 2 else argv[0]} did not start within {timeout:.0f}s") from None
    pid = parse_pid(out.decode(errors="replace"))
    if proc.returncode != 0 or pid is None:
        raise RuntimeError(f"{' '.join(argv[:3])} failed to start (exit {proc.returncode}): {out.decode()[-500:]}")
    return pid


def command(journal_path: Path, op_id: str, revert_argv: Sequence[str], fires_at_ns: int) -> list[str]:
    """The argv of a dead-man for ``op_id`` (its cmdline is also how :func:`disarm` recognises it)."""
    return [
        sys.executable,
        "-m",
        MODULE,
        "--journal",
        str(Path(journal_path).absolute()),
        "--op-id",
        op_id,
        "--fires-at-ns",
        str(fires_at_ns),
        "--",
        *revert_argv,
    ]


def arm(journal_path: Path, op_id: str, revert_argv: Sequence[str], fires_in_s: float) -> int:
    """Start a detached dead-man that runs ``revert_argv`` in ``fires_in_s`` unless ``op_id`` is healed first.

    Journals ``deadman(op_id, pid, fires_at_ns)`` and returns the pid. Raises ValueError for an empty argv
    or a negative delay, RuntimeError when the process cannot start.
    """
    if not revert_argv:
        raise ValueError("a dead-man needs a non-empty revert argv")
    if fires_in_s < 0:
        raise ValueError(f"fires_in_s must not be negative, got {fires_in_s}")
    from chaos.safety.journal import Journal  # here: the journal imports injector models, the helper needs none

    fires_at_ns = time.time_ns() + int(fires_in_s * 1e9)
    pid = start_detached(command(journal_path, op_id, revert_argv, fires_at_ns))
    Journal(journal_path, owner=False).deadman(op_id, pid, fires_at_ns)
    return pid


def rearm(journal_path: Path, op_id: str, pid: int, fires_in_s: float) -> int:
    """Move the deadline of ``op_id``'s running dead-man ``pid`` to ``fires_in_s`` from now; returns the new
    deadline (wall-clock ns). The dead-man picks it up from the journal on its next read (at the latest, just
    before it would fire). ValueError for a negative delay."""
    if fires_in_s < 0:
        raise ValueError(f"fires_in_s must not be negative, got {fires_in_s}")
    from chaos.safety.journal import Journal

    fires_at_ns = time.time_ns() + int(fires_in_s * 1e9)
    Journal(journal_path, owner=False).deadman(op_id, pid, fires_at_ns)
    return fires_at_ns


def _cmdline(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            raw = handle.read()
    except OSError:
        return None
    return [part.decode(errors="replace") for part in raw.split(b"\0")[:-1]] if raw else None


def module_of(argv: list[str]) -> str | None:
    """The ``-m`` module an argv runs, if it is a ``python -m`` command line."""
    for index, part in enumerate(argv[:-1]):
        if part == "-m":
            return argv[index + 1]
        if part == "--":
            return None
    return None


def option(argv: list[str], name: str) -> str | None:
    """The value after ``name`` in ``argv`` (before any ``--``), or None."""
    for index, part in enumerate(argv[:-1]):
        if part == "--":
            return None
        if part == name:
            return argv[index + 1]
    return None


def is_helper(pid: int, module: str, op_id: str | None = None) -> bool:
    """Whether ``pid`` runs ``python -m <module>`` (for ``op_id`` when given), read from /proc/<pid>/cmdline."""
    argv = _cmdline(pid)
    if argv is None or module_of(argv) != module:
        return False
    return op_id is None or option(argv, "--op-id") == op_id


def is_deadman(pid: int, op_id: str | None = None) -> bool:
    """Whether ``pid`` is a live mlchaos dead-man (for ``op_id`` when given)."""
    return is_helper(pid, MODULE, op_id)


def terminate_helper(pid: int, module: str, op_id: str | None = None, *, wait_s: float = 5.0) -> bool:
    """SIGTERM ``pid`` only if it is our ``module`` helper, then wait up to ``wait_s`` for it to end.

    True when it was ours and was signalled; False when it is gone or is some other process (never touched).
    """
    if not is_helper(pid, module, op_id):
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + wait_s
    # A zombie has an empty cmdline, so "not our helper any more" also covers exited-but-unreaped.
    while time.monotonic() < deadline and is_helper(pid, module, op_id):
        time.sleep(0.02)
    return True


def disarm(pid: int, op_id: str | None = None, *, wait_s: float = 5.0) -> bool:
    """Cancel the dead-man ``pid`` (checked to be one, for ``op_id`` when given) so it never reverts.

    True when it was signalled; False when the pid is gone or belongs to another process, which is then
    left alone. Waits up to ``wait_s`` for it to exit (a dead-man already firing finishes its revert first).
    """
    return terminate_helper(pid, MODULE, op_id, wait_s=wait_s)


# -- the dead-man process itself -----------------------------------------------------------------------------


def _log(message: str) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    print(f"{stamp} deadman[{os.getpid()}] {message}", flush=True)


def _find_journal(path: Path) -> Path | None:
    """The journal, also after cleanup moved it to ``done/``."""
    for candidate in (path, path.parent / "done" / path.name):
        if candidate.exists():
            return candidate
    return None


def _status(path: Path, op_id: str) -> tuple[str | None, int | None]:
    """(who healed ``op_id``, our latest journaled deadline): (None, None) when the journal is gone."""
    from chaos.safety.journal import Journal

    found = _find_journal(path)
    return Journal(found, owner=False).deadman_status(op_id, os.getpid()) if found else (None, None)


def _fire(journal_path: Path, op_id: str, revert: list[str]) -> int:
    from chaos.safety.journal import HEALED_BY_DEADMAN, Journal

    # Past this point a disarm must not split "reverted" from "recorded as reverted".
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        done = subprocess.run(
            revert, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=REVERT_TIMEOUT_S, check=False
        )
        rc, detail = done.returncode, (done.stderr or done.stdout).strip()[:300]
    except (OSError, subprocess.TimeoutExpired) as exc:
        rc, detail = -1, str(exc)
    found = _find_journal(journal_path)
    if found is None:
        _log(f"{op_id}: reverted (exit {rc}) but journal {journal_path} is gone; nothing recorded")
        return 0 if rc == 0 else 1
    journal = Journal(found, owner=False)
    if rc == 0:
        journal.healed(op_id, HEALED_BY_DEADMAN)
        _log(f"{op_id}: reverted with {revert}")
        return 0
    journal.failed(op_id, f"dead-man revert {revert} exited {rc}: {detail}")
    _log(f"{op_id}: revert {revert} FAILED (exit {rc}): {detail}")
    return 1


def main(argv: list[str]) -> int:
    """``python -m chaos.safety.deadman --journal P --op-id ID --fires-at-ns N [--foreground] -- REVERT...``."""
    if "--" not in argv:
        print(
            "usage: python -m chaos.safety.deadman --journal P --op-id ID --fires-at-ns N -- REVERT...", file=sys.stderr
        )
        return 2
    split = argv.index("--")
    options, revert = argv[:split], argv[split + 1 :]
    journal_text, op_id, fires_text = (option(options, name) for name in ("--journal", "--op-id", "--fires-at-ns"))
    if not (journal_text and op_id and fires_text and revert):
        print("chaos.safety.deadman: --journal, --op-id, --fires-at-ns and a revert argv are required", file=sys.stderr)
        return 2
    journal_path, fires_at_ns = Path(journal_text), int(fires_text)
    if "--foreground" not in options:
        detach(journal_path.parent / "deadman.log")
    # SIGTERM = disarm: leave without reverting. Other terminal signals cannot reach our own session.
    signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(0))
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    _log(f"{op_id}: armed, fires in {(fires_at_ns - time.time_ns()) / 1e9:.1f}s: {revert}")
    while True:
        by, deadline = _status(journal_path, op_id)
        if by is not None:
            _log(f"{op_id}: healed by {by}, retiring")
            return 0
        if deadline is not None and deadline != fires_at_ns:
            fires_at_ns = deadline  # re-armed by a live harness
            _log(f"{op_id}: re-armed, fires in {(fires_at_ns - time.time_ns()) / 1e9:.1f}s")
        remaining = fires_at_ns - time.time_ns()
        if remaining <= 0:
            return _fire(journal_path, op_id, revert)
        time.sleep(min(remaining / 1e9, POLL_S))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
