"""A local process and everything below it, by pid and kernel start time (a pid alone may be reused).

``tree`` lists a root and its descendants with their start times; ``kill_known`` signals only those that still
have the recorded start time (the roles target stops a replica's whole tree with it).
"""

from __future__ import annotations

import os
import signal

from chaos.cluster.local import process_start_time
from chaos.kernel.procfs import read_stat


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process on this machine (from ``/proc/<pid>/stat``)."""
    found: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        stat = read_stat(int(entry))
        if stat is not None:
            found[int(entry)] = stat.ppid
    return found


def tree(root: int) -> dict[int, int]:
    """``root`` and every process below it now, each pid with its kernel start time; empty when ``root`` is
    gone. A process that exits during the walk is left out."""
    return trees([root])[root]


def trees(roots: list[int]) -> dict[int, dict[int, int]]:
    """:func:`tree` of each of ``roots``, from ONE read of /proc's parent links (a read touches every process
    on the machine: a supervisor of many replicas reads it once per look, not once per replica)."""
    children: dict[int, list[int]] = {}
    for pid, ppid in _parents().items():
        children.setdefault(ppid, []).append(pid)
    out: dict[int, dict[int, int]] = {}
    for root in roots:
        found: dict[int, int] = {}
        todo = [root]
        while todo:
            pid = todo.pop()
            start = process_start_time(pid)
            if start is None:
                continue
            found[pid] = start
            todo.extend(children.get(pid, ()))
        out[root] = found
    return out


def kill_known(seen: dict[int, int]) -> None:
    """SIGCONT then SIGKILL every pid of ``seen`` (pid -> start time) that is still that process (its start
    time matches), so a pid reused by a stranger is never touched; gone ones are fine. Never raises."""
    for pid, start in seen.items():
        if process_start_time(pid) != start:
            continue
        for signum in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(pid, signum)
            except (ProcessLookupError, PermissionError):
                break
