"""Abort this process's process groups while the process lives on (``collective_fault`` kind ``abort``).

:func:`prepare_abort` finds what :meth:`GroupAbort.run` then does: torch's own ``ProcessGroup.abort()`` on every
group this process registered (the default group and every ``new_group``), as NCCL's watchdog or a
fault-tolerant job does; the groups stay registered, so the job's next collective on them runs and fails. For
gloo that call is not enough: in torch 2.13 ``ProcessGroupGloo.abort()`` leaves the group's connections open and
its collectives keep working (measured), and gloo closes them only when the group is destroyed, which a DDP
module holding the group prevents. So for a gloo group the connections are shut down as the group's destruction
would close them: ``shutdown(SHUT_RDWR)`` on every established TCP connection of this process except those of
the groups' rendezvous stores (their TCPStore ports, and ``MASTER_PORT``). The fds stay gloo's (a dup is shut
down; gloo's own fd is never closed). From then on gloo itself fails this rank's collectives and its peers'
(``Connection closed by peer``).

Contract: every group of the process is aborted (as torch's ``_abort_process_group()`` with no group aborts
them all); any other TCP connection the training process keeps open (a metrics exporter) is shut down too.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

ESTABLISHED = "01"  # the st column of /proc/net/tcp


@dataclass(frozen=True)
class GroupAbort:
    """An abort of this process's groups, found before it is done (so it can be reported first): the groups,
    their backends' names, and the fds of the TCP connections a gloo group's abort shuts down."""

    groups: tuple[dist.ProcessGroup, ...]
    backends: tuple[str, ...]
    fds: tuple[int, ...]

    def run(self) -> None:
        """Abort the groups, then shut the connections down (module docstring)."""
        for group in self.groups:
            group.abort()
        shut_down(self.fds)


def prepare_abort() -> GroupAbort:
    """The abort of every process group of this process (none before ``init_process_group``)."""
    if not (dist.is_available() and dist.is_initialized()):
        return GroupAbort((), (), ())
    groups = list(c10d._world.pg_map.items())
    backends = tuple(sorted({name for _, (name, _) in groups}))
    stores = {port for _, (_, store) in groups if (port := _store_port(store)) is not None}
    env_port = os.environ.get("MASTER_PORT", "")
    if env_port.isdigit():
        stores.add(int(env_port))
    gloo = any("gloo" in backend for backend in backends)
    connections = established_tcp() if gloo else []
    fds = tuple(fd for fd, local, remote in connections if local not in stores and remote not in stores)
    return GroupAbort(tuple(group for group, _ in groups), backends, fds)


def _store_port(store: object) -> int | None:
    """The port of the TCPStore under ``store`` (through its PrefixStores), None when it is not one."""
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    port = getattr(store, "port", None)
    return port if isinstance(port, int) else None


def shut_down(fds: tuple[int, ...]) -> None:
    """``shutdown(SHUT_RDWR)`` each socket fd, through a dup (the fd stays its owner's); one closed meanwhile is
    skipped."""
    for fd in fds:
        try:
            with socket.socket(fileno=os.dup(fd)) as sock:
                sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            continue


def established_tcp() -> list[tuple[int, int, int]]:
    """(fd, local port, remote port) of this process's established TCP connections (IPv4 and IPv6)."""
    inodes: dict[str, int] = {}
    for entry in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{entry}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes[target[len("socket:[") : -1]] = int(entry)
    found = []
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 9 and fields[3] == ESTABLISHED and fields[9] in inodes:
                local, remote = (int(address.rsplit(":", 1)[1], 16) for address in fields[1:3])
                found.append((inodes[fields[9]], local, remote))
    return sorted(found)


__all__ = ["GroupAbort", "established_tcp", "prepare_abort", "shut_down"]
