"""The host-side daemon of the ``storage`` injector: a FUSE passthrough mounted OVER a directory that injects faults.

``python -m injectors.storage.fuselayer --op-id ID --path DIR --fsname chaos-fuse:TAG --control FILE --status FILE
--until-ns N [--drain S] [--log PATH] [--hits FILE] [--foreground]`` opens an fd to ``DIR`` BEFORE mounting over it,
detaches (:func:`chaos.safety.deadman.detach`) and mounts a FUSE filesystem on ``DIR`` whose every operation is
served with ``*at()`` calls relative to that fd. The overlay therefore sits on the very path the job uses,
and everything written through it lands in the real directory underneath: unmounting loses no data.

The fault (mode, ops, latency, probability) lives in the JSON ``--control`` file; the daemon polls it and
acknowledges each new ``generation`` in the ``--status`` file, so the fault can be changed or cleared live.
The daemon ends the fault by itself, whoever else fails:

- at ``--until-ns`` (its own dead-man) it clears the fault and unmounts its mount;
- as soon as its mount leaves the mount table (``fusermount3 -u``/``-uz`` by heal, by the harness's
  dead-man or by hand) it clears the fault, so operations blocked in ``hang`` complete as passthrough;
- files the job still holds open after a lazy unmount keep working as a plain passthrough for ``--drain``
  seconds; then the daemon exits, which aborts the FUSE connection: later I/O on those fds fails with
  ENOTCONN (``close()`` too, though it still releases the fd). It exits once the last such file is closed.

It never unmounts anything but its own mount (matched by fsname and mount point), and it does not use
SIGTERM-driven libfuse teardown on purpose: that path unmounts by PATH, which could hit a newer mount.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import json
import os
import random
import stat
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from chaos.safety.deadman import detach
from injectors.storage.hits import HitCounter, matches

# The mount-table helpers live in injectors.storage.mounts; re-exported here, where callers found them first.
from injectors.storage.mounts import FSNAME_PREFIX as FSNAME_PREFIX
from injectors.storage.mounts import SUBTYPE as SUBTYPE
from injectors.storage.mounts import Mount as Mount
from injectors.storage.mounts import chaos_mounts as chaos_mounts
from injectors.storage.mounts import is_mounted as is_mounted
from injectors.storage.mounts import parse_mounts as parse_mounts
from injectors.storage.mounts import unescape as unescape
from injectors.storage.mounts import unmount_argv as unmount_argv

MODULE = "injectors.storage.fuselayer"
MODES = ("off", "latency", "hang", "eio", "enospc", "fsync_stall", "readonly")
Op = Literal[
    "getattr",
    "access",
    "readdir",
    "readlink",
    "statfs",
    "open",
    "create",
    "read",
    "write",
    "flush",
    "fsync",
    "release",
    "rename",
    "unlink",
    "mkdir",
    "rmdir",
    "symlink",
    "link",
    "mknod",
    "truncate",
    "chmod",
    "chown",
    "utimens",
]
OPS: tuple[str, ...] = get_args(Op)  # every operation the layer can hit
MUTATING = frozenset(
    {
        "create",
        "write",
        "rename",
        "unlink",
        "mkdir",
        "rmdir",
        "symlink",
        "link",
        "mknod",
        "truncate",
        "chmod",
        "chown",
        "utimens",
    }
)
_DATA_OPS = ("open", "create", "read", "write", "flush", "fsync", "rename", "unlink", "mkdir", "rmdir", "truncate")
DEFAULT_OPS: dict[str, tuple[str, ...]] = {
    "latency": _DATA_OPS,
    "hang": _DATA_OPS,
    "eio": _DATA_OPS,
    # where a full disk really reports itself: allocating calls and the fsync that flushes delayed allocation
    "enospc": ("create", "write", "mkdir", "symlink", "link", "mknod", "truncate", "fsync"),
    "fsync_stall": ("fsync",),
    "readonly": ("open", *sorted(MUTATING)),  # open only fails when it asks for write access
    "off": (),
}
_ERRNO = {"eio": errno.EIO, "enospc": errno.ENOSPC, "readonly": errno.EROFS}
_POLL_S = 0.1
_WRITE_ACCESS = os.O_WRONLY | os.O_RDWR | os.O_TRUNC


# -- the fault, as written to the control file ------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    """One fault setting; ``generation`` tells a new setting from a re-read of the same one."""

    mode: str = "off"
    ops: frozenset[str] = frozenset()
    latency_s: float = 0.0
    probability: float = 1.0
    generation: int = 0
    files: tuple[str, ...] = ()  # globs relative to the mount (injectors.storage.hits.matches); empty: all

    def to_json(self) -> bytes:
        body = {
            "mode": self.mode,
            "ops": sorted(self.ops),
            "latency_s": self.latency_s,
            "probability": self.probability,
            "generation": self.generation,
            "files": list(self.files),
        }
        return json.dumps(body, sort_keys=True).encode() + b"\n"

    @classmethod
    def from_json(cls, data: bytes) -> Fault:
        """Parse a control file; ValueError names what is wrong (the daemon then keeps its current fault)."""
        raw = json.loads(data)
        if not isinstance(raw, dict):
            raise ValueError("control file is not a JSON object")
        mode, ops = raw.get("mode"), raw.get("ops", [])
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; one of {', '.join(MODES)}")
        if not isinstance(ops, list) or any(op not in OPS for op in ops):
            raise ValueError(f"ops must be a list drawn from {', '.join(OPS)}; got {ops!r}")
        latency, probability, generation = raw.get("latency_s", 0.0), raw.get("probability", 1.0), raw.get("generation")
        if not isinstance(latency, (int, float)) or latency < 0:
            raise ValueError(f"latency_s must be a non-negative number, got {latency!r}")
        if not isinstance(probability, (int, float)) or not 0 <= probability <= 1:
            raise ValueError(f"probability must be within [0, 1], got {probability!r}")
        if not isinstance(generation, int):
            raise ValueError(f"generation must be an integer, got {generation!r}")
        files = raw.get("files", [])
        if not isinstance(files, list) or not all(isinstance(item, str) and item for item in files):
            raise ValueError(f"files must be a list of non-empty glob patterns, got {files!r}")
        return cls(str(mode), frozenset(ops), float(latency), float(probability), generation, tuple(files))


class _FaultState:
    """The live fault plus a condition that wakes every delayed or hung operation when it changes."""

    def __init__(self, seed: int) -> None:
        self.fault = Fault()
        self.changed = threading.Condition()
        self._rng = random.Random(seed)  # per-op seed: the same op id draws the same sequence

    def set(self, fault: Fault) -> None:
        with self.changed:
            self.fault = fault
            self.changed.notify_all()

    def clear(self) -> None:
        self.set(Fault(generation=self.fault.generation))

    def draw(self, probability: float) -> bool:
        with self.changed:
            return probability >= 1.0 or self._rng.random() < probability

    def wait(self, fault: Fault, timeout_s: float | None) -> None:
        """Block until ``timeout_s`` passes (None: forever) or the fault is no longer ``fault``."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self.changed:
            while self.fault is fault:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return
                self.changed.wait(left)


