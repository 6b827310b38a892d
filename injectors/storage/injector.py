"""Storage faults: ``storage``, a FUSE layer mounted over a directory (e.g. a job's checkpoint dir).

``mode`` picks the symptom (latency, hang, eio, enospc, fsync_stall, readonly); ``ops``, ``files`` and
``probability`` narrow what is hit. A detached daemon (:mod:`injectors.storage.fuselayer`) serves the layer, and
:func:`change` switches a live fault. Writes land in the real directory, so heal loses no data: it clears the
fault, unmounts (lazily when busy, open files drain for ``drain`` seconds), waits for the daemon and records a
``storage.hit`` event per hit entry. The dead-man's revert is ``fusermount3 -uz <path>``. The reasons behind
this shape: docs/design/storage-layer.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator, model_validator

import injectors.storage.fuselayer as fuselayer
from chaos.cluster.base import Transport, TransportError, host_python
from chaos.cluster.local import LocalTransport
from chaos.cluster.poll import wait_until
from chaos.plugins.injector import (
    Applied,
    FaultOp,
    InjectionContext,
    InjectionError,
    Unsupported,
    optional_int,
    optional_text,
    state_number,
    state_text,
    state_texts,
)
from chaos.safety import deadman
from chaos.safety.state import state_dir
from chaos.spec.units import Duration, check_host_directory
from injectors import detached
from injectors.base import HeldFault
from injectors.hostfiles import HostFiles
from injectors.process.faults import ProcessHost
from injectors.storage.hits import hits_path, record_hits

Mode = Literal["latency", "hang", "eio", "enospc", "fsync_stall", "readonly"]
Op = fuselayer.Op
_WAITING = ("latency", "fsync_stall")  # the modes whose hits wait ``latency``
READY_TIMEOUT_S = 15.0
ACK_TIMEOUT_S = 5.0
_EXIT_GRACE_S = 5.0


class StorageParams(BaseModel):
    """A FUSE fault layer over ``path`` for the fault's duration."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(
        description="absolute path of an existing directory to mount the fault layer over; "
        "{run_dir}/… names one inside the run's report dir (e.g. a checkpoint dir)"
    )
    mode: Mode = Field(default="latency", description="latency | hang | eio | enospc | fsync_stall | readonly")
    ops: tuple[Op, ...] | None = Field(default=None, description="operations hit (default: depends on mode)")
    latency: Duration = Field(default=1.0, gt=0, description="delay per hit operation (latency, fsync_stall)")
    probability: float = Field(default=1.0, gt=0, le=1, description="chance that one call is hit")
    files: tuple[str, ...] | None = Field(
        default=None,
        description="globs of the paths hit, relative to the mount (e.g. step-*/rank-2*; one without / also "
        "matches a file name in any directory); default: every path",
    )
    drain: Duration = Field(default=5.0, ge=0, description="how long files held open across heal keep working")

    @field_validator("path")
    @classmethod
    def _absolute_dir(cls, value: str) -> str:
        # "{run_dir}/…" is expanded to the run's absolute report dir when the fault fires (then re-checked).
        return check_host_directory(value, refusing_root="refusing to mount a fault layer over /")

    @field_validator("files", mode="before")
    @classmethod
    def _globs(cls, value: object) -> object:
        found = [value] if isinstance(value, str) else value
        if isinstance(found, list | tuple):
            for pattern in found:
                if not isinstance(pattern, str) or not pattern.strip("/") or any(c in pattern for c in "\0\n"):
                    raise ValueError(f"files must be non-empty glob patterns relative to the mount, got {pattern!r}")
                if ".." in pattern.split("/"):
                    raise ValueError(f"files patterns stay inside the mount: {pattern!r} has '..'")
            if not found:
                raise ValueError("files must name at least one pattern (or be left out for every path)")
        return found

    @model_validator(mode="after")
    def _consistent(self) -> StorageParams:
        if "latency" in self.model_fields_set and self.mode not in _WAITING:
            raise ValueError(f"latency only applies to modes latency and fsync_stall, not {self.mode}")
        if self.ops is not None:
            if not self.ops:
                raise ValueError("ops must name at least one operation (or be left out for the mode's default)")
            if self.mode == "readonly" and not set(self.ops) & (fuselayer.MUTATING | {"open"}):
                raise ValueError(f"readonly only affects open and operations that modify: {sorted(fuselayer.MUTATING)}")
        return self

    def effective_ops(self) -> tuple[str, ...]:
        """The operations hit: ``ops`` or the mode's default."""
        return tuple(self.ops) if self.ops is not None else fuselayer.DEFAULT_OPS[self.mode]


