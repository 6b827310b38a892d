"""Small (pseudo-)files on a fault's host: this machine's directly, any other host's through its transport.

The base of the file access of :mod:`injectors.node` (cgroup files) and :mod:`injectors.storage.injector`
(the mount table, the FUSE daemon's control and status files), and the checked host commands of
:mod:`injectors.node` and :mod:`injectors.gpu_xid`.
"""

from __future__ import annotations

from chaos.cluster.base import Transport, TransportError, read_host_file
from chaos.cluster.local import LocalTransport
from chaos.plugins.injector import InjectionError


class HostFiles:
    """Reads on the fault's host; ``local`` says whether that host is this machine (plain ``open`` works)."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        self.local = isinstance(transport, LocalTransport)

    def read(self, path: str) -> str | None:
        """The text of ``path``, or None when it cannot be read."""
        return read_host_file(self.transport, path)

    def run_checked(self, argv: list[str], what: str) -> None:
        """Run ``argv`` on the host; InjectionError ``cannot <what> on <host>: <why>`` when it cannot or fails."""
        try:
            done = self.transport.run(argv, timeout=30)
        except TransportError as exc:
            raise InjectionError(f"cannot {what} on {self.transport.host}: {exc}") from exc
        if not done.ok:
            raise InjectionError(f"cannot {what} on {self.transport.host}: {done.stderr.strip()[:300]}")