# -- the passthrough filesystem ---------------------------------------------------------------------------------


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

    def __init__(self, root_fd: int, state: _FaultState, on_ready: Any, hits: HitCounter | None = None) -> None:
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
        uid, gid, _pid = _binding().fuse_get_context()
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


# -- the daemon -----------------------------------------------------------------------------------------------


def _own_mounts() -> str:
    with open("/proc/self/mounts", encoding="utf-8", errors="surrogateescape") as handle:
        return handle.read()


def _binding() -> Any:
    """mfusepy, loaded on first use (it loads libfuse through ctypes at import and raises when it is missing)."""
    # Prefer libfuse3: libfuse2 lacks the config that hard_remove/nullpath_ok need, and its fusermount differs.
    os.environ.setdefault("FUSE_LIBRARY_NAME", "fuse3")
    return importlib.import_module("mfusepy")


def binding_problem() -> str | None:
    """Why the FUSE binding cannot load here, or None when it can."""
    try:
        _binding()
    except ImportError:
        return "the Python package mfusepy is not installed (pip install mfusepy)"
    except (OSError, AttributeError) as exc:
        return f"mfusepy cannot load libfuse ({exc}); install the Debian package fuse3 (libfuse3-3)"
    return None


def _log(message: str) -> None:
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} fuselayer[{os.getpid()}] {message}", flush=True)


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as handle:
        handle.write(data)
    os.replace(tmp, path)


