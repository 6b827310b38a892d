"""The collective flight recorder: each rank writes where it is in its collectives into a small mmap'd file that
the harness reads from outside, even while the process is stopped or spinning (:mod:`chaos.detect.hang_watch`).

On when the job's environment names a directory in ``CHAOS_FLIGHT_DIR`` (the harness sets it); off otherwise.
The agent turns it on at ``attach`` (:func:`install`), which wraps the collective functions of the
``torch.distributed`` namespace in this process: ``all_reduce``, ``broadcast``, ``barrier``, ``all_gather``,
``all_gather_into_tensor``, ``reduce``, ``reduce_scatter``, ``reduce_scatter_tensor``, ``gather``, ``scatter``,
``all_to_all``, ``all_to_all_single``, ``all_gather_object``, ``broadcast_object_list``, ``gather_object``,
``scatter_object_list``. DDP's gradient all-reduce runs through a comm hook that calls ``dist.all_reduce``
(the agent installs DDP's default hook when the recorder is on and no other hook is). Not covered: a name bound
before ``attach`` (``from torch.distributed import all_reduce``), point-to-point ``send``/``recv``, and
collectives C++ code issues by itself (DDP's initial parameter broadcast, FSDP's internals).

File ``rank-<R>.flight`` (little endian, fixed layout, written with ``struct.pack_into``: no syscall per collective):

- header (:data:`HEADER`): magic, version, rank, world size, pid, the process's kernel start time (field 22 of
  /proc/PID/stat: tells the process from a reused pid), the training step, the index of the next collective in
  that step, the sequence number of the last collective started and of the last one completed, the wall time
  (``time.time_ns``) that last one completed, and the host name;
- a ring of :data:`SLOTS` records (:data:`RECORD`), slot ``seq % SLOTS``: seq (1-based), step, index in the step,
  bytes, start ns, end ns (0 while in flight), op code (:data:`OPS`), a group id (the process group's
  ``group_name`` hashed to 32 bits; 0 for the default group).

A record is written before the header's ``started`` counter moves to it, and its end time before ``completed``
moves, so a reader that finds ``record.seq == started`` has a whole record (it re-reads at its next poll otherwise).

Faults that live here (fired by the agent, :mod:`chaos.injob.hang_faults`): :meth:`Recorder.skip_next` makes the
next collective of a given (step, index) return without running (the rank skipped one collective);
:meth:`Recorder.intercept` runs a fault's action when the collective of a given (step, index) starts, before it
runs (:mod:`chaos.injob.collective_faults`: it raises instead, or aborts the groups under it).
"""

from __future__ import annotations

import functools
import mmap
import os
import socket
import struct
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chaos.kernel.procfs import read_stat

ENV_FLIGHT_DIR = "CHAOS_FLIGHT_DIR"
MAGIC = b"MLCFLT01"
VERSION = 1
SLOTS = 64
# magic, version, rank, world, pid, start_time, step, next_index, started, completed, completed_ns, host (64 bytes)
HEADER = struct.Struct("<8sIiiiqqqQQq64s")
# seq, step, index, nbytes, start_ns, end_ns, op, group
RECORD = struct.Struct("<QqqQqqII")
_LIVE = struct.Struct("<qqQQq")  # the header's changing part: step .. completed_ns
_LIVE_AT = 32  # its offset in HEADER
_SEQ = struct.Struct("<Q")
_END = struct.Struct("<q")
_END_AT = 40  # end_ns's offset in RECORD
SIZE = HEADER.size + SLOTS * RECORD.size
OPS = (
    "all_reduce",
    "broadcast",
    "barrier",
    "all_gather",
    "all_gather_into_tensor",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "gather",
    "scatter",
    "all_to_all",
    "all_to_all_single",
    "all_gather_object",
    "broadcast_object_list",
    "gather_object",
    "scatter_object_list",
)
_OP_CODE = {name: code for code, name in enumerate(OPS, start=1)}


def flight_path(directory: Path, rank: int) -> Path:
    """Where rank ``rank`` records."""
    return directory / f"rank-{rank}.flight"


@dataclass(frozen=True)
class CollectiveRecord:
    """One collective as recorded: ``end_ns`` 0 while it is still in flight."""

    seq: int
    step: int
    index: int
    nbytes: int
    start_ns: int
    end_ns: int
    op: str
    group: int

    @property
    def in_flight(self) -> bool:
        return self.end_ns == 0


