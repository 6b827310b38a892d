"""The Slurm testbed's files and processes (:mod:`chaos.testbed.slurm` builds on this): where each
daemon keeps what, how to start one, how to find exactly ours, and how to stop them all.

Below :mod:`~chaos.testbed.namespaces` on purpose: its ``down`` stops a testbed's Slurm first
(slurmctld and munged live outside the namespaces), so it must reach this without importing the module
that builds on it. Every daemon is started with a path in the testbed's ``chaos-tb-slurm`` folder on its
command line; that path is how ours are told from anyone else's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from chaos.kernel.procfs import read_stat
from chaos.testbed import base as tb
from chaos.testbed.slurm_conf import ConfPaths
from chaos.testbed.system import TestbedError, kill_all, machine_lock, netns_inode, new_uts
from chaos.testbed.system import namespaces as netns_names

SLURM_DIR = "chaos-tb-slurm"
DAEMONS = ("munged", "slurmctld", "slurmd")


class _InRoot:
    """A file in a :class:`SlurmLayout`'s folder, named once: ``conf = _InRoot("slurm.conf")`` makes
    ``layout.conf`` read ``layout.root / "slurm.conf"``."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, layout: SlurmLayout, owner: type[SlurmLayout] | None = None) -> Path:
        return layout.root / self.name


@dataclass(frozen=True)
class SlurmLayout:
    """Every path and name of the Slurm cluster of one testbed (``of(state dir, tag, name prefix)``)."""

    root: Path  # <state dir>/chaos-tb-slurm
    tag: str
    prefix: str  # the testbed's name prefix ("chaos-tb")

    @classmethod
    def of(cls, state_dir: Path, tag: str, prefix: str) -> SlurmLayout:
        return cls(state_dir.resolve() / SLURM_DIR, tag, prefix)

    @property
    def cluster(self) -> str:
        return f"{self.prefix}-{self.tag}"

    @property
    def controller_host(self) -> str:
        """The controller's hostname (its own UTS namespace): SlurmctldHost must name the host it runs on."""
        return f"{self.prefix}-{self.tag}-ctld"

    conf = _InRoot("slurm.conf")
    record = _InRoot("slurm.json")
    munge_key = _InRoot("munge.key")
    munge_socket = _InRoot("munge.socket")
    munged_pid = _InRoot("munged.pid")
    munged_log = _InRoot("munged.log")

    @property
    def paths(self) -> ConfPaths:
        return ConfPaths(
            munge_socket=self.munge_socket,
            state_save=self.root / "slurmctld",
            ctld_pid=self.root / "slurmctld.pid",
            ctld_log=self.root / "slurmctld.log",
            slurmd_dir=self.root / "slurmd",
            jobcomp=self.root / "jobcomp.log",
        )

    def slurmd_log(self, node: str) -> Path:
        return self.paths.slurmd_dir / f"{node}.log"

    @property
    def marker(self) -> bytes:
        """What the command line of every daemon of this cluster contains."""
        return str(self.root).encode() + b"/"


# ---------------------------------------------------------------------------------------------------------
# finding and stopping ours


def present(layout: SlurmLayout) -> bool:
    """Whether the testbed has Slurm files or daemons."""
    return layout.root.exists() or bool(pids(layout, DAEMONS))


def down(layout: SlurmLayout, ns_prefix: str, *, log: Callable[[str], None] = tb.ignore) -> list[str]:
    """Stop the jobs' step daemons (and their tasks) in the namespaces named ``ns_prefix*``, then every
    slurmd, slurmctld and munged of ``layout``; remove its folder. Safe when half built or already down.
    Returns what was removed; TestbedError listing what could not be."""
    steps = tb.Teardown(log)
    with machine_lock():
        inodes = set()
        for ns in netns_names():
            if ns.startswith(ns_prefix):
                try:
                    inodes.add(os.stat(f"/run/netns/{ns}").st_ino)
                except OSError:
                    continue
        try:
            count = kill_all(lambda: job_pids(inodes))
            if count:
                steps.say(f"stopped {count} job step process(es)")
            for names in (("slurmd",), ("slurmctld", "slurmscriptd"), ("munged",)):
                count = stop(layout, names)
                if count:
                    steps.say(f"stopped {count} {names[0]} process(es)")
        except TestbedError as exc:
            steps.fail(str(exc))
        if layout.root.exists():
            try:
                shutil.rmtree(layout.root)
                steps.say(f"removed {layout.root}")
            except OSError as exc:
                steps.fail(f"cannot remove {layout.root}: {exc}")
    return steps.result("slurm down")


