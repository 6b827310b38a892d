"""The probes of the node health check (:mod:`chaos.slurm.healthcheck`): each looks at one thing that is
real on the node it runs on and returns a :class:`Finding`. None of them can hang the check: I/O that may block
(a stalled filesystem) runs in a child process that is killed at its bound, and network probes carry timeouts.

- :func:`xid`: the kernel log(s) hold an XID line whose code is node-fatal (since the log's last boot);
- :func:`storage`: a directory (the checkpoint filesystem) answers stat + write + fsync + read + unlink in time;
- :func:`peers`: the slurmd port of enough other nodes accepts a TCP connection (a partitioned node reaches none);
- :func:`memory`: ``MemAvailable`` is above a floor;
- :func:`cpu`: no process of a job on this node (nor the check itself) runs under a CFS quota below a floor
  (cgroup v1 ``cpu.cfs_quota_us / cpu.cfs_period_us``, v2 ``cpu.max``, the tightest along the cgroup's path).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from chaos.kernel.mounts import CpuCgroup, cpu_cgroup
from chaos.kernel.procfs import read_stat
from chaos.slurm.client import expand_hostlist, parse_fields
from chaos.slurm.healthcheck_xid import scan

SLURMD_PORT = 6818


@dataclass(frozen=True)
class Finding:
    check: str  # xid, storage, peers, memory, cpu
    ok: bool
    detail: str  # short: it goes into the node's drain reason


# -- xid ----------------------------------------------------------------------------------------------------------


def xid(logs: Sequence[Path], fatal: Iterable[int]) -> Finding:
    """Fails on the first node-fatal XID line (since the last boot) of any log; a missing log holds none."""
    fatal_codes = set(fatal)
    seen = 0
    for log in logs:
        try:
            text = log.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            continue
        except OSError as exc:
            return Finding("xid", False, f"cannot read {log}: {exc.strerror}")
        lines = scan(text)
        seen += len(lines)
        for line in lines:
            if line.code in fatal_codes:
                return Finding("xid", False, f"{line.detail} in {log}:{line.lineno}")
    return Finding("xid", True, f"no node-fatal XID ({seen} XID line(s) in {len(logs)} log(s))")


# -- storage ------------------------------------------------------------------------------------------------------

# Run in a child: stat the directory, write + fsync + read back + unlink a small file in it.
_STORAGE_PROBE = """
import os, sys
folder, name = sys.argv[1], sys.argv[2]
os.stat(folder)
path = os.path.join(folder, name)
data = b"mlchaos health check\\n"
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
try:
    os.write(fd, data)
    os.fsync(fd)
finally:
    os.close(fd)
with open(path, "rb") as handle:
    if handle.read() != data:
        sys.exit("read back other bytes than written")
os.unlink(path)
"""


def storage(folder: Path, timeout: float, node: str) -> Finding:
    """Fails when the I/O does not finish within ``timeout`` seconds (the child is then SIGKILLed: a process
    waiting on a FUSE daemon dies of it) or fails; a missing directory fails too."""
    started = time.monotonic()
    child = subprocess.Popen(
        [sys.executable, "-c", _STORAGE_PROBE, str(folder), f".mlchaos-hc-{node}"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        _, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        try:
            child.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            pass  # stuck beyond SIGKILL (uninterruptible I/O): it is reaped by init once the I/O ends
        return Finding("storage", False, f"{folder} did not answer within {timeout:g}s")
    took = time.monotonic() - started
    if child.returncode != 0:
        last = (err or b"").decode(errors="replace").strip().splitlines()
        return Finding("storage", False, f"{folder}: {last[-1][:160] if last else f'exit {child.returncode}'}")
    return Finding("storage", True, f"{folder} answered in {took:.2f}s")


# -- peers --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Peer:
    name: str
    address: str
    port: int


def peers_from_conf(text: str, own: str) -> list[Peer]:
    """Every node of a ``slurm.conf`` but ``own``, at its ``NodeAddr`` (else hostname, else name) and slurmd
    port (``Port=`` of its line, else ``SlurmdPort``, else 6818). Hostlists (``h[1-4]``) are expanded."""
    default_port = SLURMD_PORT
    entries: list[dict[str, str]] = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        key = line.split("=", 1)[0].strip().lower()
        if key == "slurmdport":
            default_port = int(line.split("=", 1)[1].split()[0])
        elif key == "nodename":
            entries.append(parse_fields(line))
    found: list[Peer] = []
    for fields in entries:
        names = expand_hostlist(fields.get("NodeName", ""))
        if not names or names == ["DEFAULT"]:
            continue
        addresses = expand_hostlist(fields.get("NodeAddr", "") or fields.get("NodeHostname", "")) or names
        port = int(fields["Port"]) if fields.get("Port", "").isdigit() else default_port
        for index, name in enumerate(names):
            address = addresses[index] if index < len(addresses) else name
            if name != own:
                found.append(Peer(name, address, port))
    return found


def _reachable(peer: Peer, timeout: float) -> str | None:
    """None when a TCP connection to the peer's slurmd port is accepted, else why not."""
    try:
        with socket.create_connection((peer.address, peer.port), timeout=timeout):
            return None
    except TimeoutError:
        return "timeout"
    except OSError as exc:
        return exc.strerror or type(exc).__name__


