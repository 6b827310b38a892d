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
from pathlib import Path

from chaos.cluster.base import Completed, TransportError
from chaos.cluster.local import LocalTransport

# What `ip netns add` accepts as a name (it becomes a file under /run/netns), minus anything that could be
# mistaken for an option or a path.
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,62}$")
# How `ip netns exec` says the command never ran (as opposed to: it ran and failed).
_NOT_RUN = re.compile(r'^(exec of ".*" failed|Cannot open network namespace)', re.MULTILINE)


class NetnsTransport:
    """Runs argv lists inside the network namespace ``namespace`` (which must already exist).

    ``host`` names it in records and messages (default: the namespace name). Commands that cannot be started
    at all, or that outlive ``timeout``, raise :class:`TransportError`; a command that runs and exits non-zero
    is an ordinary :class:`Completed`.
    """

    def __init__(self, namespace: str, *, host: str | None = None) -> None:
        if not _NAME.match(namespace):
            raise ValueError(f"{namespace!r} is not a valid network namespace name")
        self.namespace = namespace
        self.host = host or namespace
        self._local = LocalTransport()

    def argv(self, argv: list[str]) -> list[str]:
        """``argv`` as this machine runs it inside the namespace (e.g. for a dead-man armed on this machine)."""
        if not argv:
            raise ValueError("an empty argv cannot be run")
        return ["ip", "netns", "exec", self.namespace, *argv]

    def run(self, argv: list[str], *, timeout: float = 30.0, check: bool = False) -> Completed:
        """Run to completion; raise TransportError on timeout, or when ``check`` and the exit code is non-zero.

        When ``ip netns exec`` itself fails (``argv[0]`` missing: "exec of ... failed"; namespace gone: "Cannot
        open network namespace") that is a TransportError, as a local "cannot run" is, so callers see one shape.
        """
        wrapped = self.argv(argv)
        try:
            proc = subprocess.run(wrapped, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired as exc:
            raise TransportError(f"{argv[0]} timed out after {timeout:.0f}s in {self.host}") from exc
        except OSError as exc:  # `ip` itself is missing
            raise TransportError(f"cannot run ip netns exec on this machine: {exc}") from exc
        if proc.returncode != 0 and _NOT_RUN.search(proc.stderr):
            raise TransportError(f"cannot run {argv[0]} in {self.host}: {proc.stderr.strip()[:300]}")
        done = Completed(tuple(argv), proc.returncode, proc.stdout, proc.stderr)
        if check and not done.ok:
            raise TransportError(
                f"{' '.join(argv)} exited {proc.returncode} in {self.host}: {proc.stderr.strip()[:300]}"
            )
        return done

    def spawn(
        self,
        argv: list[str],
        *,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        kill_with_parent: int | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` in the namespace, in its own session, stdout+stderr piped.

        ``ip netns exec`` execs the command in place, so the returned process IS the command (its pid, its
        exit code, its signals), which is what ``kill_with_parent`` and callers that signal it rely on.
        """
        return self._local.spawn(self.argv(argv), env=env, cwd=cwd, kill_with_parent=kill_with_parent)

    def put(self, data: bytes, path: str) -> None:
        """Write ``data`` to ``path`` atomically; a namespace shares this machine's filesystem."""
        self._local.put(data, path)

    def clock_offset(self) -> float:
        """Always 0: a namespace reads the same kernel clock as the harness."""
        return 0.0
