"""etcd on a namespace testbed host: the rendezvous store a user runs, for ``rdzv_backend: etcd-v2`` scenarios.

:func:`start` runs Debian's etcd (package ``etcd-server``) inside one host's network namespace, serving the v2 API
torch's ``etcd-v2`` rendezvous needs (``--enable-v2``) on ``<host address>:2379``, with its data, pid file and log in
``<host dir>/etcd/`` (the testbed's folder of that host) and its member name ``<namespace>-etcd``, so each testbed's
etcd is its own. Idempotent: an etcd already serving from that folder is kept. :func:`stop` stops it (the pid
file's process, only while its command line names that folder) and removes the folder; a testbed's ``down`` stops
it with everything else in the namespace and calls :func:`remove` for the folder. Requires the ``etcd`` binary.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from chaos.kernel.procfs import read_stat
from chaos.testbed.system import TestbedError, kill_all, pid_of, wait_listening

GROUP = "etcd"  # the inventory group of the host that runs it (a scenario's rdzv_host: {group: etcd})
CLIENT_PORT = 2379
PEER_PORT = 2380
FOLDER = "etcd"
_PID_FILE = "etcd.pid"


def unsupported_reason() -> str | None:
    """Why etcd cannot run here, or None."""
    return None if _binary() else "etcd is not installed (Debian: apt-get install etcd-server)"


def _binary() -> str | None:
    return shutil.which("etcd") or ("/usr/bin/etcd" if os.access("/usr/bin/etcd", os.X_OK) else None)


def folder(host_dir: Path) -> Path:
    """Where a host's etcd keeps its data, pid file and log."""
    return host_dir / FOLDER


def running(host_dir: Path) -> int | None:
    """The pid of the etcd serving from ``host_dir``'s folder, or None."""
    data = folder(host_dir) / "data"
    return pid_of(folder(host_dir) / _PID_FILE, data)


def start(host_dir: Path, namespace: str, address: str, *, log: Callable[[str], None]) -> int:
    """Run etcd in ``namespace`` on ``address:2379`` (and 127.0.0.1 there) unless it already runs; its pid.
    TestbedError when etcd is missing or does not answer within 20 s."""
    binary = _binary()
    if binary is None:
        raise TestbedError(unsupported_reason() or "etcd is not installed")
    pid = running(host_dir)
    if pid is None:
        home = folder(host_dir)
        home.mkdir(parents=True, exist_ok=True)
        name, peer = f"{namespace}-etcd", f"http://127.0.0.1:{PEER_PORT}"
        argv = [
            *("ip", "netns", "exec", namespace, binary),
            *("--name", name, "--data-dir", str(home / "data"), "--enable-v2=true"),
            *("--listen-client-urls", f"http://{address}:{CLIENT_PORT},http://127.0.0.1:{CLIENT_PORT}"),
            *("--advertise-client-urls", f"http://{address}:{CLIENT_PORT}"),
            *("--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer),
            *("--initial-cluster", f"{name}={peer}"),
        ]
        with open(home / "etcd.log", "ab") as out:  # `ip netns exec` execs etcd: the child's pid is etcd's
            child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)
        pid = child.pid
        (home / _PID_FILE).write_text(f"{pid}\n")
        log(f"started etcd in {namespace} on {address}:{CLIENT_PORT} (pid {pid})")
    if not wait_listening(address, CLIENT_PORT, 20.0):
        tail = (folder(host_dir) / "etcd.log").read_text(errors="replace")[-600:]
        raise TestbedError(f"etcd in {namespace} does not answer on {address}:{CLIENT_PORT}: {tail}")
    return pid


def stop(host_dir: Path, *, log: Callable[[str], None]) -> bool:
    """Stop the etcd of ``host_dir`` (if it runs) and remove its folder; True when there was something."""
    pid = running(host_dir)
    if pid is not None:
        kill_all(lambda: [pid] if running(host_dir) == pid and _alive(pid) else [])
        log(f"stopped etcd (pid {pid})")
    return remove(host_dir) or pid is not None


def remove(host_dir: Path) -> bool:
    """Remove ``host_dir``'s etcd folder (its process must be gone); True when there was one."""
    home = folder(host_dir)
    if not home.exists():
        return False
    shutil.rmtree(home, ignore_errors=True)
    return True


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs (reaping it when it is our own child that has exited)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    except ChildProcessError:
        pass  # not our child: started by an earlier `mlchaos testbed up`
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = read_stat(pid)
    return stat is not None and not stat.zombie


__all__ = ["CLIENT_PORT", "GROUP", "folder", "remove", "running", "start", "stop", "unsupported_reason"]
