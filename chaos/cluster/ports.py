"""A TCP port that is free on a host now, for a job role that serves one (``port: auto``).

Chosen when the run starts, so two runs of one scenario on one machine (or two pytest-xdist workers) never
share a port. The port is drawn at random below the kernel's ephemeral range (``ip_local_port_range``), where
outgoing connections never take a local port: a role that restarts (a lighthouse killed and started again)
binds its port again, and a port from the ephemeral range could meanwhile be the local end of a connection.
Random from the operating system, not from the run's seed: two runs with the same seed must not choose alike.
A port is free when both ``0.0.0.0`` and ``::`` bind it (a server may listen on either).
"""

from __future__ import annotations

import inspect

from chaos.cluster.base import Transport, TransportError, host_python
from chaos.cluster.local import LocalTransport


class NoFreePort(RuntimeError):
    """The host had no free port to give (or could not be asked)."""


def _choose() -> int:
    """A port free on this host now (runs here, or as a script on another host: it imports what it needs)."""
    import random
    import socket

    low, high = 20000, 32768
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as handle:
            high = int(handle.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    if high - low < 1000:  # an unusually wide ephemeral range: let the kernel choose
        with socket.socket() as sock:
            sock.bind(("", 0))
            return int(sock.getsockname()[1])
    draw = random.SystemRandom()
    for _ in range(200):
        port = draw.randrange(low, high)
        try:
            for family, address in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
                try:
                    sock = socket.socket(family, socket.SOCK_STREAM)
                except OSError:
                    continue  # no IPv6 on this host: IPv4 decides
                with sock:
                    sock.bind((address, port))
        except OSError:
            continue  # taken (or in TIME_WAIT) on one of them
        return port
    raise OSError(f"no free port among 200 drawn in [{low}, {high})")


_SCRIPT = inspect.getsource(_choose) + "\nprint(_choose())\n"


def free_port(transport: Transport | None = None) -> int:
    """A free port on ``transport``'s host (None or a local transport: this machine)."""
    if transport is None or isinstance(transport, LocalTransport):
        try:
            return _choose()
        except OSError as exc:
            raise NoFreePort(f"no free port here: {exc}") from exc
    try:
        done = transport.run([host_python(transport), "-c", _SCRIPT], timeout=30)
    except TransportError as exc:
        raise NoFreePort(f"cannot ask {transport.host} for a free port: {exc}") from exc
    if not done.ok or not done.stdout.strip().isdigit():
        raise NoFreePort(f"{transport.host} gave no free port: {(done.stderr or done.stdout).strip()[-300:]}")
    return int(done.stdout.strip())