def down_all(*, log: Callable[[str], None] = tb.ignore) -> list[str]:
    """Stop EVERY testbed's Slurm daemons on this machine (any state dir, anyone's). Files stay."""
    done = []
    with machine_lock():
        marker = b"/" + SLURM_DIR.encode() + b"/"
        count = kill_all(lambda: matching(marker, (*DAEMONS, "slurmscriptd")))
        if count:
            done.append(f"stopped {count} testbed slurm daemon(s)")
            log(done[-1])
    return done


def proc_entries() -> Iterable[tuple[int, str, bytes, int]]:
    """(pid, comm, cmdline, ppid) of every live (non-zombie) process; comm without Debian's ``-wlm``."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        stat = read_stat(int(entry.name))
        try:
            cmdline = Path(f"/proc/{entry.name}/cmdline").read_bytes()
        except OSError:
            continue
        if stat is None or stat.zombie:
            continue
        comm = stat.comm.removesuffix("-wlm")  # Debian's real binaries: slurmd-wlm
        yield int(entry.name), comm, cmdline, stat.ppid


def matching(marker: bytes, names: tuple[str, ...]) -> list[int]:
    """Pids of ``names`` processes whose command line holds ``marker`` (slurmscriptd: whose parent does)."""
    entries = list(proc_entries())
    found = [pid for pid, comm, cmdline, _ in entries if comm in names and marker in cmdline]
    if "slurmscriptd" in names:
        found += [pid for pid, comm, _, ppid in entries if comm == "slurmscriptd" and ppid in found]
    return found


def pids(layout: SlurmLayout, names: tuple[str, ...], *, ns: str | None = None) -> list[int]:
    """Our daemons called ``names``; with ``ns``, only those inside that network namespace (a host's slurmd)."""
    found = matching(layout.marker, names)
    if ns is not None:
        try:
            inode = os.stat(f"/run/netns/{ns}").st_ino
        except OSError:
            return []
        found = [pid for pid in found if netns_inode(pid) == inode]
    return found


def job_pids(inodes: set[int]) -> list[int]:
    """slurmstepd processes in the namespaces ``inodes``, and everything below them (the jobs' tasks)."""
    entries = list(proc_entries())
    roots = {pid for pid, comm, _, _ in entries if comm == "slurmstepd" and netns_inode(pid) in inodes}
    found, grew = set(roots), True
    while grew:
        grew = False
        for pid, _, _, ppid in entries:
            if ppid in found and pid not in found:
                found.add(pid)
                grew = True
    return sorted(found)


def stop(layout: SlurmLayout, names: tuple[str, ...]) -> int:
    """SIGTERM (then SIGKILL) our ``names`` daemons; how many there were."""
    return kill_all(lambda: pids(layout, names), grace=10.0)


# ---------------------------------------------------------------------------------------------------------
# starting


def which(name: str) -> str | None:
    # Not resolved: Debian's /usr/sbin/slurmctld is an alternatives link to slurmctld-wlm, and the name a
    # daemon is started by is the name /proc shows for it.
    return shutil.which(name) or next(
        (f"{d}/{name}" for d in ("/usr/sbin", "/sbin") if os.access(f"{d}/{name}", os.X_OK)), None
    )


def binary(name: str) -> str:
    found = which(name)
    if found is None:
        raise TestbedError(f"{name} is not installed")
    return found


def start(what: str, argv: list[str], log_file: Path, *, uts: str | None = None) -> None:
    """Start a daemon that forks into the background (in a UTS namespace named ``uts``, if given); its early
    errors go to ``log_file``, whose tail a TestbedError quotes when it fails."""
    with open(log_file, "ab") as errors:
        starter = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=errors,
            stderr=errors,
            start_new_session=True,
            preexec_fn=new_uts(uts) if uts is not None else None,
        )
        try:
            code = starter.wait(timeout=20)
        except subprocess.TimeoutExpired:
            starter.kill()
            starter.wait()
            raise TestbedError(f"{what} did not fork into the background within 20s:\n{tail(log_file)}") from None
    if code != 0:
        raise TestbedError(f"{what} failed to start ({code}):\n{tail(log_file)}")


# ---------------------------------------------------------------------------------------------------------
# small helpers


def read_json(path: Path) -> dict[str, object]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_json(path: Path, data: dict[str, object]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def tail(path: Path, lines: int = 12) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"({path} unreadable)"