# -- host access -------------------------------------------------------------------------------------------------


class _Files(HostFiles):
    """Small file reads and writes on the fault's host (local directly, remote through the transport)."""

    def mounts(self) -> str:
        text = self.read("/proc/self/mounts")
        if text is None:
            raise InjectionError(f"cannot read /proc/self/mounts on {self.transport.host}")
        return text

    def run(self, argv: list[str]) -> tuple[bool, str]:
        try:
            done = self.transport.run(argv, timeout=30)
        except TransportError as exc:
            return False, str(exc)
        return done.ok, (done.stderr or done.stdout).strip()[:300]


@dataclass(frozen=True)
class StorageState:
    """The journal state of ``storage``: the mount, the daemon's files, the fault, and (once applied) the daemon.

    ``via`` is ``docker-host`` for a directory inside a container (the layer is on this machine, over the bind
    mount's source ``path``; ``container``/``container_path`` name what the job sees). ``drain_s`` reads as 5s
    when missing.
    """

    path: str
    fsname: str
    control: str
    status: str
    log: str
    mode: str
    ops: tuple[str, ...]
    latency_s: float
    probability: float
    drain_s: float
    via: str | None = None
    container: str | None = None
    container_path: str | None = None
    helper_pid: int | None = None
    helper_start_time: int | None = None
    files: tuple[str, ...] = ()

    def to_json(self) -> dict[str, JsonValue]:
        """Each field under its own name (a tuple as a list); a group of optional ones only when its first is set:
        the container's three for ``via``, the daemon's two once applied, ``files`` when there are any."""
        state = {key: list(value) if isinstance(value, tuple) else value for key, value in asdict(self).items()}
        for group in (("via", "container", "container_path"), ("helper_pid", "helper_start_time"), ("files",)):
            if state[group[0]] in (None, []):
                for key in group:
                    del state[key]
        return state

    @classmethod
    def from_json(cls, state: dict[str, JsonValue]) -> StorageState:
        """InjectionError when a path, the mode, ops, latency or probability is missing or malformed."""
        drain = state.get("drain_s")
        return cls(
            state_text(state, "path"),
            state_text(state, "fsname"),
            state_text(state, "control"),
            state_text(state, "status"),
            state_text(state, "log"),
            state_text(state, "mode"),
            state_texts(state, "ops"),
            state_number(state, "latency_s"),
            state_number(state, "probability"),
            float(drain) if isinstance(drain, int | float) and not isinstance(drain, bool) else 5.0,
            optional_text(state, "via"),
            optional_text(state, "container"),
            optional_text(state, "container_path"),
            optional_int(state, "helper_pid"),
            optional_int(state, "helper_start_time"),
            state_texts(state, "files") if "files" in state else (),
        )

    @property
    def on_docker_host(self) -> bool:
        return self.via == _VIA_DOCKER_HOST

    def fault(self, generation: int) -> fuselayer.Fault:
        """The fault recorded at prepare, as the daemon's control file carries it."""
        return _setting(self.mode, self.ops, self.latency_s, self.probability, self.files, generation)

    @property
    def hits(self) -> str:
        """The daemon's hits file (beside its control file)."""
        return hits_path(self.control)


def _tag(op_id: str) -> str:
    """A mount-option-safe, unique name for one op (the same op id may run again later)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", op_id)[:40]
    return f"{safe}-{hashlib.sha1(f'{op_id}:{time.time_ns()}'.encode()).hexdigest()[:8]}"


def _setting(
    mode: str, ops: tuple[str, ...], latency_s: float, probability: float, files: tuple[str, ...], generation: int
) -> fuselayer.Fault:
    """The daemon's control-file setting; ``latency_s`` counts only in the modes that wait."""
    waits = latency_s if mode in _WAITING else 0.0
    return fuselayer.Fault(mode, frozenset(ops), waits, probability, generation, files)


def _fault(params: StorageParams | None, generation: int) -> fuselayer.Fault:
    if params is None:
        return fuselayer.Fault(generation=generation)
    files = tuple(params.files or ())
    return _setting(params.mode, params.effective_ops(), params.latency, params.probability, files, generation)


def _status(files: _Files, state: StorageState) -> dict[str, JsonValue]:
    text = files.read(state.status)
    try:
        found = json.loads(text) if text else {}
    except ValueError:  # caught between write and rename can't happen (atomic), but a truncated disk can
        return {}
    return found if isinstance(found, dict) else {}


def _daemons(host: ProcessHost, applied: Applied) -> list[int]:
    """The op's live daemon(s): the journaled pid, or (crash before that record) a search by op id."""
    return host.helpers(fuselayer.MODULE, applied.op_id, StorageState.from_json(applied.state).helper_pid)


