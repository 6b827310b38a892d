"""Node faults: ``cpu_throttle`` (a CFS quota in a cgroup of our own) and ``memory_pressure`` (a memory hog).

``cpu_throttle`` moves the selected processes (``rank``/``pid``/``name``, as in :mod:`injectors.process.faults`)
into a NEW cgroup ``<cpu hierarchy>/chaos-<hash>`` whose quota is ``fraction`` CPUs: cgroup v1
``cpu.cfs_quota_us = fraction x cpu.cfs_period_us``, or v2 ``cpu.max`` when ``/sys/fs/cgroup`` is unified.
Each target's original cgroup is read from ``/proc/<pid>/cgroup`` at prepare and journaled. Children the
targets start meanwhile are born into our cgroup and are throttled too. While throttled, the targets are
outside their original cpu cgroup, so a quota set on THAT cgroup (e.g. a container's) does not bind them.
On v2 the cpu controller may have to be enabled in the root's ``cgroup.subtree_control``; that is left on
(other cgroups may rely on it by then, and disabling it fails while any child uses it).

Heal and the dead-man revert are ONE shell script (:data:`REVERT_SCRIPT`, run through ``sh -c`` with every
path as a positional argument, never spliced into the script): lift the quota first (so the throttle ends
even if a later step fails), move every process still in our cgroup back to its recorded cgroup (children
to the first target's), then remove our cgroup. Heal runs the same argv the dead-man would and then checks
the outcome, so the crash path is the tested path. Only a cgroup whose name matches the ``chaos-<hex>``
pattern under a cgroup mount is ever touched, and only processes inside it are moved: a pid recycled by a
stranger outside our cgroup is never touched.

``memory_pressure`` runs a detached helper (``python -m injectors.node``) that allocates ``megabytes``,
touches every page and re-touches them every second until its deadline, heal, or any signal; the kernel
frees the memory whenever it exits, however it exits. It marks itself the OOM killer's first choice
(``oom_score_adj=1000``), so pressure that goes too far kills the hog, not the job under test.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, JsonValue, model_validator

import injectors.storage.fuselayer as fuselayer
from chaos.cluster.base import TransportError
from chaos.cluster.local import LocalTransport
from chaos.kernel.mounts import CpuCgroup, cpu_cgroup
from chaos.plugins.injector import (
    Applied,
    FaultOp,
    InjectionContext,
    InjectionError,
    Unsupported,
    optional_int,
    state_int,
)
from chaos.safety import deadman
from chaos.spec.units import Duration
from injectors import detached
from injectors.base import HeldFault
from injectors.hostfiles import HostFiles
from injectors.process.faults import ProcessHost, ProcessSelector, Targets, resolve_processes

MODULE = "injectors.node"
_OUR_HELPERS = (MODULE, fuselayer.MODULE)  # never throttle our own daemons when a name regex matches them
_CGROUP_NAME = re.compile(r"^chaos-[0-9a-f]{12}$")

REVERT_SCRIPT = r"""
cg=$1; limit_file=$2; unlimited=$3; fallback=$4; root=$5; shift 5
[ -d "$cg" ] || exit 0
echo "$unlimited" > "$cg/$limit_file" || true
[ -d "$fallback" ] || fallback=$root
tries=0
while ! rmdir "$cg" 2>/dev/null; do
  tries=$((tries + 1))
  if [ "$tries" -gt 50 ]; then echo "cannot remove $cg: $(cat "$cg/cgroup.procs" | tr '\n' ' ')" >&2; exit 1; fi
  for p in $(cat "$cg/cgroup.procs"); do
    dest=$fallback
    for pair in "$@"; do [ "${pair%%=*}" = "$p" ] && [ -d "${pair#*=}" ] && dest=${pair#*=}; done
    echo "$p" > "$dest/cgroup.procs" 2>/dev/null || echo "$p" > "$fallback/cgroup.procs" 2>/dev/null || true
  done
  sleep 0.1
done
"""
"""Undo a throttle: ``sh -c REVERT_SCRIPT mlchaos-revert CGROUP LIMIT_FILE UNLIMITED FALLBACK ROOT PID=CGROUP...``."""


# -- parameters -------------------------------------------------------------------------------------------------


class CpuThrottleParams(ProcessSelector):
    """Cap the selected processes, together, at ``fraction`` CPUs."""

    fraction: float = Field(gt=0, description="CPUs the targets may use together: 0.2 = 20% of one CPU, 2 = two")
    period: Duration = Field(default=0.1, ge=0.001, le=1.0, description="CFS accounting period, 1ms..1s")

    @model_validator(mode="after")
    def _quota_in_range(self) -> CpuThrottleParams:
        if self.fraction * self.period < 0.001:
            raise ValueError("fraction x period must be at least 1ms (the kernel's smallest quota)")
        return self


class MemoryPressureParams(BaseModel):
    """Hold ``megabytes`` of touched, resident memory on the host for the fault's duration."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    megabytes: int = Field(gt=0, description="MiB to allocate and keep touched")


# -- cgroup hierarchy --------------------------------------------------------------------------------------------


class Hierarchy(CpuCgroup):
    """The cpu controller's hierarchy as the throttle uses it: which file limits a cgroup, and where one lives."""

    @property
    def limit_file(self) -> str:
        return "cpu.cfs_quota_us" if self.version == 1 else "cpu.max"

    @property
    def unlimited(self) -> str:
        return "-1" if self.version == 1 else "max"


class _HostFs(HostFiles):
    """Reads and writes of small (pseudo-)files on the fault's host: local directly, remote through sh."""

    def write(self, path: str, value: str) -> None:
        """One write() of ``value`` (cgroup files take one value per write); InjectionError on failure."""
        if self.local:
            try:
                with open(path, "w", encoding="ascii") as handle:
                    handle.write(value)
            except OSError as exc:
                raise InjectionError(f"cannot write {value!r} to {path}: {exc.strerror}") from exc
            return
        self.run_checked(
            ["sh", "-c", 'printf "%s\\n" "$2" > "$1"', "mlchaos-write", path, value], f"write {value!r} to {path}"
        )

    def mkdir(self, path: str) -> None:
        if self.local:
            try:
                os.mkdir(path)
            except OSError as exc:
                raise InjectionError(f"cannot create cgroup {path}: {exc.strerror}") from exc
            return
        self.run_checked(["mkdir", path], f"create cgroup {path}")

    def rmdir(self, path: str) -> None:
        if self.local:
            os.rmdir(path)
        else:
            self.run_checked(["rmdir", path], f"remove {path}")

    def exists(self, path: str) -> bool:
        if self.local:
            return os.path.exists(path)
        try:
            return self.transport.run(["test", "-e", path], timeout=15).ok
        except TransportError:
            return False


def find_hierarchy(mountinfo: str, read: Callable[[str], str | None] | None = None) -> Hierarchy | None:
    """The cpu controller's hierarchy in a /proc/self/mountinfo text (:func:`chaos.kernel.mounts.cpu_cgroup`)."""
    found = cpu_cgroup(mountinfo, read)
    return None if found is None else Hierarchy(found.version, found.mount, found.root)


def _hierarchy(fs: _HostFs) -> Hierarchy:
    text = fs.read("/proc/self/mountinfo")
    found = find_hierarchy(text or "", fs.read)
    if found is None:
        raise Unsupported(f"no cgroup hierarchy with the cpu controller is mounted on {fs.transport.host}")
    return found


def _cgroup_of(fs: _HostFs, hierarchy: Hierarchy, pid: int) -> str | None:
    """The directory of ``pid``'s cpu cgroup, or None when the pid is gone or outside the hierarchy."""
    return hierarchy.directory_of(fs.read(f"/proc/{pid}/cgroup") or "")


def _under(mount: str, path: str) -> bool:
    top = mount.rstrip("/")
    return (path == top or path.startswith(top + "/")) and "/../" not in f"{path}/"


@dataclass(frozen=True)
class ThrottleState:
    """The journal state of ``cpu_throttle``: the targets, our cgroup, each target's original cgroup, the quota.

    :meth:`from_json` validates the hierarchy and cgroup so that no journal edit can aim us elsewhere; an
    ``originals`` entry that is not a path is dropped (that pid is then moved to the fallback cgroup).
    """

    targets: Targets
    hierarchy: Hierarchy
    cgroup: str
    originals: dict[str, str]
    period_us: int
    quota_us: int

    def to_json(self) -> dict[str, JsonValue]:
        originals: dict[str, JsonValue] = dict(self.originals)
        return {
            **self.targets.to_json(),
            "version": self.hierarchy.version,
            "mount": self.hierarchy.mount,
            "root": self.hierarchy.root,
            "cgroup": self.cgroup,
            "originals": originals,
            "period_us": self.period_us,
            "quota_us": self.quota_us,
        }

    @classmethod
    def from_json(cls, state: dict[str, JsonValue]) -> ThrottleState:
        """InjectionError when a field is missing or the cgroup is not a chaos-<hex> one under the mount."""
        version, mount, root, cgroup = state.get("version"), state.get("mount"), state.get("root"), state.get("cgroup")
        if not (
            isinstance(version, int)
            and version in (1, 2)
            and isinstance(mount, str)
            and isinstance(root, str)
            and isinstance(cgroup, str)
        ):
            raise InjectionError("journal state lacks the cgroup version/mount/root/cgroup of this throttle")
        if os.path.dirname(cgroup) != mount.rstrip("/") or not _CGROUP_NAME.match(os.path.basename(cgroup)):
            raise InjectionError(f"refusing to touch {cgroup!r}: not a chaos-<hex> cgroup directly under {mount!r}")
        raw = state.get("originals")
        originals = {pid: path for pid, path in raw.items() if isinstance(path, str)} if isinstance(raw, dict) else {}
        return cls(
            Targets.from_json(state),
            Hierarchy(version, mount, root),
            cgroup,
            originals,
            state_int(state, "period_us"),
            state_int(state, "quota_us"),
        )


# -- cpu_throttle ------------------------------------------------------------------------------------------------


class CpuThrottleInjector(HeldFault, name="cpu_throttle", params=CpuThrottleParams):
    """cap a rank, pid or command-line match at a fraction of a CPU (cgroup cpu quota)

    Throttle processes with a CFS quota in a cgroup of our own; see the module docstring."""

    def check(self, ctx: InjectionContext, params: BaseModel) -> None:
        """Unsupported unless a cgroup with the cpu controller can be created here (probed: mkdir + rmdir)."""
        fs = _HostFs(ctx.transport)
        hierarchy = _hierarchy(fs)
        if hierarchy.version == 2 and not fs.exists(f"{hierarchy.mount}/cgroup.subtree_control"):
            raise Unsupported(f"{hierarchy.mount} has no cgroup.subtree_control")
        probe = f"{hierarchy.mount}/chaos-probe-{os.getpid()}-{time.monotonic_ns() % 10**9}"
        try:
            fs.mkdir(probe)
        except InjectionError as exc:
            raise Unsupported(f"the cpu cgroup hierarchy at {hierarchy.mount} is not writable: {exc}") from None
        try:
            if not fs.exists(f"{probe}/cgroup.procs"):
                raise Unsupported(f"{probe} is not a cgroup (no cgroup.procs)")
        finally:
            try:
                fs.rmdir(probe)
            except (OSError, InjectionError):
                pass  # an empty cgroup; nothing runs in it

    def prepare(self, ctx: InjectionContext, op: FaultOp) -> Applied:
        """Resolve targets and their current cgroups; InjectionError without a duration or for a pid whose
        cgroup lies outside the mounted hierarchy (it could not be moved back)."""
        duration = self.duration(op)
        params = op.params_as(CpuThrottleParams)
        host, fs = ProcessHost(ctx.transport), _HostFs(ctx.transport)
        pids, starts, label = resolve_processes(ctx, params)
        keep = [i for i, pid in enumerate(pids) if deadman.module_of(host.cmdline(pid) or []) not in _OUR_HELPERS]
        if not keep:
            raise InjectionError(f"{label} matches only mlchaos's own helpers")
        pids, starts = [pids[i] for i in keep], [starts[i] for i in keep]
        hierarchy = _hierarchy(fs)
        originals: dict[str, str] = {}
        for pid in pids:
            where = _cgroup_of(fs, hierarchy, pid)
            if where is None:
                raise InjectionError(f"pid {pid}'s cpu cgroup is not under {hierarchy.mount}; cannot restore it")
            originals[str(pid)] = where
        digest = hashlib.sha1(f"{op.op_id}:{time.time_ns()}:{os.getpid()}".encode()).hexdigest()[:12]
        period_us = round(params.period * 1e6)
        quota_us = max(1000, round(params.fraction * period_us))
        targets = Targets(tuple(pids), tuple(starts), label)
        cgroup = f"{hierarchy.mount.rstrip('/')}/chaos-{digest}"
        state = ThrottleState(targets, hierarchy, cgroup, originals, period_us, quota_us)
        return op.record(
            self.name,
            ctx.transport.host,
            state.to_json(),
            f"throttle {label} to {params.fraction:g} CPU for {duration:g}s",
        )

    def apply(self, ctx: InjectionContext, applied: Applied) -> None:
        """Create our cgroup, set its quota, move the targets in (all threads: cgroup.procs)."""
        state = ThrottleState.from_json(applied.state)
        hierarchy, cgroup, period_us, quota_us = state.hierarchy, state.cgroup, state.period_us, state.quota_us
        host, fs = ProcessHost(ctx.transport), _HostFs(ctx.transport)
        alive = state.targets.alive(host, "throttled")
        if hierarchy.version == 2:
            control = fs.read(f"{hierarchy.mount}/cgroup.subtree_control") or ""
            if "cpu" not in control.split():
                fs.write(f"{hierarchy.mount}/cgroup.subtree_control", "+cpu")  # left on: see module docstring
        fs.mkdir(cgroup)
        if hierarchy.version == 1:
            fs.write(f"{cgroup}/cpu.cfs_period_us", str(period_us))
            fs.write(f"{cgroup}/cpu.cfs_quota_us", str(quota_us))
        else:
            fs.write(f"{cgroup}/cpu.max", f"{quota_us} {period_us}")
        moved = 0
        for pid in alive:
            try:
                fs.write(f"{cgroup}/cgroup.procs", str(pid))
                moved += 1
            except InjectionError:
                if host.start_time(pid) is not None:  # gone meanwhile is fine, anything else is not
                    raise
        if not moved:
            raise InjectionError(f"{state.targets.selector} exited before it could be throttled")

    def heal(self, ctx: InjectionContext, applied: Applied) -> None:
        """Run :meth:`revert_command` (lift quota, move everyone back, remove our cgroup), then verify.

        Idempotent; works from ``applied.state`` alone. InjectionError when our cgroup is still there or a
        recorded target that is still alive is not back in its original cgroup.
        """
        state = ThrottleState.from_json(applied.state)
        argv, hierarchy, cgroup = _revert_argv(state), state.hierarchy, state.cgroup
        fs, host = _HostFs(ctx.transport), ProcessHost(ctx.transport)
        try:
            done = ctx.transport.run(argv, timeout=60)
        except TransportError as exc:
            raise InjectionError(f"cannot run the cgroup revert on {ctx.transport.host}: {exc}") from exc
        if not done.ok or fs.exists(cgroup):
            raise InjectionError(f"cgroup {cgroup} could not be removed: {done.stderr.strip()[:300]}")
        for pid in state.targets.same(host):
            now, want = _cgroup_of(fs, hierarchy, pid), state.originals.get(str(pid))
            if want is not None and fs.exists(want) and now != want:
                raise InjectionError(f"pid {pid} is in cgroup {now}, not back in {want}")

    def revert_command(self, applied: Applied) -> list[str] | None:
        """``sh -c REVERT_SCRIPT`` with our generated paths as arguments (no user input reaches the script)."""
        return _revert_argv(ThrottleState.from_json(applied.state))


def _revert_argv(state: ThrottleState) -> list[str]:
    hierarchy = state.hierarchy
    recorded = {
        pid: path
        for pid, path in state.originals.items()
        if _under(hierarchy.mount, path)  # a journal edit cannot aim elsewhere
    }
    pairs = [f"{pid}={path}" for pid, path in recorded.items()]
    fallback = next(iter(recorded.values()), hierarchy.mount)  # children go where the first target was
    return [
        "sh",
        "-c",
        REVERT_SCRIPT,
        "mlchaos-cpu-revert",
        state.cgroup,
        hierarchy.limit_file,
        hierarchy.unlimited,
        fallback,
        hierarchy.mount,
        *pairs,
    ]


# -- memory_pressure ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryState:
    """The journal state of ``memory_pressure``: the size of the hog and (once applied) its pid."""

    megabytes: int
    helper_pid: int | None = None

    def to_json(self) -> dict[str, JsonValue]:
        state: dict[str, JsonValue] = {"megabytes": self.megabytes}
        return state if self.helper_pid is None else {**state, "helper_pid": self.helper_pid}

    @classmethod
    def from_json(cls, state: dict[str, JsonValue]) -> MemoryState:
        return cls(state_int(state, "megabytes"), optional_int(state, "helper_pid"))


def _available_mb(fs: _HostFs) -> int | None:
    for line in (fs.read("/proc/meminfo") or "").splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) // 1024
    return None