@dataclass(frozen=True)
class FlightState:
    """A rank's recorder file as read at one moment (:func:`read_state`)."""

    rank: int
    world: int
    pid: int
    start_time: int
    step: int
    next_index: int
    started: int
    completed: int
    completed_ns: int
    host: str
    current: CollectiveRecord | None  # the last collective started (None before the first, or a torn read)
    recent: tuple[CollectiveRecord, ...]  # up to the last 8 records, oldest first

    @property
    def in_collective(self) -> bool:
        return self.started > self.completed and self.current is not None and self.current.in_flight


def _nbytes(value: object) -> int:
    """Bytes of the tensors in a collective's first argument (a tensor, or a list of tensors / lists)."""
    numel = getattr(value, "numel", None)
    size = getattr(value, "element_size", None)
    if callable(numel) and callable(size):
        return int(numel()) * int(size())
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(item) for item in value)
    return 0


def _group_id(args: tuple[object, ...], kwargs: dict[str, object]) -> int:
    group = kwargs.get("group")
    if group is None:
        group = next((arg for arg in args if type(arg).__name__ == "ProcessGroup"), None)
    name = getattr(group, "group_name", None)
    return 0 if group is None or not isinstance(name, str) else zlib.crc32(name.encode()) or 1


class Recorder:
    """This rank's recorder: owns the mmap'd file, counts collectives, and holds the skip fault."""

    def __init__(self, path: Path, *, rank: int, world: int) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, SIZE)
            self._map = mmap.mmap(fd, SIZE)
        finally:
            os.close(fd)
        self.path = path
        self.rank = rank
        self.world = world
        self.step = 0
        self.index = 0
        self.started = 0
        self.completed = 0
        self.completed_ns = 0
        self._pid = os.getpid()
        self._start_time = _start_time(self._pid)
        self._host = socket.gethostname().encode()[:64]
        self._lock = threading.Lock()  # async completions arrive on gloo's threads
        self._skip: set[tuple[int, int]] = set()
        self.on_skip: Callable[[int, int, str], None] | None = None
        self._intercepts: dict[tuple[int, int], Callable[[str], None]] = {}
        HEADER.pack_into(
            self._map,
            0,
            MAGIC,
            VERSION,
            self.rank,
            self.world,
            self._pid,
            self._start_time,
            self.step,
            self.index,
            self.started,
            self.completed,
            self.completed_ns,
            self._host,
        )

    def _write_header(self) -> None:
        _LIVE.pack_into(self._map, _LIVE_AT, self.step, self.index, self.started, self.completed, self.completed_ns)

    def begin_step(self, step: int) -> None:
        """The loop entered ``step``: collectives from here on count from index 0."""
        with self._lock:
            self.step = step
            self.index = 0
            self._write_header()

    def skip_next(self, step: int, index: int) -> None:
        """Make the collective at (``step``, ``index``) of this rank return without running (a fault)."""
        self._skip.add((step, index))

    def intercept(self, step: int, index: int, action: Callable[[str], None]) -> None:
        """Call ``action(op)`` when the collective at (``step``, ``index``) of this rank starts, before it runs (a
        fault), once: when it raises, the call fails without running (the step's index moves on, nothing is
        recorded as started); when it returns, the collective runs and is recorded as any other."""
        self._intercepts[(step, index)] = action

    def started_one(self, op: str, nbytes: int, group: int) -> tuple[int, bool]:
        """Record a collective starting; returns (its seq, whether the skip fault eats it instead). Raises what
        an intercept's action raised."""
        with self._lock:
            where = (self.step, self.index)
            action = self._intercepts.pop(where, None)
        if action is not None:
            try:
                action(op)
            except BaseException:
                with self._lock:
                    self.index += 1
                    self._write_header()
                raise
        with self._lock:
            if where in self._skip:
                self._skip.discard(where)
                self.index += 1
                self._write_header()
                skipped = True
            else:
                skipped = False
        if skipped:
            if self.on_skip is not None:
                self.on_skip(where[0], where[1], op)
            return 0, True
        with self._lock:
            self.started += 1
            seq = self.started
            record = (seq, self.step, self.index, nbytes, time.time_ns(), 0, _OP_CODE.get(op, 0), group)
            RECORD.pack_into(self._map, HEADER.size + (seq % SLOTS) * RECORD.size, *record)
            self.index += 1
            self._write_header()
        return seq, False

    def completed_one(self, seq: int) -> None:
        """Record collective ``seq`` completing (returned, or its async work finished)."""
        now = time.time_ns()
        with self._lock:
            offset = HEADER.size + (seq % SLOTS) * RECORD.size
            if _SEQ.unpack_from(self._map, offset)[0] != seq:
                return  # overwritten by a later one (SLOTS collectives in flight at once: not in practice)
            _END.pack_into(self._map, offset + _END_AT, now)
            if seq > self.completed:
                self.completed = seq
                self.completed_ns = now
            self._write_header()

    def close(self) -> None:
        with self._lock:
            self._map.flush()


