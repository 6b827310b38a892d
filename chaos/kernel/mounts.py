"""Mount tables as the kernel writes them (``/proc/<pid>/mountinfo``, ``/proc/mounts``), standard library only:
the one decoder of their escaped fields, the one mountinfo line parser, and where the cpu controller's cgroup
hierarchy is mounted (what the node injector throttles through and the Slurm health check reads)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


def unescape(text: str) -> str:
    """A /proc/mounts or mountinfo field, decoded (space, tab, newline, backslash come as \\040 ...)."""
    out, index = [], 0
    while index < len(text):
        chunk = text[index : index + 4]
        if len(chunk) == 4 and chunk[0] == "\\" and chunk[1:].isdigit():
            out.append(chr(int(chunk[1:], 8)))
            index += 4
        else:
            out.append(text[index])
            index += 1
    return "".join(out)


@dataclass(frozen=True)
class MountInfo:
    """One mountinfo line, decoded: the mount's root inside its filesystem, its mount point, the optional
    fields (``shared:N``, ``master:N``, ...), the filesystem type and the super options."""

    root: str
    point: str
    optional: tuple[str, ...]
    fstype: str
    super_options: tuple[str, ...]


def mountinfo(text: str) -> list[MountInfo]:
    """The entries of a mountinfo text; a line of another shape is passed over."""
    found = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3:
            continue
        options = tuple(tail[2].split(","))
        found.append(MountInfo(unescape(fields[3]), unescape(fields[4]), tuple(fields[6:]), tail[0], options))
    return found


@dataclass(frozen=True)
class CpuCgroup:
    """Where the cpu controller is mounted: cgroup ``version`` 1 or 2, its mount point and the mount's root."""

    version: int
    mount: str
    root: str

    def fs_path(self, cgroup: str) -> str | None:
        """The directory of ``cgroup`` (a /proc/<pid>/cgroup path), or None when outside this mount."""
        root = self.root.rstrip("/")
        if cgroup != root and not cgroup.startswith(root + "/"):
            return None
        return self.mount.rstrip("/") + cgroup[len(root) :] if cgroup[len(root) :] else self.mount

    def directory_of(self, proc_cgroup: str) -> str | None:
        """The directory of a process's cpu cgroup, from its ``/proc/<pid>/cgroup`` text: None when no line is
        this hierarchy's (v1: the one listing ``cpu``; v2: ``0::``) or its cgroup lies outside this mount."""
        for line in proc_cgroup.splitlines():
            hierarchy, _, rest = line.partition(":")
            controllers, _, path = rest.partition(":")
            v1_match = self.version == 1 and "cpu" in controllers.split(",")
            if v1_match or (self.version == 2 and hierarchy == "0" and controllers == ""):
                return self.fs_path(path)
        return None


def cpu_cgroup(text: str, read: Callable[[str], str | None] | None = None) -> CpuCgroup | None:
    """The cpu controller's hierarchy in a mountinfo text: v1 ``cpu`` first, else the unified v2 hierarchy.

    ``read`` (path -> text | None) reads ``cgroup.controllers`` to confirm v2 offers cpu; without it a v2
    mount is assumed to."""
    v2: CpuCgroup | None = None
    for entry in mountinfo(text):
        if entry.fstype == "cgroup" and "cpu" in entry.super_options:
            return CpuCgroup(1, entry.point, entry.root)
        if entry.fstype == "cgroup2" and v2 is None:
            controllers = read(f"{entry.point}/cgroup.controllers") if read is not None else "cpu"
            if isinstance(controllers, str) and "cpu" in controllers.split():
                v2 = CpuCgroup(2, entry.point, entry.root)
    return v2
