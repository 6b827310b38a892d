"""The file operations of the ``checkpoint`` faults, run on the fault's host: directly on this machine, through
``python -m injectors.checkpoint.ops '<request json>'`` (printing one JSON line) on any other.

Every operation works on real files in a checkpoint directory and returns what it found or changed, so the
injector can journal it; undo operations act only when the file is still the one the fault left (its sha256
or inode), so healing never overwrites what the job wrote since.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import random
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from chaos.kernel.durable import fsync_path

_SCAN_DEPTH = 2  # the directory and one level below it (ckpt-<step>/rank-<r>.pt)


class OpError(Exception):
    """The operation cannot be done (no such directory, no matching file); the message says why."""


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def matching(directory: str, pattern: str, *, temp: bool = False) -> list[dict[str, Any]]:
    """Regular files at most one level below ``directory`` whose relative path or name matches ``pattern``
    (fnmatch), newest modification first; names starting with ``.`` (temp files) only when ``temp``."""
    root = Path(directory)
    if not root.is_dir():
        raise OpError(f"{directory} is not a directory (the target has no checkpoint dir there)")
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        depth = len(Path(dirpath).relative_to(root).parts)
        if depth + 1 >= _SCAN_DEPTH:
            dirnames.clear()
        for name in filenames:
            path = Path(dirpath) / name
            relative = str(path.relative_to(root))
            if (name.startswith(".") and not temp) or not (
                fnmatch.fnmatchcase(relative, pattern) or fnmatch.fnmatchcase(name, pattern)
            ):
                continue
            try:
                info = path.stat()
            except FileNotFoundError:
                continue  # removed while we looked (a pruned checkpoint)
            found.append({"path": str(path), "size": info.st_size, "mtime_ns": info.st_mtime_ns})
    return sorted(found, key=lambda f: (f["mtime_ns"], f["path"]), reverse=True)


def newest(directory: str, pattern: str) -> dict[str, Any]:
    """The newest finished file matching ``pattern``; OpError when there is none."""
    found = matching(directory, pattern)
    if not found:
        raise OpError(f"no checkpoint file matching {pattern!r} in {directory}")
    return found[0]


def corrupt(path: str, count: int, seed: str, backup: str) -> dict[str, Any]:
    """Flip ``count`` bytes (XOR 0xFF) of ``path`` at offsets drawn from ``seed`` in the middle half of the file
    (where a checkpoint's tensor data lies), after copying the original to ``backup``; fsync."""
    original = Path(path).read_bytes()
    if len(original) < 4:
        raise OpError(f"{path} has {len(original)} bytes: nothing to corrupt")
    Path(backup).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(path, backup)
    rng = random.Random(seed)
    low, high = len(original) // 4, max(len(original) // 4 + 1, 3 * len(original) // 4)
    offsets = sorted(rng.sample(range(low, high), min(count, high - low)))
    data = bytearray(original)
    for offset in offsets:
        data[offset] ^= 0xFF
    with open(path, "r+b") as handle:  # in place: the same inode, as a bad disk or a bit rot would leave it
        for offset in offsets:
            handle.seek(offset)
            handle.write(bytes([data[offset]]))
        handle.flush()
        os.fsync(handle.fileno())
    return {"offsets": offsets, "size": len(original), "sha_before": _sha(original), "sha_after": _sha(bytes(data))}


def drop(path: str, backup: str) -> dict[str, Any]:
    """Remove ``path`` (a copy goes to ``backup`` first, then the unlink is made durable)."""
    original = Path(path).read_bytes()
    Path(backup).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(path, backup)
    os.unlink(path)
    fsync_path(Path(path).parent)
    return {"size": len(original), "sha_before": _sha(original)}


def put_back(path: str, backup: str, expect_sha: str | None) -> dict[str, Any]:
    """Heal: the backup's bytes back at ``path`` when ``path`` still holds ``expect_sha`` (None: when it is
    missing and its directory still exists); otherwise leave it (the job rewrote or pruned it). Idempotent."""
    target, saved = Path(path), Path(backup)
    if not saved.is_file():
        return {"restored": False, "why": "no backup (already healed)"}
    if expect_sha is None:
        fit = not target.exists() and target.parent.is_dir()
    else:
        fit = target.is_file() and _sha(target.read_bytes()) == expect_sha
    if fit:
        tmp = target.with_name(f".{target.name}.chaos-heal")
        shutil.copyfile(saved, tmp)
        fsync_path(tmp)
        os.replace(tmp, target)
        fsync_path(target.parent)
    saved.unlink(missing_ok=True)
    return {"restored": fit, "why": "" if fit else "the job changed or removed the file since"}


def _bump(name: str, ahead: int) -> str:
    """``name`` with its last run of digits raised by ``ahead``, keeping its width (ckpt-000030 -> ckpt-000040)."""
    end = len(name.rstrip("/"))
    start = end
    while start > 0 and name[start - 1].isdigit():
        start -= 1
    if start == end:
        # no number at the end: look for the last one anywhere
        digits = [i for i, ch in enumerate(name) if ch.isdigit()]
        if not digits:
            raise OpError(f"the pointer names {name!r}, which carries no step number to move ahead")
        end = digits[-1] + 1
        start = end
        while start > 0 and name[start - 1].isdigit():
            start -= 1
    width = end - start
    return f"{name[:start]}{int(name[start:end]) + ahead:0{width}d}{name[end:]}"


def stale_pointer(directory: str, pointer: str, name: str | None, ahead: int) -> dict[str, Any]:
    """Make ``pointer`` (a text file holding a checkpoint's name, or a symlink to it) name a checkpoint that never
    completed: ``name`` (default: the current one with its step ``ahead``), created as a torn copy of the
    current one (each file cut to half its size, no ``manifest.json``) unless it exists."""
    root = Path(directory)
    link = root / pointer
    if link.is_symlink():
        current, kind = os.readlink(link), "symlink"
    elif link.is_file():
        current, kind = link.read_text(encoding="utf-8").strip(), "file"
    else:
        raise OpError(f"{link} does not exist: this job keeps no {pointer!r} pointer")
    source = (root / current) if not os.path.isabs(current) else Path(current)
    stale = name or _bump(current, ahead)
    target = root / stale if not os.path.isabs(stale) else Path(stale)
    created: list[dict[str, str]] = []
    if not target.exists() and source.exists():
        files = [source] if source.is_file() else sorted(p for p in source.iterdir() if p.is_file())
        if source.is_dir():
            target.mkdir(parents=True)
            created.append({"path": str(target), "sha": ""})
        for file in files:
            if file.name == "manifest.json" or file.name.startswith("."):
                continue  # the commit record is exactly what a checkpoint that never completed lacks
            out = target / file.name if source.is_dir() else target
            data = file.read_bytes()[: max(1, file.stat().st_size // 2)]
            out.write_bytes(data)
            created.append({"path": str(out), "sha": _sha(data)})
    before = link.read_bytes() if kind == "file" else None
    tmp = root / f".{pointer}.chaos-stale"
    if kind == "symlink":
        tmp.unlink(missing_ok=True)
        os.symlink(stale, tmp)
    else:
        tmp.write_text(stale + "\n", encoding="utf-8")
        fsync_path(tmp)
    os.replace(tmp, link)
    fsync_path(root)
    return {
        "kind": kind,
        "current": current,
        "stale": stale,
        "created": created,
        "before": None if before is None else before.decode("utf-8", "replace"),
        "inode": os.lstat(link).st_ino,
    }


def restore_pointer(
    directory: str, pointer: str, kind: str, current: str, inode: int, created: list[Any]
) -> dict[str, Any]:
    """Heal ``stale_pointer``: the pointer back to ``current`` while it is still OUR pointer (same inode: the job
    replaces its pointer by rename), and remove the files it created that still hold what it wrote."""
    root = Path(directory)
    link = root / pointer
    restored = False
    try:
        ours = os.lstat(link).st_ino == inode
    except FileNotFoundError:
        ours = False
    if ours:
        tmp = root / f".{pointer}.chaos-heal"
        tmp.unlink(missing_ok=True)
        if kind == "symlink":
            os.symlink(current, tmp)
        else:
            tmp.write_text(current + "\n", encoding="utf-8")
        os.replace(tmp, link)
        fsync_path(root)
        restored = True
    removed = []
    for entry in reversed(created):
        path = Path(str(entry.get("path")))
        sha = str(entry.get("sha", ""))
        if sha and path.is_file() and _sha(path.read_bytes()) == sha:
            path.unlink()
            removed.append(str(path))
        elif not sha and path.is_dir() and not any(path.iterdir()):
            path.rmdir()
            removed.append(str(path))
    return {"restored": restored, "removed": removed}


def dispatch(request: dict[str, Any]) -> dict[str, Any]:
    """Run one operation named by ``request["op"]`` with the request's other keys as arguments."""
    args = {k: v for k, v in request.items() if k != "op"}
    ops: dict[str, Callable[..., Any]] = {
        "matching": matching,
        "newest": newest,
        "corrupt": corrupt,
        "drop": drop,
        "put_back": put_back,
        "stale_pointer": stale_pointer,
        "restore_pointer": restore_pointer,
    }
    op = ops.get(str(request.get("op")))
    if op is None:
        raise OpError(f"unknown operation {request.get('op')!r}")
    result = op(**args)
    return {"result": result}


def main(argv: list[str]) -> int:
    """``python -m injectors.checkpoint.ops '<json>'``: one JSON line, {"result": ...} or {"error": "..."}."""
    try:
        out = dispatch(json.loads(argv[0]))
    except (OpError, OSError, ValueError, TypeError, IndexError) as exc:
        out = {"error": f"{type(exc).__name__}: {exc}" if not isinstance(exc, OpError) else str(exc)}
    print(json.dumps(out))
    return 0 if "result" in out else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
