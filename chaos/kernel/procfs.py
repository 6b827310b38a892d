"""The one reader of ``/proc/<pid>/stat``: a process's command name, state, parent and kernel start time.

Standard library only (it sits at the bottom of the layers, so the harness, the in-job agent and the guards
share it). :func:`parse_stat` reads the text of any host's stat file (a remote one comes back as text over a
transport); :func:`read_stat` reads this machine's. The command name (field 2) may hold spaces and parentheses,
so the fixed fields are the ones after the LAST ``)``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Stat:
    """What mlchaos reads of a process: ``comm`` (field 2), ``state`` (3: R, S, D, T or t stopped, Z ...),
    ``ppid`` (4), ``start_time`` (22: clock ticks since boot, which tells a pid from its reuse), ``cpu_ticks``
    (14 + 15: user + system CPU time in clock ticks)."""

    comm: str
    state: str
    ppid: int
    start_time: int
    cpu_ticks: int = 0

    @property
    def stopped(self) -> bool:
        return self.state in ("T", "t")

    @property
    def zombie(self) -> bool:
        return self.state in ("Z", "X")


def parse_stat(text: str) -> Stat | None:
    """The :class:`Stat` of one ``/proc/<pid>/stat`` text, or None when it is not one (empty, cut short)."""
    open_at, close_at = text.find("("), text.rfind(")")
    if open_at < 0 or close_at < open_at:
        return None
    fields = text[close_at + 2 :].split()
    if len(fields) < 20:
        return None
    try:
        return Stat(
            text[open_at + 1 : close_at], fields[0], int(fields[1]), int(fields[19]), int(fields[11]) + int(fields[12])
        )
    except ValueError:
        return None


def read_stat(pid: int, proc: str = "/proc") -> Stat | None:
    """This machine's :class:`Stat` of ``pid``, or None when the process is gone (or never was)."""
    try:
        with open(f"{proc}/{pid}/stat", encoding="utf-8", errors="replace") as handle:
            return parse_stat(handle.read())
    except OSError:
        return None


def lineage(pid: int) -> set[int]:
    """``pid`` and its ancestors on this machine, up to (not including) init: the processes a fault aimed by
    name must never hit when ``pid`` is the harness's own."""
    found: set[int] = set()
    while pid > 1 and pid not in found:
        found.add(pid)
        stat = read_stat(pid)
        if stat is None:
            break
        pid = stat.ppid
    return found