def read_state(path: Path) -> FlightState | None:
    """Read a recorder file from outside its process; None when it is missing, short or not a recorder file."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    return parse_state(data)


def parse_state(data: bytes) -> FlightState | None:
    """A recorder file's bytes as a :class:`FlightState` (None when not one)."""
    if len(data) < SIZE:
        return None
    magic, version, rank, world, pid, start, step, index, started, completed, completed_ns, host = HEADER.unpack_from(
        data, 0
    )
    if magic != MAGIC or version != VERSION:
        return None
    records: list[CollectiveRecord] = []
    for seq in range(max(1, started - 7), started + 1):
        fields = RECORD.unpack_from(data, HEADER.size + (seq % SLOTS) * RECORD.size)
        if fields[0] != seq:
            continue
        op = OPS[fields[6] - 1] if 1 <= fields[6] <= len(OPS) else "unknown"
        records.append(
            CollectiveRecord(fields[0], fields[1], fields[2], fields[3], fields[4], fields[5], op, fields[7])
        )
    current = records[-1] if records and records[-1].seq == started else None
    return FlightState(
        rank=rank,
        world=world,
        pid=pid,
        start_time=start,
        step=step,
        next_index=index,
        started=started,
        completed=completed,
        completed_ns=completed_ns,
        host=host.rstrip(b"\0").decode(errors="replace"),
        current=current,
        recent=tuple(records),
    )


def _start_time(pid: int) -> int:
    stat = read_stat(pid)
    return 0 if stat is None else stat.start_time


# --- wrapping torch.distributed -----------------------------------------------------------------------------

_ACTIVE: Recorder | None = None
_NESTED = threading.local()  # all_gather_object calls all_gather: only the outer call is one collective


def active() -> Recorder | None:
    """This process's recorder, when one is installed."""
    return _ACTIVE


def _wrap(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(real)
    def recorded(*args: Any, **kwargs: Any) -> Any:
        recorder = _ACTIVE
        if recorder is None or getattr(_NESTED, "depth", 0) > 0:
            return real(*args, **kwargs)
        seq, skipped = recorder.started_one(
            name, _nbytes(args[0] if args else kwargs.get("tensor")), _group_id(args, kwargs)
        )
        if skipped:
            return _done_work() if kwargs.get("async_op") else None
        _NESTED.depth = 1
        try:
            result = real(*args, **kwargs)
        finally:
            _NESTED.depth = 0
        if kwargs.get("async_op") and result is not None and hasattr(result, "get_future"):
            result.get_future().then(lambda _f: recorder.completed_one(seq))
        else:
            recorder.completed_one(seq)
        return result

    recorded.__wrapped_by_flight_recorder__ = real  # type: ignore[attr-defined]
    return recorded


def _done_work() -> object:
    """A Work that is already complete (what a skipped async collective hands back)."""
    import torch
    import torch._C._distributed_c10d as c10d

    future: torch.futures.Future[None] = torch.futures.Future()
    future.set_result(None)
    make: Callable[[object], object] = c10d._create_work_from_future  # type: ignore[attr-defined]
    return make(future)


def install(rank: int, world: int, directory: str | None = None) -> Recorder | None:
    """Start recording this process's collectives into ``CHAOS_FLIGHT_DIR`` (or ``directory``); None when
    neither is set. Idempotent: a second call returns the recorder already installed."""
    global _ACTIVE
    if _ACTIVE is not None:
        return _ACTIVE
    where = directory if directory is not None else os.environ.get(ENV_FLIGHT_DIR)
    if not where:
        return None
    import torch.distributed as dist

    _ACTIVE = Recorder(flight_path(Path(where), rank), rank=rank, world=world)
    for name in OPS:
        real = getattr(dist, name, None)
        if real is not None and not hasattr(real, "__wrapped_by_flight_recorder__"):
            setattr(dist, name, _wrap(name, real))
    return _ACTIVE


def uninstall() -> None:
    """Put the real functions back and stop recording (tests)."""
    global _ACTIVE
    import torch.distributed as dist

    for name in OPS:
        real = getattr(getattr(dist, name, None), "__wrapped_by_flight_recorder__", None)
        if real is not None:
            setattr(dist, name, real)
    if _ACTIVE is not None:
        _ACTIVE.close()
    _ACTIVE = None


__all__ = [
    "ENV_FLIGHT_DIR",
    "OPS",
    "CollectiveRecord",
    "FlightState",
    "Recorder",
    "active",
    "flight_path",
    "install",
    "parse_state",
    "read_state",
    "uninstall",
]
