"""Small (pseudo-)files on a fault's host: this machine's directly, any other host's through its transport.

The base of the file access of :mod:`injectors.node` (cgroup files) and :mod:`injectors.storage.injector`
(the mount table, the FUSE daemon's control and status files).
"""

from __future__ import annotations

from chaos.cluster.base import Transport, read_host_file
from chaos.cluster.local import LocalTransport


class HostFiles:
    """Reads on the fault's host; ``local`` says whether that host is this machine (plain ``open`` works)."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        self.local = isinstance(transport, LocalTransport)

    def read(self, path: str) -> str | None:
        """The text of ``path``, or None when it cannot be read."""
        return read_host_file(self.transport, path)