@dataclass
class _Daemon:
    op_id: str
    path: str
    fsname: str
    control: Path
    status: Path
    until_ns: int
    drain_s: float
    state: _FaultState
    hits_file: Path | None = None
    hits: HitCounter = field(default_factory=HitCounter)
    mounted: threading.Event = field(default_factory=threading.Event)
    phase: str = "starting"
    _control_key: tuple[int, int, int] | None = None

    def report(self, phase: str | None = None) -> None:
        if phase is not None:
            self.phase = phase
        fault = self.state.fault
        body = {"pid": os.getpid(), "phase": self.phase, "generation": fault.generation, "mode": fault.mode}
        try:
            _write_atomic(self.status, json.dumps(body).encode() + b"\n")
        except OSError as exc:  # the status is a courtesy; the fault itself must go on
            _log(f"cannot write status {self.status}: {exc}")

    def save_hits(self, *, always: bool = False) -> None:
        """Write the hit counts (evidence of what the layer did) when they changed, or ``always``."""
        if self.hits_file is None or not (always or self.hits.dirty):
            return
        try:
            _write_atomic(self.hits_file, self.hits.snapshot())
        except OSError as exc:
            _log(f"cannot write hits {self.hits_file}: {exc}")

    def reload(self) -> None:
        """Adopt the control file when it changed; a bad file is logged and the current fault kept."""
        try:
            st = os.stat(self.control)
        except FileNotFoundError:
            return
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if key == self._control_key:
            return
        self._control_key = key
        try:
            fault = Fault.from_json(self.control.read_bytes())
        except (OSError, ValueError) as exc:
            _log(f"ignoring control file: {exc}")
            return
        if fault != self.state.fault:
            self.state.set(fault)
            _log(f"fault now {fault.mode} on {sorted(fault.ops)} (generation {fault.generation})")
            self.report()

    def watch(self) -> None:
        """The monitor thread: control file, deadline, and the mount vanishing under us."""
        drain_until: float | None = None
        deadline_done = False
        while True:
            time.sleep(_POLL_S)
            self.save_hits()
            if drain_until is None:
                self.reload()
            if not deadline_done and time.time_ns() >= self.until_ns:
                deadline_done = True
                _log("deadline reached: clearing the fault and unmounting")
                self.state.clear()
                self.report()
                self._unmount()
            if drain_until is None and self.mounted.is_set() and not is_mounted(self.fsname, self.path, _own_mounts()):
                # Unmounted by heal, the dead-man or a person: whatever the control file says, the fault is over.
                self.state.clear()
                drain_until = time.monotonic() + self.drain_s
                self.report("draining")
                _log(f"mount gone: fault cleared, serving files still open for up to {self.drain_s:g}s")
            if drain_until is not None and time.monotonic() >= drain_until:
                _log("drain over: exiting (files still open now fail with ENOTCONN)")
                self.save_hits(always=True)
                self.report("exited")
                os._exit(0)  # closes /dev/fuse, which aborts the connection without touching any mount

    def _unmount(self) -> None:
        for lazy in (False, True):
            if not is_mounted(self.fsname, self.path, _own_mounts()):
                return
            done = subprocess.run(unmount_argv(self.path, lazy=lazy), capture_output=True, text=True, check=False)
            if done.returncode == 0:
                return
            _log(f"{' '.join(unmount_argv(self.path, lazy=lazy))} failed: {done.stderr.strip()}")

    def on_ready(self) -> None:
        self.mounted.set()
        self.report("serving")
        _log(f"mounted {self.fsname} on {self.path}")