def _write_fault(ctx: InjectionContext, state: StorageState, fault: fuselayer.Fault) -> None:
    path = state.control
    try:
        ctx.transport.put(fault.to_json(), path)
    except (OSError, TransportError) as exc:
        raise InjectionError(f"cannot write the fault control file {path}: {exc}") from exc


def change(ctx: InjectionContext, applied: Applied, params: StorageParams | None) -> None:
    """Switch a live ``storage`` fault to ``params`` (None clears it) and wait until the daemon adopted it.

    ``params.path`` must be the mounted path. Raises InjectionError when the daemon is gone or does not
    acknowledge within :data:`ACK_TIMEOUT_S`.
    """
    state = StorageState.from_json(applied.state)
    if params is not None and params.path != state.path:
        raise InjectionError(f"this fault is mounted on {state.path}, not {params.path}")
    host, files = ProcessHost(ctx.transport), _Files(ctx.transport)
    generation = time.time_ns()
    _write_fault(ctx, state, _fault(params, generation))
    if not wait_until(lambda: _status(files, state).get("generation") == generation, ACK_TIMEOUT_S):
        alive = "alive" if _daemons(host, applied) else "gone"
        raise InjectionError(f"the fault layer on {state.path} did not adopt the change (daemon {alive})")


# -- containers: the layer goes on the docker host, over the bind mount's source ---------------------------------

_VIA_DOCKER_HOST = "docker-host"
_PROPAGATING = ("rslave", "rshared", "slave", "shared")


def _docker(transport: Transport) -> Any | None:
    """The transport as a DockerTransport, or None (imported lazily: the docker SDK only when used)."""
    if type(transport).__name__ != "DockerTransport":
        return None
    return transport


def _on_docker_host(ctx: InjectionContext) -> InjectionContext:
    """The context for this machine, which runs the container's Docker daemon (checked in ``check``)."""
    return InjectionContext(LocalTransport(), history=ctx.history, target=ctx.target, extras=ctx.extras)


def _daemon_is_local(transport: Any) -> bool:
    url = str(getattr(transport, "docker_url", ""))
    return url.startswith("unix://") or url.startswith("/")


def host_path_of(mounts: list[dict[str, Any]], container_path: str) -> tuple[str, dict[str, Any]] | None:
    """The docker host's path for ``container_path`` through the innermost bind mount holding it, with that
    mount; None when no bind mount holds it. (Pure: ``mounts`` is the container's ``Mounts`` list.)"""
    path = os.path.normpath(container_path)
    best: dict[str, Any] | None = None
    for mount in mounts:
        target = os.path.normpath(str(mount.get("Destination", "")))
        inside = path == target or path.startswith(target.rstrip("/") + "/")
        if mount.get("Type") == "bind" and inside and (best is None or len(target) > len(best["Destination"])):
            best = {**mount, "Destination": target}
    if best is None:
        return None
    rest = os.path.relpath(path, best["Destination"])
    return os.path.normpath(os.path.join(str(best["Source"]), rest)), best


# -- the injector ------------------------------------------------------------------------------------------------


