"""System primitives of the testbed (:mod:`chaos.testbed.namespaces`): namespaces, links, processes, keys.

Everything here runs argv lists through :func:`run` and raises :class:`TestbedError`; nothing here knows
the testbed's layout.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import ipaddress
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from chaos.kernel.procfs import read_stat

_CLONE_NEWUTS = 0x04000000
# Locking this directory serialises testbed changes and leaves no file behind. Not /run/netns: `ip netns
# add` flocks that one itself and would wait for us forever.
_LOCK_DIR = Path("/run")


class TestbedError(RuntimeError):
    """The testbed could not be built, inspected or removed; the message says what and why."""

    __test__ = False  # not a pytest test class, despite the name


def run(argv: list[str], *, check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` on this machine, capturing text; TestbedError when it cannot run, or exits non-zero and ``check``."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise TestbedError(f"{' '.join(argv)}: {exc}") from exc
    if check and done.returncode != 0:
        raise TestbedError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done


def namespaces() -> list[str]:
    """Names of the named network namespaces on this machine."""
    # `ip netns list` prints "name (id: N)" for namespaces with an id; the name is the first word.
    out = run(["ip", "netns", "list"]).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def link_exists(name: str, namespace: str | None = None) -> bool:
    prefix = ["ip", "-n", namespace] if namespace else ["ip"]
    return run([*prefix, "link", "show", "dev", name], check=False).returncode == 0


def netns_pids(namespace: str) -> list[int]:
    """Every process inside ``namespace`` (none when it does not exist)."""
    done = run(["ip", "netns", "pids", namespace], check=False)
    return [int(p) for p in done.stdout.split() if p.isdigit()] if done.returncode == 0 else []


def kill_all(pids: Callable[[], list[int]], grace: float = 3.0) -> int:
    """SIGTERM every pid ``pids()`` lists, SIGKILL what is left after ``grace``; returns how many there were."""
    first = pids()
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        for pid in pids():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        if not pids():
            break
    left = pids()
    if left:
        raise TestbedError(f"processes {left} survived SIGKILL")
    return len(first)


def pid_of(pid_file: Path, config: Path) -> int | None:
    """The pid in ``pid_file`` if that process is alive and is the sshd of ``config``."""
    try:
        pid = int(pid_file.read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except (OSError, ValueError):
        return None
    # sshd rewrites its title ("sshd: /usr/sbin/sshd -f CONFIG ... [listener]"), so match a substring.
    return pid if str(config).encode() in cmdline else None


def live_sshds() -> list[int]:
    """Pids of running sshd processes on this machine (zombies of ours, not yet reaped, do not count)."""
    live = []
    for pid in run(["pgrep", "-x", "sshd"], check=False).stdout.split():
        stat = read_stat(int(pid))
        if stat is not None and not stat.zombie:
            live.append(int(pid))
    return live


def netns_inode(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def pids_in_netns(inode: int) -> list[int]:
    """Every process whose network namespace is ``inode`` (also for namespaces that lost their name)."""
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and netns_inode(int(entry.name)) == inode:
            pids.append(int(entry.name))
    return pids


def in_namespace(pid: int, namespace: str) -> bool:
    try:
        return netns_inode(pid) == os.stat(f"/run/netns/{namespace}").st_ino
    except OSError:
        return False


@contextmanager
def machine_lock() -> Iterator[None]:
    """Serialise testbed changes on this machine (subnet choice and interface names are machine-wide)."""
    fd = os.open(_LOCK_DIR, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def used_networks() -> list[ipaddress.IPv4Network]:
    """IPv4 networks already in use in the root namespace (addresses and routes, default route aside)."""
    used: list[ipaddress.IPv4Network] = []
    for entry in json.loads(run(["ip", "-4", "-j", "addr"]).stdout or "[]"):
        for info in entry.get("addr_info", []):
            used.append(ipaddress.IPv4Network(f"{info['local']}/{info['prefixlen']}", strict=False))
    for route in json.loads(run(["ip", "-4", "-j", "route", "show", "table", "all"]).stdout or "[]"):
        dst = route.get("dst", "")
        if dst and dst != "default":
            try:
                used.append(ipaddress.IPv4Network(dst, strict=False))
            except ValueError:
                continue
    return used


def keygen(path: Path, comment: str) -> None:
    if path.exists() and path.with_name(path.name + ".pub").exists():
        return
    path.unlink(missing_ok=True)
    path.with_name(path.name + ".pub").unlink(missing_ok=True)
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])


def new_uts(hostname: str) -> Callable[[], None]:
    """A preexec function giving the child its own UTS namespace with ``hostname`` (it dies with sshd)."""

    def enter() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(_CLONE_NEWUTS) != 0:
            raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWUTS)")
        socket.sethostname(hostname)

    return enter


def wait_listening(address: str, port: int, timeout: float) -> bool:
    """True once ``address:port`` accepts a TCP connection, False after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((address, port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.05)
    return False


def state_tag(state_dir: Path) -> str:
    """The 4-hex-digit tag that names everything a testbed of ``state_dir`` makes (stable per resolved path)."""
    return hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:4]
