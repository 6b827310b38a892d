"""The FUSE operations of the ``storage`` layer: a passthrough to the real directory behind a fault gate.

:class:`Layer` serves every operation with ``*at()`` calls relative to an fd opened on the directory before
the mount hid it, after :meth:`Layer._gate` applied the live :class:`~injectors.storage.fault.FaultState`
(delay, hang or errno) and counted the hit. :func:`binding` loads mfusepy, which mounts and serves it.
"""

from __future__ import annotations

import errno
import importlib
import os
import stat
import time
from collections.abc import Callable
from typing import Any

from injectors.storage.fault import FaultState
from injectors.storage.hits import HitCounter, matches

_ERRNO = {"eio": errno.EIO, "enospc": errno.ENOSPC, "readonly": errno.EROFS}
_WRITE_ACCESS = os.O_WRONLY | os.O_RDWR | os.O_TRUNC


def binding() -> Any:
    """mfusepy, loaded on first use (it loads libfuse through ctypes at import and raises when it is missing)."""
    # Prefer libfuse3: libfuse2 lacks the config that hard_remove/nullpath_ok need, and its fusermount differs.
    os.environ.setdefault("FUSE_LIBRARY_NAME", "fuse3")
    return importlib.import_module("mfusepy")


def binding_problem() -> str | None:
    """Why the FUSE binding cannot load here, or None when it can."""
    try:
        binding()
    except ImportError:
        return "the Python package mfusepy is not installed (pip install mfusepy)"
    except (OSError, AttributeError) as exc:
        return f"mfusepy cannot load libfuse ({exc}); install the Debian package fuse3 (libfuse3-3)"
    return None


def _rel(path: str) -> str:
    """FUSE paths are absolute within the mount; the kernel has already resolved ``..`` and symlinks."""
    return path.lstrip("/") or "."


def _path(path: str | None) -> str:
    """The relative path of a named entry; None means libfuse lost the name (an unlinked open file)."""
    if path is None:
        raise OSError(errno.ENOENT, os.strerror(errno.ENOENT))
    return _rel(path)


def _stat_dict(st: os.stat_result) -> dict[str, int]:
    keys = ("st_mode", "st_ino", "st_nlink", "st_uid", "st_gid", "st_size", "st_blocks", "st_blksize", "st_rdev")
    found = {key: int(getattr(st, key)) for key in keys}
    found |= {"st_atime": st.st_atime_ns, "st_mtime": st.st_mtime_ns, "st_ctime": st.st_ctime_ns}
    return found