class StorageInjector(HeldFault, name="storage", params=StorageParams):
    """FUSE layer over a directory: latency, hang, EIO, ENOSPC, fsync stall or read-only

    A FUSE fault layer over a directory, served by a detached daemon; see the module docstring."""

    def check(self, ctx: InjectionContext, params: BaseModel) -> None:
        """Unsupported unless /dev/fuse is usable, fusermount3 is installed and mfusepy loads libfuse (on the
        docker host, for a container: the layer is mounted there, over the bind mount's source)."""
        if (container := _docker(ctx.transport)) is not None:
            if not _daemon_is_local(container):
                raise Unsupported(
                    f"a storage fault on container host {ctx.transport.host} mounts its layer on the docker host, "
                    f"so the daemon must run on this machine (it is at {container.docker_url})"
                )
            container.container()  # TransportError (missing / stopped container) -> refused up front
            self.check(_on_docker_host(ctx), params)
            return
        if isinstance(ctx.transport, LocalTransport):
            if not os.path.exists("/dev/fuse"):
                raise Unsupported("/dev/fuse does not exist (no FUSE in this kernel or container)")
            if not os.access("/dev/fuse", os.R_OK | os.W_OK):
                raise Unsupported("/dev/fuse is not readable and writable by this user")
            if shutil.which("fusermount3") is None:
                raise Unsupported("fusermount3 is not installed (Debian package fuse3)")
            if problem := fuselayer.binding_problem():
                raise Unsupported(problem)
            return
        files = _Files(ctx.transport)
        probe = (
            "import sys, injectors.storage.fuselayer as f; p = f.binding_problem(); print(p or ''); sys.exit(bool(p))"
        )
        for argv, why in (
            (["test", "-c", "/dev/fuse"], "/dev/fuse does not exist"),
            (["fusermount3", "-V"], "fusermount3 is not installed (Debian package fuse3)"),
            ([host_python(ctx.transport), "-c", probe], "mfusepy/libfuse are not usable by the host's python"),
        ):
            ok, detail = files.run(argv)
            if not ok:
                raise Unsupported(f"{why} on {ctx.transport.host}: {detail}")

    def prepare(self, ctx: InjectionContext, op: FaultOp) -> Applied:
        """Resolve the directory and name the mount; InjectionError without a duration, for a missing
        directory, or when a fault layer is already on (or still draining from) that path."""
        duration = self.duration(op)
        params = op.params_as(StorageParams)
        if (container := _docker(ctx.transport)) is not None:
            return self._prepare_in_container(ctx, op, container, params)
        files, host = _Files(ctx.transport), ProcessHost(ctx.transport)
        if files.local:
            path = os.path.realpath(params.path)
            if not os.path.isdir(path):
                raise InjectionError(f"{params.path} is not a directory")
        else:
            ok, out = files.run(["realpath", "-e", params.path])
            path = out.strip()
            if not ok or not files.run(["test", "-d", path])[0]:
                raise InjectionError(f"{params.path} is not a directory on {ctx.transport.host}")
        if any(m.target == path for m in fuselayer.chaos_mounts(files.mounts())):
            raise InjectionError(f"a chaos-fuse layer is already mounted on {path}")
        if any(f"-m {fuselayer.MODULE} " in a and f"--path {path} " in f"{a} " for a in host.command_lines().values()):
            raise InjectionError(f"a fault layer daemon for {path} is still serving open files; try again later")
        tag = _tag(op.op_id)
        base = str(state_dir() / "fuse")
        ops = params.effective_ops()
        state = StorageState(
            path=path,
            fsname=f"{fuselayer.FSNAME_PREFIX}:{tag}",
            control=f"{base}/{tag}.json",
            status=f"{base}/{tag}.status.json",
            log=f"{base}/{tag}.log",
            mode=params.mode,
            ops=tuple(ops),
            latency_s=params.latency,
            probability=params.probability,
            drain_s=params.drain,
            files=tuple(params.files or ()),
        )
        what = f"{params.mode} ({params.latency:g}s)" if params.mode in _WAITING else params.mode
        chance = "" if params.probability >= 1 else f" with p={params.probability:g}"
        only = f" of {','.join(params.files)}" if params.files else ""
        description = f"FUSE {what} on {','.join(ops)}{only}{chance} over {path} for {duration:g}s"
        return op.record(self.name, ctx.transport.host, state.to_json(), description)

    def _prepare_in_container(
        self, ctx: InjectionContext, op: FaultOp, container: Any, params: StorageParams
    ) -> Applied:
        """A directory inside a container: the layer goes over the bind mount's SOURCE on the docker host;
        the container sees it only when that bind propagates host mounts (rslave/rshared)."""
        found = container.container()
        mapped = host_path_of(list(found.attrs.get("Mounts") or []), params.path)
        name = container.container_name
        if mapped is None:
            raise InjectionError(
                f"{params.path} in container {name} is not on a bind mount, so the docker host cannot stall it "
                "(a storage fault on a container needs the directory bind-mounted from the host)"
            )
        source, mount = mapped
        if str(mount.get("Propagation", "")) not in _PROPAGATING:
            raise InjectionError(
                f"the bind mount {mount.get('Source')}:{mount['Destination']} of container {name} has propagation "
                f"{mount.get('Propagation') or 'rprivate'}, so a layer mounted on the host would not reach the "
                "container: bind it with :rslave (the docker testbed does)"
            )
        local_op = op.model_copy(update={"params": params.model_copy(update={"path": source})})
        applied = self.prepare(_on_docker_host(ctx), local_op)
        state = replace(StorageState.from_json(applied.state), via=_VIA_DOCKER_HOST, container=name)
        applied.state = replace(state, container_path=params.path).to_json()
        return applied.model_copy(
            update={"host": ctx.transport.host, "description": f"{applied.description} (= {name}:{params.path})"}
        )

    @staticmethod
    def revert_on_harness(applied: Applied) -> bool:
        """True for a container's layer: it is mounted on this machine, so its dead-man must run here."""
        return StorageState.from_json(applied.state).on_docker_host

    def apply(self, ctx: InjectionContext, applied: Applied) -> None:
        """Write the fault, start the daemon and wait until its mount serves; adds ``helper_pid`` to state."""
        state = StorageState.from_json(applied.state)
        if state.on_docker_host:
            ctx = _on_docker_host(ctx)
        files, host = _Files(ctx.transport), ProcessHost(ctx.transport)
        control = state.control
        ok, detail = files.run(["mkdir", "-p", os.path.dirname(control)])
        if not ok:
            raise InjectionError(f"cannot create {os.path.dirname(control)}: {detail}")
        path, drain_s = state.path, state.drain_s
        _write_fault(ctx, state, state.fault(time.time_ns()))
        # The daemon's own deadline is a backstop behind heal and the dead-man, hence the grace.
        until_ns = detached.host_deadline_ns(ctx.transport, (applied.duration_s or 0.0) + 30.0 + drain_s)
        argv = detached.helper_argv(
            ctx.transport,
            fuselayer.MODULE,
            applied.op_id,
            path=path,
            fsname=state.fsname,
            control=control,
            status=state.status,
            until_ns=until_ns,
            drain=drain_s,
            log=state.log,
            hits=state.hits,
        )
        helper = deadman.spawn_helper(
            ctx.transport, argv, what="FUSE daemon", env=deadman.python_env() if files.local else None, timeout=30
        )
        applied.state.update(replace(state, helper_pid=helper, helper_start_time=host.start_time(helper)).to_json())
        fsname = state.fsname

        def serving() -> bool:
            return _status(files, state).get("phase") == "serving" and fuselayer.is_mounted(
                fsname, path, files.mounts()
            )

        def failed() -> bool:
            return not host.is_helper(helper, fuselayer.MODULE, applied.op_id)

        if not wait_until(lambda: serving() or failed(), READY_TIMEOUT_S) or not serving():
            log = (files.read(state.log) or "").strip().splitlines()[-5:]
            raise InjectionError(f"the FUSE layer on {path} did not come up: {' | '.join(log) or 'no log'}")

    def heal(self, ctx: InjectionContext, applied: Applied) -> None:
        """Clear the fault, unmount (lazily if busy), wait for the daemon, verify the mount is gone.

        Idempotent and works from ``applied.state`` alone (a fresh process after a crash). Raises
        InjectionError only when the mount is still there at the end.
        """
        state = StorageState.from_json(applied.state)
        if state.on_docker_host:
            ctx = _on_docker_host(ctx)
        files, host = _Files(ctx.transport), ProcessHost(ctx.transport)
        path, fsname, drain_s = state.path, state.fsname, state.drain_s
        daemons = _daemons(host, applied)
        if daemons and _status(files, state).get("phase") == "serving":
            try:  # release every operation held by hang or latency before taking the mount away
                change(ctx, applied, None)
            except InjectionError:
                pass  # a wedged daemon: unmounting below and the kill after the drain still end it
        errors = []
        for lazy in (False, True):
            if not fuselayer.is_mounted(fsname, path, files.mounts()):
                break
            ok, detail = files.run(fuselayer.unmount_argv(path, lazy=lazy))
            if not ok:
                errors.append(f"{' '.join(fuselayer.unmount_argv(path, lazy=lazy))}: {detail}")
        if daemons and not wait_until(lambda: not _daemons(host, applied), drain_s + _EXIT_GRACE_S):
            # Exiting closes /dev/fuse, which aborts the connection; SIGKILL does the same without libfuse's
            # SIGTERM path, which would unmount by path (possibly someone else's newer mount).
            host.signal("SIGKILL", _daemons(host, applied))
            wait_until(lambda: not _daemons(host, applied), _EXIT_GRACE_S)
        if fuselayer.is_mounted(fsname, path, files.mounts()):
            raise InjectionError(f"the FUSE layer {fsname} is still mounted on {path}: {'; '.join(errors)}")
        # Recorded once: the file goes with it (a cleared, draining daemon counts nothing more).
        if record_hits(ctx.history, applied, state.container_path or state.path, state.mode, files.read(state.hits)):
            files.run(["rm", "-f", state.hits])
        if not _daemons(host, applied):  # healed: its control, status, log and hits files have served their purpose
            files.run(["rm", "-f", state.control, state.status, state.log, state.hits])

    def revert_command(self, applied: Applied) -> list[str] | None:
        """Lazy unmount; the daemon notices its mount is gone, clears the fault and stops after the drain."""
        return fuselayer.unmount_argv(StorageState.from_json(applied.state).path, lazy=True)


INJECTORS = (StorageInjector,)