def peers(found: Sequence[Peer], timeout: float, min_reachable: float, retry_after: float = 1.0) -> Finding:
    """Fails when fewer than ``min_reachable`` (a share, 0..1) of ``found`` accept a connection.

    A partition is symmetric: with a share of 0.5, the node cut off from the rest (which reaches none) fails,
    and the others (which miss only it) do not. A peer that did not answer is asked once more ``retry_after``
    seconds later, and only a peer unreachable both times counts: slurmd runs the check as it starts, when the
    peers started a moment later may not listen yet (a node drained for that stays drained)."""
    if not found:
        return Finding("peers", True, "no peer to reach")

    def probe(peers: Sequence[Peer]) -> list[str | None]:
        with ThreadPoolExecutor(max_workers=min(16, len(peers))) as pool:
            return list(pool.map(lambda peer: _reachable(peer, timeout), peers))

    results = dict(zip(found, probe(found), strict=True))
    missed = [peer for peer, why in results.items() if why is not None]
    if missed and retry_after > 0:
        time.sleep(retry_after)
        results.update(zip(missed, probe(missed), strict=True))
    down = [f"{peer.name}({why})" for peer, why in results.items() if why is not None]
    share = (len(found) - len(down)) / len(found)
    if share < min_reachable:
        return Finding("peers", False, f"{len(down)}/{len(found)} unreachable: {' '.join(down)}"[:200])
    return Finding("peers", True, f"{len(found) - len(down)}/{len(found)} peers reachable")


# -- memory -------------------------------------------------------------------------------------------------------


def memory(min_available_mb: int, meminfo: Path = Path("/proc/meminfo")) -> Finding:
    """Fails when ``MemAvailable`` is below ``min_available_mb`` MiB."""
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemAvailable:"):
            available = int(line.split()[1]) // 1024
            ok = available >= min_available_mb
            return Finding("memory", ok, f"{available} MiB available ({'>=' if ok else '<'} {min_available_mb})")
    return Finding("memory", False, f"{meminfo} has no MemAvailable")


# -- cpu ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CpuMount:
    version: int  # 1 or 2
    mount: Path
    root: str  # the mount's root inside the hierarchy


def cpu_mount(mountinfo: str) -> CpuMount | None:
    """The cpu controller's mount (v1 ``cpu`` first, else the unified v2 hierarchy) from a mountinfo text."""
    found = cpu_cgroup(mountinfo)
    return None if found is None else CpuMount(found.version, Path(found.mount), found.root)


def cgroup_dir(mount: CpuMount, proc_cgroup: str) -> Path | None:
    """The directory of a process's cpu cgroup (from its ``/proc/<pid>/cgroup`` text), or None
    (:meth:`chaos.kernel.mounts.CpuCgroup.directory_of`)."""
    found = CpuCgroup(mount.version, str(mount.mount), mount.root).directory_of(proc_cgroup)
    return None if found is None else Path(found)


def cpu_limit(mount: CpuMount, folder: Path) -> tuple[float, Path] | None:
    """The tightest CPU quota (in CPUs) along ``folder``'s path up to the mount, and the cgroup that sets it."""
    best: tuple[float, Path] | None = None
    current = folder
    while True:
        limit = _quota(mount.version, current)
        if limit is not None and (best is None or limit < best[0]):
            best = (limit, current)
        if current == mount.mount or mount.mount not in current.parents:
            return best
        current = current.parent


def _quota(version: int, folder: Path) -> float | None:
    try:
        if version == 1:
            quota = int((folder / "cpu.cfs_quota_us").read_text())
            period = int((folder / "cpu.cfs_period_us").read_text())
        else:
            words = (folder / "cpu.max").read_text().split()
            if not words or words[0] == "max":
                return None
            quota, period = int(words[0]), int(words[1])
    except (OSError, ValueError, IndexError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def _stat(pid: str) -> tuple[str, int] | None:
    stat = read_stat(int(pid))
    return None if stat is None else (stat.comm, stat.ppid)


def _netns(pid: int | str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def job_processes() -> list[int]:
    """Processes of Slurm jobs on this node: every descendant of a ``slurmstepd`` in this network namespace
    (on a real node that is every slurmstepd; on the testbed, whose nodes share one kernel, the node's own)."""
    own_ns = _netns("self")
    children: dict[int, list[int]] = {}
    stepds: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        stat = _stat(entry)
        if stat is None:
            continue
        children.setdefault(stat[1], []).append(int(entry))
        if stat[0] == "slurmstepd" and _netns(entry) == own_ns:
            stepds.append(int(entry))
    found: list[int] = []
    todo = [child for stepd in stepds for child in children.get(stepd, [])]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return sorted(found)


def cpu(min_cpus: float) -> Finding:
    """Fails when a job process on this node, or this check itself, is held to fewer than ``min_cpus`` CPUs."""
    try:
        mount = cpu_mount(Path("/proc/self/mountinfo").read_text())
    except OSError:
        mount = None
    if mount is None:
        return Finding("cpu", True, "no cpu cgroup controller mounted: nothing can throttle by quota")
    subjects = [os.getpid(), *job_processes()]
    for pid in subjects:
        try:
            folder = cgroup_dir(mount, Path(f"/proc/{pid}/cgroup").read_text())
        except OSError:
            continue  # gone meanwhile
        limit = cpu_limit(mount, folder) if folder is not None else None
        if limit is not None and limit[0] < min_cpus:
            who = "the health check" if pid == os.getpid() else f"job pid {pid}"
            return Finding("cpu", False, f"{who} limited to {limit[0]:.2g} CPU by {limit[1]} (< {min_cpus:g})")
    return Finding("cpu", True, f"{len(subjects) - 1} job process(es), none limited below {min_cpus:g} CPU")
