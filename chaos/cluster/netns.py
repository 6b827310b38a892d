"""A transport into a Linux network namespace on this machine: every argv runs under ``ip netns exec NAME``.

The namespace shares this machine's kernel, pid space, clock and filesystem and differs only in its network
stack (interfaces, routes, iptables, qdiscs). That makes it the cheapest real "host" for network faults: a
partition is a real iptables rule in a real stack, yet the harness reads the namespace's processes through
the ordinary /proc and writes its files through the ordinary filesystem. Creating and deleting namespaces is
the caller's business (a testbed, a test fixture); this class only runs commands in one. Root is required
(``ip netns exec`` enters the namespace with setns).
"""

from __future__ import annotations

import re
import subprocess

from chaos.cluster.base import TransportError
from chaos.cluster.local import HereTransport

# What `ip netns add` accepts as a name (it becomes a file under /run/netns), minus anything that could be
# mistaken for an option or a path.
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,62}$")
# How `ip netns exec` says the command never ran (as opposed to: it ran and failed).
_NOT_RUN = re.compile(r'^(exec of ".*" failed|Cannot open network namespace)', re.MULTILINE)


class NetnsTransport(HereTransport):
    """Runs argv lists inside the network namespace ``namespace`` (which must already exist).

    ``host`` names it in records and messages (default: the namespace name). Commands that cannot be started
    at all, or that outlive ``timeout``, raise :class:`TransportError`; a command that runs and exits non-zero
    is an ordinary :class:`Completed`. Writing files and reading the clock are this machine's own (a namespace
    shares its filesystem and kernel clock).
    """

    def __init__(self, namespace: str, *, host: str | None = None) -> None:
        if not _NAME.match(namespace):
            raise ValueError(f"{namespace!r} is not a valid network namespace name")
        self.namespace = namespace
        self.host = host or namespace

    def argv(self, argv: list[str]) -> list[str]:
        """``argv`` as this machine runs it inside the namespace (e.g. for a dead-man armed on this machine)."""
        if not argv:
            raise ValueError("an empty argv cannot be run")
        return ["ip", "netns", "exec", self.namespace, *argv]

    def _where(self) -> str:
        return f"in {self.host}"

    def _launch_error(self, argv: list[str], exc: OSError) -> TransportError:
        return TransportError(f"cannot run ip netns exec on this machine: {exc}")  # `ip` itself is missing

    def _check_ran(self, argv: list[str], proc: subprocess.CompletedProcess[str]) -> None:
        """When ``ip netns exec`` itself fails (``argv[0]`` missing: "exec of ... failed"; namespace gone: "Cannot
        open network namespace") that is a TransportError, as a local "cannot run" is, so callers see one shape."""
        if proc.returncode != 0 and _NOT_RUN.search(proc.stderr):
            raise TransportError(f"cannot run {argv[0]} in {self.host}: {proc.stderr.strip()[:300]}")