class Layer:
    """The FUSE operations (mfusepy's duck-typed interface): passthrough to ``root_fd`` behind a fault gate.

    Errors are raised as ``OSError``; mfusepy returns their errno to the kernel. A fault with ``files`` hits
    only operations on a path they select (a rename: either name); every hit is counted in ``hits``. Ops on an open file work on
    its handle (libfuse passes ``path=None`` for an open file that was unlinked meanwhile), so renamed and
    unlinked open files stay usable. ``nullpath_ok`` stays off: mfusepy drops the handle of ``ftruncate``,
    which then needs the path.
    """

    use_ns = True

    def __init__(self, root_fd: int, state: FaultState, on_ready: Any, hits: HitCounter | None = None) -> None:
        self.root = root_fd
        self.state = state
        self._on_ready = on_ready
        self.hits = HitCounter() if hits is None else hits

    # The gate: every operation calls it first with its own name and the path(s) it works on.
    def _gate(self, op: str, path: str | None, *, writes: bool = True, other: str | None = None) -> None:
        shown = (path or "").lstrip("/") or "."
        arrived_ns, waited, hung = time.time_ns(), time.monotonic(), False
        while True:
            fault = self.state.fault
            if fault.mode == "off" or op not in fault.ops:
                break
            if fault.mode == "readonly" and not writes:
                break
            if fault.files and not any(p is not None and matches(p, fault.files) for p in (path, other)):
                break
            if not self.state.draw(fault.probability):
                break
            if fault.mode in ("latency", "fsync_stall"):
                self.state.wait(fault, fault.latency_s)  # a heal mid-delay releases the op at once
                self.hits.add(op, shown, None, at_ns=arrived_ns, waited_s=time.monotonic() - waited)
                return
            if fault.mode == "hang":
                self.state.wait(fault, None)
                hung = True
                continue  # the new setting decides (usually "off": the op goes through)
            code = _ERRNO[fault.mode]
            self.hits.add(op, shown, errno.errorcode[code], at_ns=arrived_ns)
            raise OSError(code, os.strerror(code))
        if hung:  # released from a hang
            self.hits.add(op, shown, None, at_ns=arrived_ns, waited_s=time.monotonic() - waited)

    def _owned(self, rel: str) -> None:
        """New entries belong to the caller, not to this root daemon."""
        uid, gid, _pid = binding().fuse_get_context()
        if uid != os.geteuid() or gid != os.getegid():
            os.chown(rel, uid, gid, dir_fd=self.root, follow_symlinks=False)

    def init(self, path: str) -> None:
        self._on_ready()

    def getattr(self, path: str | None, fh: int | None = None) -> dict[str, int]:
        self._gate("getattr", path, writes=False)
        if fh:  # 0 is never ours (stdin is /dev/null), it is libfuse's "no handle"
            return _stat_dict(os.fstat(fh))
        rel = _path(path)
        if rel == ".":
            return _stat_dict(os.fstat(self.root))
        return _stat_dict(os.stat(rel, dir_fd=self.root, follow_symlinks=False))

    def access(self, path: str, amode: int) -> int:
        self._gate("access", path, writes=bool(amode & os.W_OK))
        if not os.access(_rel(path), amode, dir_fd=self.root):
            raise OSError(errno.EACCES, os.strerror(errno.EACCES))
        return 0

    def opendir(self, path: str) -> int:
        return os.open(_rel(path), os.O_RDONLY | os.O_DIRECTORY, dir_fd=self.root)

    def releasedir(self, path: str | None, fh: int) -> int:
        os.close(fh)
        return 0

    def readdir(self, path: str | None, fh: int) -> list[str]:
        self._gate("readdir", path, writes=False)
        return [".", "..", *os.listdir(fh)]  # listdir reads a dup of fh and rewinds it

    def readlink(self, path: str) -> str:
        self._gate("readlink", path, writes=False)
        return os.readlink(_rel(path), dir_fd=self.root)

    def statfs(self, path: str) -> dict[str, int]:
        self._gate("statfs", path, writes=False)
        sv = os.statvfs(self.root)
        keys = ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree", "f_favail")
        found = {key: int(getattr(sv, key)) for key in keys} | {"f_namemax": sv.f_namemax}
        if self.state.fault.mode == "enospc":  # so that df agrees with the ENOSPC the job gets
            found["f_bfree"] = found["f_bavail"] = 0
        return found

    def open(self, path: str, flags: int) -> int:
        self._gate("open", path, writes=bool(flags & _WRITE_ACCESS))
        return os.open(_rel(path), flags & ~os.O_CREAT, dir_fd=self.root)

    def create(self, path: str, mode: int, flags: int) -> int:
        self._gate("create", path)
        fd = os.open(_rel(path), flags | os.O_CREAT, mode, dir_fd=self.root)
        self._owned(_rel(path))
        return fd

    def read(self, path: str | None, size: int, offset: int, fh: int) -> bytes:
        self._gate("read", path, writes=False)
        return os.pread(fh, size, offset)

    def write(self, path: str | None, data: bytes, offset: int, fh: int) -> int:
        self._gate("write", path)
        return os.pwrite(fh, data, offset)

    def flush(self, path: str | None, fh: int) -> int:
        self._gate("flush", path, writes=False)
        os.close(os.dup(fh))  # what close() would report (e.g. a deferred write error), without closing fh
        return 0

    def fsync(self, path: str | None, datasync: int, fh: int) -> int:
        self._gate("fsync", path, writes=False)
        (os.fdatasync if datasync else os.fsync)(fh)
        return 0

    def release(self, path: str | None, fh: int) -> int:
        try:
            self._gate("release", path, writes=False)
        finally:  # an injected error must not leak the fd
            os.close(fh)
        return 0

    def rename(self, old: str, new: str) -> int:
        self._gate("rename", old, other=new)
        os.rename(_rel(old), _rel(new), src_dir_fd=self.root, dst_dir_fd=self.root)
        return 0

    def unlink(self, path: str) -> int:
        return self._remove("unlink", os.unlink, path)

    def mkdir(self, path: str, mode: int) -> int:
        self._gate("mkdir", path)
        os.mkdir(_rel(path), mode, dir_fd=self.root)
        self._owned(_rel(path))
        return 0

    def rmdir(self, path: str) -> int:
        return self._remove("rmdir", os.rmdir, path)

    def _remove(self, op: str, remove: Callable[..., None], path: str) -> int:
        """unlink and rmdir: the same gate, then the same call shape relative to the backing root."""
        self._gate(op, path)
        remove(_rel(path), dir_fd=self.root)
        return 0

    def symlink(self, target: str, source: str) -> int:
        self._gate("symlink", target)
        os.symlink(source, _rel(target), dir_fd=self.root)
        self._owned(_rel(target))
        return 0

    def link(self, target: str, source: str) -> int:
        self._gate("link", target, other=source)
        os.link(_rel(source), _rel(target), src_dir_fd=self.root, dst_dir_fd=self.root, follow_symlinks=False)
        return 0

    def mknod(self, path: str, mode: int, dev: int) -> int:
        self._gate("mknod", path)
        os.mknod(_rel(path), mode, dev, dir_fd=self.root)
        self._owned(_rel(path))
        return 0

    def truncate(self, path: str | None, length: int, fh: int | None = None) -> int:
        self._gate("truncate", path)
        if fh:
            os.ftruncate(fh, length)
            return 0
        fd = os.open(_path(path), os.O_WRONLY, dir_fd=self.root)
        try:
            os.ftruncate(fd, length)
        finally:
            os.close(fd)
        return 0

    def chmod(self, path: str | None, mode: int) -> int:
        self._gate("chmod", path)
        os.chmod(_path(path), stat.S_IMODE(mode), dir_fd=self.root)
        return 0

    def chown(self, path: str | None, uid: int, gid: int) -> int:
        self._gate("chown", path)
        os.chown(_path(path), uid, gid, dir_fd=self.root, follow_symlinks=False)
        return 0

    def utimens(self, path: str | None, times: tuple[int, int] | None = None) -> int:
        self._gate("utimens", path)
        rel = _path(path)
        if times is None:
            os.utime(rel, dir_fd=self.root, follow_symlinks=False)
        else:
            os.utime(rel, ns=(int(times[0]), int(times[1])), dir_fd=self.root, follow_symlinks=False)
        return 0
