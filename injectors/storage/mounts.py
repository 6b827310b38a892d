"""The mount table as the ``storage`` fault reads it: /proc/mounts parsing and the fusermount3 argv.

Shared by the FUSE daemon (:mod:`injectors.storage.fuselayer`, which watches its own mount), the injector
(:mod:`injectors.storage.injector`, which checks and unmounts it); fields are decoded by
:func:`chaos.kernel.mounts.unescape`. Pure functions of the text they are given: no host access here.
"""

from __future__ import annotations

from dataclasses import dataclass

from chaos.kernel.mounts import unescape

FSNAME_PREFIX = "chaos-fuse"
SUBTYPE = "chaos-fuse"  # the mount's type reads ``fuse.chaos-fuse`` in /proc/mounts


@dataclass(frozen=True)
class Mount:
    """One line of /proc/mounts (octal escapes decoded)."""

    source: str
    target: str
    fstype: str


def parse_mounts(text: str) -> list[Mount]:
    """The entries of a /proc/mounts text."""
    found = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3:
            found.append(Mount(unescape(parts[0]), unescape(parts[1]), parts[2]))
    return found


def chaos_mounts(text: str) -> list[Mount]:
    """The entries made by this module (fsname ``chaos-fuse…``), e.g. for a leak check."""
    return [m for m in parse_mounts(text) if m.source.startswith(FSNAME_PREFIX) or m.fstype == f"fuse.{SUBTYPE}"]


def is_mounted(fsname: str, target: str, text: str) -> bool:
    """Whether the mount named ``fsname`` sits on ``target`` in the given /proc/mounts text."""
    return any(m.source == fsname and m.target == target for m in parse_mounts(text))


def unmount_argv(path: str, *, lazy: bool) -> list[str]:
    """The fusermount3 argv that unmounts ``path`` (``-z``: detach now, finish when the last user leaves)."""
    return ["fusermount3", "-uz" if lazy else "-u", path]
