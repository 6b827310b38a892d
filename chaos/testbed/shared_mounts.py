"""Shared mount propagation for directories bind-mounted into containers.

A storage fault on a container mounts its FUSE layer on the docker HOST, over the bind mount's source; the
container sees that layer only when its bind propagates host mounts (``rslave``), and docker accepts
``rslave`` only when the source lies on a SHARED mount. A directory that is not a mount point of its own is
made one by binding it onto itself (transparent: the same files) and marked shared; :func:`release` undoes
exactly that, and NEVER lazily: a lazily detached self-bind breaks every process whose working directory is
in it (``getcwd`` fails: seen here, it killed a test run whose checkout lay under /tmp), and would detach any
mount below it. A busy self-bind is left in place, which changes nothing for anyone (same files).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from chaos.kernel.mounts import mountinfo as entries

OWNED = Path("/run/mlchaos-self-binds.json")
"""The self-binds mlchaos made on this machine, whichever testbed made them: the last testbed down releases
each one no container binds any more (the one that made it may go down while another still uses it). In /run:
gone at a reboot, like the mounts themselves. Callers hold the testbeds' machine lock."""


def remembered(record: Path = OWNED) -> list[str]:
    """The self-binds mlchaos made here and has not released."""
    try:
        found = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return sorted(str(p) for p in found) if isinstance(found, list) else []


def remember(path: Path, record: Path = OWNED, *, keep: bool = True) -> None:
    """Add ``path`` to (``keep``) or drop it from the machine's record of self-binds mlchaos made."""
    paths = set(remembered(record))
    (paths.add if keep else paths.discard)(str(path))
    tmp = record.with_name(f".{record.name}.{os.getpid()}")
    tmp.write_text(json.dumps(sorted(paths)), encoding="utf-8")
    os.replace(tmp, record)


def mount_points(mountinfo: str | None = None) -> dict[str, bool]:
    """Every mount point of this mount namespace -> whether it is shared (``shared:N`` optional field)."""
    if mountinfo is None:
        with open("/proc/self/mountinfo", encoding="utf-8") as handle:
            mountinfo = handle.read()
    return {entry.point: any(tag.startswith("shared:") for tag in entry.optional) for entry in entries(mountinfo)}


def ensure_shared(path: Path) -> bool:
    """Make ``path`` a shared mount point; True when a self-bind was created for it (for :func:`release`).

    Raises OSError when mount(8) refuses (not root, no mount namespace rights)."""
    target = str(path.resolve())
    points = mount_points()
    created = False
    if target not in points:
        _mount(["--bind", target, target])
        created = True
        points[target] = False
    if not points[target]:
        _mount(["--make-shared", target])
    return created


def release(path: Path) -> str:
    """Remove a self-bind :func:`ensure_shared` created; the line to log."""
    done = subprocess.run(["umount", str(path)], capture_output=True, text=True, check=False)
    if done.returncode == 0:
        return f"removed the shared self-bind of {path}"
    below = [p for p in mount_points() if p.startswith(str(path).rstrip("/") + "/")]
    why = f"mounts below it: {', '.join(below[:3])}" if below else done.stderr.strip() or "busy"
    return f"left the shared self-bind of {path} in place ({why}); it changes nothing"


def _mount(args: list[str]) -> None:
    done = subprocess.run(["mount", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise OSError(f"mount {' '.join(args)} failed: {done.stderr.strip()}")
