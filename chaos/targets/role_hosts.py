"""Where a role of a ``roles`` target runs: this machine, or an inventory host (``host:`` in the role's spec),
and the few host facts the roles target needs there.

Contracts:

- :class:`RoleHost` names the host (``local`` or the inventory name), the address its ports and its peers reach
  it at (``127.0.0.1`` for this machine), and its transport.
- :func:`process_tree` is a replica's process and everything below it now, pid -> kernel start time (a pid alone
  may be reused); locally from ``/proc``, remotely with one command (:func:`chaos.targets.rank_discovery.scan_remote`).
  Empty when the root is gone or the host could not be read.
- :func:`kill_seen` SIGCONTs and SIGKILLs the processes of such a map that are still those processes; never raises.
- :func:`installed` says whether a program is on the host's PATH (or, given as a path, executable there).
- :func:`python_on` is the interpreter a role's ``{python}`` and torchrun launcher use on the host: mlchaos's own
  here, the inventory's ``python`` elsewhere.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass

from chaos.cluster.base import Transport, TransportError, host_python, kill_if_same
from chaos.cluster.local import LocalTransport
from chaos.targets.process_tree import kill_known, tree
from chaos.targets.rank_discovery import ScanError, scan_remote

LOCAL_ADDRESS = "127.0.0.1"
_WHICH = "import os, shutil, sys\np = sys.argv[1]\nsys.exit(0 if (os.access(p, os.X_OK) if os.sep in p else shutil.which(p)) else 1)\n"


@dataclass(frozen=True)
class RoleHost:
    """A host a role runs on: its name, the address it is reached at, and its transport."""

    name: str
    address: str
    transport: Transport

    @property
    def local(self) -> bool:
        return isinstance(self.transport, LocalTransport)


def local_host(transport: Transport) -> RoleHost:
    """This machine (the transport the runner gave the target)."""
    return RoleHost(transport.host, LOCAL_ADDRESS, transport)


def process_tree(host: RoleHost, root: int) -> dict[int, int]:
    """``root`` and every process below it on ``host`` now (see the module docstring)."""
    if host.local:
        return tree(root)
    try:
        return {proc.pid: proc.start_time for proc in scan_remote(host.transport, root)}
    except ScanError:
        return {}


def kill_seen(host: RoleHost, seen: dict[int, int]) -> None:
    """SIGCONT then SIGKILL each process of ``seen`` that is still that process (same start time)."""
    if not seen:
        return
    if host.local:
        kill_known(seen)
    else:
        kill_if_same(host.transport, {pid: start for pid, start in seen.items()})


def installed(host: RoleHost, program: str) -> bool:
    """True when ``program`` can be started on ``host`` (False also when the host cannot be asked)."""
    if host.local:
        return os.access(program, os.X_OK) if os.sep in program else shutil.which(program) is not None
    try:
        return host.transport.run([host_python(host.transport), "-c", _WHICH, program], timeout=30).ok
    except TransportError:
        return False


def python_on(host: RoleHost) -> str:
    """The interpreter for ``{python}`` and torchrun roles on ``host``."""
    return sys.executable if host.local else host_python(host.transport)
