"""The ``torn_write`` watcher: a detached helper on the fault's host that kills a checkpoint writer mid-file.

``python -m injectors.checkpoint.tear --op-id ID --dir D --files PATTERN --pids P[,P...] --at-bytes N
--delay-us U --until-ns T --status S [--log L]``

1. ``strace`` attaches to the writer processes ``--pids`` (the job's ranks) and holds each of their write
   system calls (``write``, ``writev``, ``pwrite64``, ``pwritev``) for ``U`` microseconds before it runs: storage
   that takes a moment per write, as a network filesystem does. Nothing else about the process changes.
2. The watcher looks, every millisecond, at the files those processes hold open FOR WRITING under ``D`` whose
   name or relative path matches ``PATTERN``. As soon as one has reached ``N`` bytes, the process holding it gets
   SIGKILL: the save is cut mid-file, between two of the writer's own writes, exactly as a crash would cut it.
3. strace detaches (SIGTERM: its tracees run on untouched) and the status file ``S`` says what was torn:
   ``{"phase": "done", "torn": {path, size, at_bytes, pid, ts_ns}}`` (``torn`` null when no writer reached N
   bytes before ``T``, the host clock's deadline, or before heal stopped the watcher with SIGTERM).

The job is not asked to cooperate and cannot tell; only the kill is ours, and the bytes on disk are the
writer's own. Linux only (``/proc``, ptrace: root or ``CAP_SYS_PTRACE``).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

from chaos.cluster.base import die_with_parent
from chaos.kernel.procfs import read_stat
from chaos.safety.deadman import detach

MODULE = "injectors.checkpoint.tear"
WRITE_SYSCALLS = "write,writev,pwrite64,pwritev"
_POLL_S = 0.001
_ATTACH_S = 0.3  # strace attaches within this (it prints nothing with -qq, so we wait instead of reading)
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR


def strace_argv(pids: list[int], delay_us: int) -> list[str]:
    """strace attached to ``pids`` (their main threads), delaying each write system call by ``delay_us``."""
    argv = ["strace", "-qq", "-o", "/dev/null", "-e", f"trace={WRITE_SYSCALLS}"]
    argv += ["-e", f"inject={WRITE_SYSCALLS}:delay_enter={delay_us}"]
    for pid in pids:
        argv += ["-p", str(pid)]
    return argv


def _open_for_write(pid: int, directory: str, pattern: str) -> list[str]:
    """Files under ``directory`` matching ``pattern`` that ``pid`` holds open for writing."""
    found: list[str] = []
    base = f"/proc/{pid}/fd"
    try:
        fds = os.listdir(base)
    except OSError:
        return found
    prefix = directory.rstrip("/") + "/"
    for fd in fds:
        try:
            target = os.readlink(f"{base}/{fd}")
        except OSError:
            continue
        if not target.startswith(prefix):
            continue
        relative = target[len(prefix) :]
        if not (fnmatch.fnmatchcase(relative, pattern) or fnmatch.fnmatchcase(os.path.basename(target), pattern)):
            continue
        try:
            with open(f"/proc/{pid}/fdinfo/{fd}", encoding="ascii") as info:
                flags = next((int(line.split()[1], 8) for line in info if line.startswith("flags:")), 0)
        except (OSError, ValueError):
            continue
        if flags & _WRITE_FLAGS:
            found.append(target)
    return found


def _alive(pid: int) -> bool:
    stat = read_stat(pid)
    return stat is not None and not stat.zombie


def _write_status(path: str, status: dict[str, Any]) -> None:
    tmp = f"{path}.tmp"
    Path(tmp).write_text(json.dumps(status), encoding="utf-8")
    os.replace(tmp, path)


def watch(
    directory: str, pattern: str, pids: list[int], at_bytes: int, until_ns: int, stop: list[bool]
) -> dict[str, Any] | None:
    """Poll until a watched process holds a matching file of >= ``at_bytes``; kill it; return what was torn."""
    while time.time_ns() < until_ns and not stop[0]:
        for pid in pids:
            for path in _open_for_write(pid, directory, pattern):
                try:
                    size = os.stat(path).st_size
                except OSError:
                    continue
                if size < at_bytes:
                    continue
                killed_ns = time.time_ns()
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    continue
                deadline = time.monotonic() + 5.0
                while _alive(pid) and time.monotonic() < deadline:
                    time.sleep(0.01)
                try:
                    final = os.stat(path).st_size
                except OSError:
                    final = size
                return {
                    "path": path,
                    "size": final,
                    "seen_size": size,
                    "at_bytes": at_bytes,
                    "pid": pid,
                    "ts_ns": killed_ns,
                }
        time.sleep(_POLL_S)
    return None


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}")
    parser.add_argument("--op-id", required=True)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--files", required=True)
    parser.add_argument("--pids", required=True)
    parser.add_argument("--at-bytes", type=int, required=True)
    parser.add_argument("--delay-us", type=int, required=True)
    parser.add_argument("--until-ns", type=int, required=True)
    parser.add_argument("--status", required=True)
    parser.add_argument("--log", type=Path, default=None)
    args = parser.parse_args(argv)
    pids = [int(p) for p in args.pids.split(",") if p]
    detach(args.log)
    stop = [False]

    def on_term(signum: int, frame: FrameType | None) -> None:
        stop[0] = True

    signal.signal(signal.SIGTERM, on_term)
    tracer = subprocess.Popen(
        strace_argv(pids, args.delay_us), stdin=subprocess.DEVNULL, preexec_fn=die_with_parent
    )  # SIGTERM: strace detaches
    torn: dict[str, Any] | None = None
    final: dict[str, Any] = {"phase": "done", "torn": None}
    try:
        time.sleep(_ATTACH_S)
        if tracer.poll() is not None:
            final = {"phase": "failed", "error": f"strace exited {tracer.returncode}"}
            return 1
        _write_status(args.status, {"phase": "armed", "strace_pid": tracer.pid, "armed_ns": time.time_ns()})
        torn = watch(os.path.realpath(args.dir), args.files, pids, args.at_bytes, args.until_ns, stop)
        final = {"phase": "done", "torn": torn}
    finally:
        if tracer.poll() is None:
            tracer.terminate()  # strace detaches on SIGTERM: its tracees run on, untouched
            try:
                tracer.wait(timeout=5)
            except subprocess.TimeoutExpired:
                tracer.kill()
                tracer.wait(timeout=5)
        _write_status(args.status, final)
    print(f"tear {args.op_id}: {torn}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
