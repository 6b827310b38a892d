"""The host-side daemon of the ``storage`` injector: a FUSE passthrough mounted OVER a directory that injects faults.

``python -m injectors.storage.fuselayer --op-id ID --path DIR --fsname chaos-fuse:TAG --control FILE --status FILE
--until-ns N [--drain S] [--log PATH] [--hits FILE] [--foreground]`` opens an fd to ``DIR`` BEFORE mounting over it,
detaches (:func:`chaos.safety.deadman.detach`) and mounts a FUSE filesystem on ``DIR`` whose every operation is
served with ``*at()`` calls relative to that fd. The overlay therefore sits on the very path the job uses,
and everything written through it lands in the real directory underneath: unmounting loses no data.

The fault (mode, ops, latency, probability; :mod:`injectors.storage.fault`) lives in the JSON ``--control``
file; the daemon polls it and acknowledges each new ``generation`` in the ``--status`` file, so the fault can
be changed or cleared live. The operations themselves are :mod:`injectors.storage.passthrough`.
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
import json
import os
import subprocess
import sys
import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# ``name as name`` below: re-exported, where callers and tests find them (the fault's vocabulary, the binding
# probe, the mount table).
from chaos.safety.deadman import detach
from injectors.storage.fault import DEFAULT_OPS as DEFAULT_OPS
from injectors.storage.fault import MUTATING as MUTATING
from injectors.storage.fault import OPS as OPS
from injectors.storage.fault import Fault as Fault
from injectors.storage.fault import FaultState
from injectors.storage.fault import Op as Op
from injectors.storage.hits import HitCounter
from injectors.storage.mounts import FSNAME_PREFIX as FSNAME_PREFIX
from injectors.storage.mounts import SUBTYPE as SUBTYPE
from injectors.storage.mounts import Mount as Mount
from injectors.storage.mounts import chaos_mounts as chaos_mounts
from injectors.storage.mounts import is_mounted as is_mounted
from injectors.storage.mounts import parse_mounts as parse_mounts
from injectors.storage.mounts import unmount_argv as unmount_argv
from injectors.storage.passthrough import Layer, binding
from injectors.storage.passthrough import binding_problem as binding_problem

MODULE = "injectors.storage.fuselayer"
_POLL_S = 0.1


# -- the daemon -----------------------------------------------------------------------------------------------


def _own_mounts() -> str:
    with open("/proc/self/mounts", encoding="utf-8", errors="surrogateescape") as handle:
        return handle.read()


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
    state: FaultState
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
    fuse = binding()
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
        state=FaultState(_seed(args.op_id)),
        hits_file=args.hits,
    )
    _log(f"{args.op_id}: mounting {args.fsname} over {args.path}")
    return serve(daemon, root_fd)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