def serve(daemon: _Daemon, root_fd: int) -> int:
    """Mount and serve until the mount is gone and no file is open any more (or the drain ends)."""
    fuse = _binding()
    daemon.reload()
    threading.Thread(target=daemon.watch, name="fuselayer-watch", daemon=True).start()
    options: dict[str, Any] = {
        "foreground": True,
        "fsname": daemon.fsname,
        "subtype": SUBTYPE,
        "default_permissions": True,  # the kernel checks permissions: this daemon runs as root
        "hard_remove": True,  # no .fuse_hidden files that could outlive a lazy unmount in the real dir
    }
    if os.geteuid() == 0:
        options["allow_other"] = True  # the job may run as another user than the harness
    try:
        fuse.FUSE(Layer(root_fd, daemon.state, daemon.on_ready, daemon.hits), daemon.path, **options)
    except RuntimeError as exc:
        _log(f"FUSE mount/serve failed: {exc}")
        daemon.save_hits(always=True)
        daemon.report("failed")
        return 1
    daemon.save_hits(always=True)
    daemon.report("exited")
    _log("unmounted; exiting")
    return 0


def _seed(op_id: str) -> int:
    return zlib.crc32(op_id.encode())


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}")
    parser.add_argument("--op-id", required=True, help="the fault op this daemon belongs to (heal finds it by it)")
    parser.add_argument("--path", required=True, help="absolute directory to mount over")
    parser.add_argument("--fsname", required=True, help=f"mount source, must start with {FSNAME_PREFIX}")
    parser.add_argument("--control", type=Path, required=True, help="JSON fault setting, polled")
    parser.add_argument("--status", type=Path, required=True, help="where the daemon reports its state")
    parser.add_argument("--until-ns", type=int, required=True, help="wall-clock deadline (time.time_ns)")
    parser.add_argument("--drain", type=float, default=5.0, help="seconds open files are served after unmount")
    parser.add_argument("--log", type=Path, default=None)
    parser.add_argument("--hits", type=Path, default=None, help="where to count hits (injectors.storage.hits)")
    parser.add_argument("--foreground", action="store_true", help="do not detach (debugging)")
    args = parser.parse_args(argv)
    if not args.fsname.startswith(FSNAME_PREFIX) or "," in args.fsname:
        parser.error(f"--fsname must start with {FSNAME_PREFIX} and contain no comma")
    if not os.path.isabs(args.path):
        parser.error("--path must be absolute")
    if problem := binding_problem():
        print(f"fuselayer: {problem}", flush=True)
        return 2
    # Opened before the mount hides it: every operation goes through this fd to the real directory.
    try:
        root_fd = os.open(args.path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        print(f"fuselayer: cannot open {args.path}: {exc}", flush=True)
        return 2
    if not args.foreground:
        detach(args.log)  # keeps root_fd: detach only redirects stdio
    os.umask(0)  # modes arrive from the kernel with the caller's umask already applied
    daemon = _Daemon(
        op_id=args.op_id,
        path=args.path,
        fsname=args.fsname,
        control=args.control,
        status=args.status,
        until_ns=args.until_ns,
        drain_s=args.drain,
        state=_FaultState(_seed(args.op_id)),
        hits_file=args.hits,
    )
    _log(f"{args.op_id}: mounting {args.fsname} over {args.path}")
    return serve(daemon, root_fd)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
