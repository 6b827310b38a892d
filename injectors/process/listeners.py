"""The process that listens on a TCP port of a host: what a process fault's ``port:`` selector hits.

A service is found by what it serves, not by its name: the pid(s) holding a listening TCP socket on the port, as
``ss -Hltnp`` run on the host through its transport reports them (iproute2; root sees every process's sockets).
In a network namespace testbed a host's ``ss`` sees that namespace's sockets only, so the port picks the service
of that host even though all hosts share one pid space. Nothing here changes the host.
"""

from __future__ import annotations

import re

from chaos.cluster.base import Transport, TransportError
from chaos.plugins.injector import InjectionError
from injectors.base import probe

_PID = re.compile(r"\bpid=(\d+)")
TIMEOUT_S = 15.0


def listening_pids(transport: Transport, port: int) -> list[int]:
    """The pids listening on TCP ``port`` on the host (each once, ascending); empty when nothing listens.
    InjectionError when ``ss`` cannot be run there."""
    try:
        done = transport.run(["ss", "-Hltnp", f"sport = :{port}"], timeout=TIMEOUT_S)
    except TransportError as exc:
        raise InjectionError(f"cannot run ss on {transport.host}: {exc}") from exc
    if not done.ok:
        raise InjectionError(f"ss -Hltnp failed on {transport.host}: {done.stderr.strip()[:200]}")
    return sorted({int(pid) for pid in _PID.findall(done.stdout)})


def check_ss(transport: Transport) -> None:
    """Unsupported when ``ss`` (iproute2) does not run on the host: a ``port:`` selector could find nothing."""
    fails = "ss (iproute2) does not run on {host}; a port: selector needs it"
    probe(transport, ["ss", "-V"], "cannot run ss on", fails, timeout=TIMEOUT_S)