class MemoryPressureInjector(HeldFault, name="memory_pressure", params=MemoryPressureParams):
    """hold N MiB of resident memory on the host (the hog is the OOM killer's first pick)

    A detached helper that holds ``megabytes`` of touched memory until heal or its deadline."""

    def check(self, ctx: InjectionContext, params: BaseModel) -> None:
        if not isinstance(ctx.transport, LocalTransport):
            done = ctx.transport.run(detached.import_argv(ctx.transport, MODULE), timeout=30)
            if not done.ok:
                raise Unsupported(f"mlchaos is not importable by the host's python on {ctx.transport.host}")

    def prepare(self, ctx: InjectionContext, op: FaultOp) -> Applied:
        """InjectionError without a duration or when more than MemAvailable is asked for."""
        duration = self.duration(op)
        params = op.params_as(MemoryPressureParams)
        available = _available_mb(_HostFs(ctx.transport))
        if available is not None and params.megabytes > available:
            raise InjectionError(
                f"{params.megabytes} MiB asked, only {available} MiB available on {ctx.transport.host}"
            )
        description = f"hold {params.megabytes} MiB of memory for {duration:g}s"
        return op.record(self.name, ctx.transport.host, MemoryState(params.megabytes).to_json(), description)

    def apply(self, ctx: InjectionContext, applied: Applied) -> None:
        """Start the hog; records ``helper_pid``. It ends by itself at the op's deadline."""
        host, state = ProcessHost(ctx.transport), MemoryState.from_json(applied.state)
        until_ns = detached.host_deadline_ns(ctx.transport, applied.duration_s or 0.0)
        argv = detached.helper_argv(ctx.transport, MODULE, applied.op_id, megabytes=state.megabytes, until_ns=until_ns)
        log = "memhog.log" if host.local else None
        helper = detached.launch(ctx.transport, argv, what="memory hog", log=log)
        applied.state.update(replace(state, helper_pid=helper).to_json())

    def heal(self, ctx: InjectionContext, applied: Applied) -> None:
        """Stop the hog (verified by cmdline and op id; found by op id after a crash). Idempotent."""
        helper = MemoryState.from_json(applied.state).helper_pid
        ProcessHost(ctx.transport).stop_helpers(MODULE, applied.op_id, helper)

    def revert_command(self, applied: Applied) -> list[str] | None:
        """SIGTERM to this op's hog, found by its command line (module and op id). The hog ends by itself at the
        op's deadline; the dead-man, later, finds nothing and records the op healed, or ends a hog whose own
        deadline falls after the run's (a switch never fires later than the run's deadline + grace)."""
        return detached.stop_then(MODULE, applied.op_id)


