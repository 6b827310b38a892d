"""Checkpoint faults: real damage to real checkpoint files, on this machine or a fault's host (its transport).

- ``torn_write``: the next save is cut mid-file. A watcher on the host (:mod:`injectors.checkpoint.tear`) holds
  each write system call of the job's ranks for ``write_delay`` (strace fault injection) and SIGKILLs the writer
  as soon as a file it holds open for writing reaches ``at_bytes`` (default: ``fraction`` of the newest finished
  checkpoint file's size). The kill is ours, the bytes are the writer's own: a crash mid-save. Needs a
  ``duration`` (the window in which a save is awaited). Heal stops the watcher; the torn file stays (a torn
  write cannot be "un-torn": what recovers from it is the job).
- ``corrupt``: flip ``bytes`` bytes (seeded by the op id) in the middle half of the newest finished checkpoint
  file matching ``files``, in place. The original is kept in the journal's state dir; heal puts it back only
  while the file still holds the corrupted bytes (never over what the job wrote since).
- ``drop_shard``: remove the newest file matching ``files`` (one rank's file of a committed checkpoint, e.g.
  ``ckpt-*/rank-1.pt``). Heal puts it back while its place is still empty and its directory still exists.
- ``stale_pointer``: make the ``pointer`` (a text file naming a checkpoint, e.g. ``latest``, or a symlink) name
  a checkpoint that never completed: ``name``, default the current one with its step ``ahead``, created as a
  torn copy of the current one without its ``manifest.json``. Heal puts the pointer back while it is still
  ours (same inode: jobs replace pointers by rename) and removes what it created while it is unchanged.

Each fault records ``fault.checkpoint`` {fault, op, injector, host, mode, path (the damaged file or pointer),
checkpoint (the damaged checkpoint's path as the job reported it, when it did), step (its step, when known),
...} when the damage is done (torn_write: with the time of the kill), so checks tie a resume to the exact
checkpoint the fault damaged. Every mode is refused (InjectionError, before anything changes) when its
directory does not exist: the target keeps no checkpoints there.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator, model_validator

from chaos.cluster.base import Transport, TransportError, host_python
from chaos.cluster.local import LocalTransport
from chaos.event_kinds import FAULT_CHECKPOINT, TARGET_CHECKPOINT
from chaos.history.timeline import Event, now_ns
from chaos.plugins.injector import (
    Applied,
    FaultOp,
    InjectionContext,
    InjectionError,
    InjectorBase,
    optional_int,
    state_text,
)
from chaos.safety.state import state_dir
from chaos.spec.units import Duration, check_host_directory
from injectors import detached
from injectors.base import HeldFault, probe
from injectors.checkpoint import ops, tear
from injectors.hostfiles import HostFiles
from injectors.process.faults import ProcessHost

_OPS_MODULE = "injectors.checkpoint.ops"


class _DirParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(description="the job's checkpoint directory (absolute, or {run_dir}/…)")

    @field_validator("path")
    @classmethod
    def _absolute(cls, value: str) -> str:
        return check_host_directory(value, refusing_root="refusing to treat / as a checkpoint directory")

    @field_validator("files", check_fields=False)
    @classmethod
    def _relative_glob(cls, value: str) -> str:
        return _pattern(value)


def _pattern(value: str) -> str:
    if not value or value.startswith("/") or ".." in value.split("/") or any(ch in value for ch in "\0\n"):
        raise ValueError(f"files must be a glob relative to path (no '..'), got {value!r}")
    return value


class TornWriteParams(_DirParams):
    """Cut the next save of a matching file mid-file by killing its writer."""

    files: str = Field(default="*.pt*", description="glob (name or path under path) of the files a save writes")
    rank: int | None = Field(default=None, ge=0, description="whose writes to cut (default: every rank)")
    fraction: float = Field(default=0.5, gt=0, lt=1, description="cut at this share of the newest finished file")
    at_bytes: int | None = Field(default=None, gt=0, description="cut once the file reaches this many bytes")
    write_delay: Duration = Field(default=0.02, gt=0, le=1, description="hold per write system call meanwhile")


class CorruptParams(_DirParams):
    """Flip bytes of the newest finished checkpoint file matching ``files``."""

    files: str = Field(default="*.pt", description="glob (name or path under path) of checkpoint files")
    bytes: int = Field(default=16, ge=1, le=4096, description="how many bytes to flip")


class DropShardParams(_DirParams):
    """Remove the newest file matching ``files`` (one rank's file of a committed checkpoint)."""

    files: str = Field(default="*.pt", description="glob of the file to remove, e.g. ckpt-*/rank-1.pt")


class StalePointerParams(_DirParams):
    """Point the job's ``latest`` pointer at a checkpoint that never completed."""

    pointer: str = Field(default="latest", description="the pointer's name in path (text file or symlink)")
    name: str | None = Field(default=None, description="what it will name (default: current step + ahead)")
    ahead: int = Field(default=10, ge=1, description="steps ahead of the current one, when name is not given")

    @model_validator(mode="after")
    def _plain_names(self) -> StalePointerParams:
        for value in (self.pointer, self.name):
            if value is not None and (not value or "/" in value or value in (".", "..") or "\0" in value):
                raise ValueError(f"pointer and name are plain names inside path, got {value!r}")
        return self


# -- host access ----------------------------------------------------------------------------------------------


def host_op(transport: Transport, request: dict[str, Any]) -> Any:
    """Run one :mod:`injectors.checkpoint.ops` operation on the transport's host; InjectionError on failure."""
    if isinstance(transport, LocalTransport):
        try:
            return ops.dispatch(request)["result"]
        except (ops.OpError, OSError, ValueError, TypeError) as exc:
            raise InjectionError(str(exc) if isinstance(exc, ops.OpError) else f"{type(exc).__name__}: {exc}") from exc
    try:
        done = transport.run([host_python(transport), "-m", _OPS_MODULE, json.dumps(request)], timeout=60)
    except TransportError as exc:
        raise InjectionError(f"cannot reach {transport.host}: {exc}") from exc
    lines = done.stdout.strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if lines else {}
    except ValueError:
        answer = {}
    if "result" not in answer:
        said = answer.get("error") or (done.stderr or done.stdout).strip()[:300]
        raise InjectionError(f"{request.get('op')} on {transport.host} failed: {said}")
    return answer["result"]


def _resolve_dir(ctx: InjectionContext, path: str) -> str:
    if isinstance(ctx.transport, LocalTransport):
        real = os.path.realpath(path)
        if not os.path.isdir(real):
            raise InjectionError(f"{path} does not exist: the target keeps no checkpoint directory there")
        return real
    try:
        done = ctx.transport.run(["realpath", "-e", path], timeout=30)
    except TransportError as exc:
        raise InjectionError(f"cannot reach {ctx.transport.host}: {exc}") from exc
    real = done.stdout.strip()
    if not done.ok or not real:
        raise InjectionError(f"{path} does not exist on {ctx.transport.host}: the target keeps no checkpoint dir there")
    return real


def _exists(ctx: InjectionContext, path: str) -> bool:
    """``path`` exists on the fault's host (a dangling symlink counts: it is still a pointer)."""
    if isinstance(ctx.transport, LocalTransport):
        return os.path.lexists(path)
    try:
        return (
            ctx.transport.run(["test", "-e", path], timeout=30).ok
            or ctx.transport.run(["test", "-L", path], timeout=30).ok
        )
    except TransportError as exc:
        raise InjectionError(f"cannot reach {ctx.transport.host}: {exc}") from exc


def _newest_backed_up(
    ctx: InjectionContext, op: FaultOp, params: CorruptParams | DropShardParams, **detail: JsonValue
) -> tuple[CheckpointState, JsonValue]:
    """The state of a fault on the newest finished file matching ``params.files`` in its checkpoint directory
    (the backup it will keep named, nothing touched yet), and that file's size; InjectionError from the host
    when there is no such file."""
    directory = _resolve_dir(ctx, params.path)
    found = host_op(ctx.transport, {"op": "newest", "directory": directory, "pattern": params.files})
    path = str(found["path"])
    backup = str(state_dir() / "checkpoint" / f"{_safe(op.op_id)}-{time.time_ns()}-{os.path.basename(path)}")
    return CheckpointState(directory, path, backup=backup, detail=detail), found["size"]


def damaged_checkpoint(ctx: InjectionContext, path: str) -> tuple[str | None, int | None]:
    """The job's own ``target.checkpoint`` report that ``path`` belongs to (the file itself, or the directory it
    is in): that report's path and step; (None, None) when the job never reported it."""
    if ctx.history is None:
        return None, None
    for event in reversed(ctx.history.of(TARGET_CHECKPOINT)):
        reported = event.get_str("path")
        if reported and (path == reported or path.startswith(reported.rstrip("/") + "/")):
            return reported, event.get_int("step")
    return None, None


def _record(ctx: InjectionContext, applied: Applied, ts_ns: int | None = None, **data: JsonValue) -> None:
    if ctx.history is None:
        return
    body: dict[str, JsonValue] = {
        "fault": applied.fault,
        "op": applied.op_id.removesuffix(f"@{applied.host}"),
        "injector": applied.injector,
        "host": applied.host,
        **data,
    }
    ctx.history.append(Event(ts_ns=ts_ns or now_ns(), kind=FAULT_CHECKPOINT, data=body))


@dataclass(frozen=True)
class CheckpointState:
    """Journal state of every checkpoint fault: its directory, the file it acts on, and how to undo it.

    ``detail`` holds what the host operation reported (offsets, sizes, the pointer's old content, the files it
    created); ``expect_sha`` is the content a heal requires before it restores; ``helper_pid`` the watcher.
    """

    directory: str
    path: str
    backup: str = ""
    expect_sha: str = ""
    helper_pid: int | None = None
    status: str = ""
    detail: dict[str, JsonValue] = field(default_factory=dict)

    def to_json(self) -> dict[str, JsonValue]:
        state: dict[str, JsonValue] = {"directory": self.directory, "path": self.path, "detail": self.detail}
        for key in ("backup", "expect_sha", "status"):
            if getattr(self, key):
                state[key] = getattr(self, key)
        if self.helper_pid is not None:
            state["helper_pid"] = self.helper_pid
        return state

    @classmethod
    def from_json(cls, state: dict[str, JsonValue]) -> CheckpointState:
        detail = state.get("detail")
        return cls(
            directory=state_text(state, "directory"),
            path=state_text(state, "path"),
            backup=str(state.get("backup") or ""),
            expect_sha=str(state.get("expect_sha") or ""),
            helper_pid=optional_int(state, "helper_pid"),
            status=str(state.get("status") or ""),
            detail=detail if isinstance(detail, dict) else {},
        )


class _Base(InjectorBase):
    def check(self, ctx: InjectionContext, params: BaseModel) -> None:
        """Nothing to probe up front: the directory exists only once the job saved, so ``prepare`` checks it."""

    def revert_command(self, applied: Applied) -> list[str] | None:
        """None: an undo from the journal (``mlchaos cleanup``) compares contents first, which one argv cannot."""
        return None


class CorruptInjector(_Base, name="checkpoint_corrupt", params=CorruptParams):
    """flip bytes of the newest finished checkpoint file (seeded), in place"""

    def prepare(self, ctx: InjectionContext, op: FaultOp) -> Applied:
        params = op.params_as(CorruptParams)
        state, size = _newest_backed_up(ctx, op, params, bytes=params.bytes)
        text = f"flip {params.bytes} bytes of {state.path} ({size} bytes)"
        return op.record(self.name, ctx.transport.host, state.to_json(), text)

    def apply(self, ctx: InjectionContext, applied: Applied) -> None:
        state = CheckpointState.from_json(applied.state)
        count = state.detail.get("bytes")
        done = host_op(
            ctx.transport,
            {"op": "corrupt", "path": state.path, "count": count, "seed": applied.op_id, "backup": state.backup},
        )
        applied.state.update(
            CheckpointState(state.directory, state.path, state.backup, str(done["sha_after"]), detail=done).to_json()
        )
        checkpoint, step = damaged_checkpoint(ctx, state.path)
        _record(
            ctx,
            applied,
            mode="corrupt",
            path=state.path,
            checkpoint=checkpoint,
            step=step,
            offsets=done["offsets"],
            size=done["size"],
        )

    def heal(self, ctx: InjectionContext, applied: Applied) -> None:
        state = CheckpointState.from_json(applied.state)
        if state.backup and state.expect_sha:
            host_op(
                ctx.transport,
                {"op": "put_back", "path": state.path, "backup": state.backup, "expect_sha": state.expect_sha},
            )


class DropShardInjector(_Base, name="checkpoint_drop_shard", params=DropShardParams):
    """remove one rank's file of a committed checkpoint"""

    def prepare(self, ctx: InjectionContext, op: FaultOp) -> Applied:
        state, size = _newest_backed_up(ctx, op, op.params_as(DropShardParams))
        return op.record(self.name, ctx.transport.host, state.to_json(), f"remove {state.path} ({size} bytes)")

    def apply(self, ctx: InjectionContext, applied: Applied) -> None:
        state = CheckpointState.from_json(applied.state)
        done = host_op(ctx.transport, {"op": "drop", "path": state.path, "backup": state.backup})
        applied.state.update(CheckpointState(state.directory, state.path, state.backup, detail=done).to_json())
        checkpoint, step = damaged_checkpoint(ctx, state.path)
        _record(ctx, applied, mode="drop_shard", path=state.path, checkpoint=checkpoint, step=step, size=done["size"])

    def heal(self, ctx: InjectionContext, applied: Applied) -> None:
        state = CheckpointState.from_json(applied.state)
        if state.backup:
            host_op(ctx.transport, {"op": "put_back", "path": state.path, "backup": state.backup, "expect_sha": None})


class StalePointerInjector(_Base, name="checkpoint_stale_pointer", params=StalePointerParams):
    """point the latest pointer at a checkpoint that never completed"""

    def prepare(self, ctx: InjectionContext, op: FaultOp) -> Applied:
        params = op.params_as(StalePointerParams)
        directory = _resolve_dir(ctx, params.path)
        pointer = os.path.join(directory, params.pointer)
        if not _exists(ctx, pointer):
            raise InjectionError(f"{pointer} does not exist: this job keeps no {params.pointer!r} pointer there")
        detail: dict[str, JsonValue] = {"pointer": params.pointer, "name": params.name, "ahead": params.ahead}
        state = CheckpointState(directory, pointer, detail=detail)
        return op.record(self.name, ctx.transport.host, state.to_json(), f"point {pointer} at an incomplete checkpoint")

    def apply(self, ctx: InjectionContext, applied: Applied) -> None:
        state = CheckpointState.from_json(applied.state)
        asked = state.detail
        done = host_op(
            ctx.transport,
            {
                "op": "stale_pointer",
                "directory": state.directory,
                "pointer": asked.get("pointer"),
                "name": asked.get("name"),
                "ahead": asked.get("ahead"),
            },
        )
        applied.state.update(CheckpointState(state.directory, state.path, detail={**asked, "done": done}).to_json())
        stale = os.path.join(state.directory, str(done["stale"]))
        current = os.path.join(state.directory, str(done["current"]))
        _, current_step = damaged_checkpoint(ctx, current)
        _record(
            ctx,
            applied,
            mode="stale_pointer",
            path=state.path,
            checkpoint=stale,
            step=None,
            stale=stale,
            current=current,
            current_step=current_step,
        )

    def heal(self, ctx: InjectionContext, applied: Applied) -> None:
        state = CheckpointState.from_json(applied.state)
        done = state.detail.get("done")
        if not isinstance(done, dict):
            return  # never applied
        host_op(
            ctx.transport,
            {
                "op": "restore_pointer",
                "directory": state.directory,
                "pointer": state.detail.get("pointer"),
                "kind": done.get("kind"),
                "current": done.get("current"),
                "inode": done.get("inode"),
                "created": done.get("created") or [],
            },
        )
        state.detail.pop("done", None)  # healed: a second heal does nothing


class TornWriteInjector(HeldFault, _Base, name="checkpoint_torn_write", params=TornWriteParams):
    """kill the checkpoint writer mid-file (strace-slowed writes, SIGKILL at N bytes)"""

    def check(self, ctx: InjectionContext, params: BaseModel) -> None:
        """Unsupported without strace on the fault's host (the write hold) or without /proc."""
        probe(
            ctx.transport, ["strace", "-V"], "cannot reach", "strace is not installed on {host} (Debian package strace)"
        )

    def prepare(self, ctx: InjectionContext, op: FaultOp) -> Applied:
        duration = self.duration(op)
        params = op.params_as(TornWriteParams)
        directory = _resolve_dir(ctx, params.path)
        resolver = ctx.rank_resolver()
        ranks = [params.rank] if params.rank is not None else resolver.ranks()
        pids = sorted({pid for rank in ranks for pid in resolver.pids_for_rank(rank)})
        if not pids:
            raise InjectionError(f"no process found for rank(s) {ranks}: nobody to cut mid-save")
        at_bytes = params.at_bytes
        if at_bytes is None:
            found = host_op(ctx.transport, {"op": "matching", "directory": directory, "pattern": params.files})
            if not found:
                raise InjectionError(
                    f"no finished file matching {params.files!r} in {directory} to size the cut by: give at_bytes"
                )
            at_bytes = max(1, int(int(found[0]["size"]) * params.fraction))
        status = str(state_dir() / "checkpoint" / f"{_safe(op.op_id)}-{time.time_ns()}.tear.json")
        detail: dict[str, JsonValue] = {
            "files": params.files,
            "pids": list(pids),
            "at_bytes": at_bytes,
            "delay_us": int(params.write_delay * 1e6),
        }
        state = CheckpointState(directory, directory, status=status, detail=detail)
        who = f"rank {params.rank}" if params.rank is not None else f"ranks {ranks}"
        text = f"cut the next save of {params.files} by {who} at {at_bytes} bytes within {duration:g}s"
        return op.record(self.name, ctx.transport.host, state.to_json(), text)

    def apply(self, ctx: InjectionContext, applied: Applied) -> None:
        state = CheckpointState.from_json(applied.state)
        d = state.detail
        files = HostFiles(ctx.transport)
        if files.local:
            os.makedirs(os.path.dirname(state.status), exist_ok=True)
        else:
            ctx.transport.run(["mkdir", "-p", os.path.dirname(state.status)], timeout=30)
        until = detached.host_deadline_ns(ctx.transport, (applied.duration_s or 0.0) + 5.0)
        argv = detached.helper_argv(
            ctx.transport,
            tear.MODULE,
            applied.op_id,
            dir=state.directory,
            files=d["files"],
            pids=",".join(str(p) for p in _ints(d.get("pids"))),
            at_bytes=d["at_bytes"],
            delay_us=d["delay_us"],
            until_ns=until,
            status=state.status,
        )
        pid = detached.launch(
            ctx.transport, argv, what="torn-write watcher", log=None if not files.local else "tear.log"
        )
        applied.state["helper_pid"] = pid
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            phase = _tear_status(files, state.status).get("phase")
            if phase in ("armed", "done"):
                return
            if phase == "failed" or not ProcessHost(ctx.transport).is_helper(pid, tear.MODULE, applied.op_id):
                break
            time.sleep(0.05)
        raise InjectionError(f"the torn-write watcher did not arm: {_tear_status(files, state.status)}")

    def heal(self, ctx: InjectionContext, applied: Applied) -> None:
        """Stop the watcher (strace detaches), then record what it tore: the torn file itself stays."""
        state = CheckpointState.from_json(applied.state)
        host = ProcessHost(ctx.transport)
        host.stop_helpers(tear.MODULE, applied.op_id, applied.state.get("helper_pid"))
        files = HostFiles(ctx.transport)
        status = _tear_status(files, state.status)
        torn = status.get("torn")
        if isinstance(torn, dict) and not applied.state.get("recorded"):
            path = str(torn.get("path"))
            checkpoint, step = damaged_checkpoint(ctx, path)
            ts = torn.get("ts_ns")
            # the host's clock, moved onto the harness timeline (host = harness - offset)
            ts_ns = ts + int(ctx.transport.clock_offset() * 1e9) if isinstance(ts, int) else None
            _record(
                ctx,
                applied,
                ts_ns=ts_ns,
                mode="torn_write",
                path=path,
                checkpoint=checkpoint or os.path.dirname(path),
                step=step,
                size=torn.get("size"),
                at_bytes=torn.get("at_bytes"),
                pid=torn.get("pid"),
            )
            applied.state["recorded"] = True
        elif not applied.state.get("recorded") and status.get("phase") == "done":
            _record(ctx, applied, mode="torn_write", path=state.directory, torn=False)
            applied.state["recorded"] = True
        if files.local:
            for leftover in (state.status,):
                if os.path.exists(leftover) and status.get("phase") == "done":
                    os.unlink(leftover)


def _safe(op_id: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in op_id)[:60]


def _ints(value: JsonValue) -> list[int]:
    return [v for v in value if isinstance(v, int)] if isinstance(value, list) else []


def _tear_status(files: HostFiles, path: str) -> dict[str, Any]:
    text = files.read(path)
    try:
        found = json.loads(text) if text else {}
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


INJECTORS = (TornWriteInjector, CorruptInjector, DropShardInjector, StalePointerInjector)