def hog(megabytes: int, until_ns: int) -> None:
    """Allocate and touch ``megabytes`` MiB, re-touching every second, until ``until_ns`` or a signal."""

    def request_stop(signum: int, frame: object) -> None:
        raise SystemExit(0)  # nothing to clean up: the kernel frees the memory on exit

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, request_stop)
    try:
        Path("/proc/self/oom_score_adj").write_text("1000")  # raising our own score needs no privilege
    except OSError:
        pass
    memory = bytearray(megabytes << 20)
    pages = len(range(0, len(memory), 4096))
    stamp = 0
    while time.time_ns() < until_ns:
        stamp = (stamp + 1) % 256
        memory[::4096] = bytes([stamp]) * pages  # one write per page keeps every page resident and dirty
        time.sleep(min(1.0, max(0.0, (until_ns - time.time_ns()) / 1e9)))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description="the memory_pressure helper")
    parser.add_argument("--op-id", required=True)
    parser.add_argument("--megabytes", type=int, required=True)
    parser.add_argument("--until-ns", type=int, required=True, help="wall-clock deadline (time.time_ns)")
    parser.add_argument("--log", type=Path, default=None)
    parser.add_argument("--foreground", action="store_true", help="do not detach (debugging)")
    args = parser.parse_args(argv)
    if args.megabytes <= 0:
        parser.error("--megabytes must be positive")
    if not args.foreground:
        deadman.detach(args.log)
    print(f"memhog[{os.getpid()}] {args.op_id}: holding {args.megabytes} MiB", flush=True)
    try:
        hog(args.megabytes, args.until_ns)
    finally:
        print(f"memhog[{os.getpid()}] {args.op_id}: done, memory released on exit", flush=True)
    return 0


INJECTORS = (CpuThrottleInjector, MemoryPressureInjector)

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
