"""The reference trainer's checkpoints: one file per rank, a two-phase commit, and verification before loading.

Layout under the checkpoint directory ``D``::

    D/ckpt-000030/rank-0.pt       each rank's own file (DDP state is replicated, so each is that rank's full state)
    D/ckpt-000030/rank-1.pt
    D/ckpt-000030/manifest.json   {"format", "step", "world_size", "files": {"rank-0.pt": {"sha256", "size"}, ...}}
    D/latest                      "ckpt-000030\\n": the pointer, a hint for tools and for the restore

Save (:func:`save`), the two phases:

1. every rank serializes its state, streams it in :data:`CHUNK` byte writes to a temp file in the step's
   directory, fsyncs it, renames it to ``rank-R.pt`` and fsyncs the directory (:func:`write_part`: local only,
   no collective, so a retry wrapper can repeat it);
2. the ranks gather their files' sha256 and size at rank 0, which writes the manifest (temp, fsync, rename,
   fsync dir) and then the ``latest`` pointer the same way (:func:`commit`), then prunes all but the newest
   :data:`KEEP` committed checkpoints. The manifest's rename IS the commit: a checkpoint without a manifest
   never completed, whatever the pointer says.

Restore (:func:`restore`): every rank reads and verifies ITS OWN file against the manifest (size and sha256),
so each rank's storage path is exercised (one slow path makes one rank the restore straggler). The ranks agree
on the newest step that verified on ALL of them: an all-reduce MIN of each rank's newest verified step, then an
all-reduce MIN of "this step verified for me too"; when some rank rejects the agreed step, they go on strictly
below it. The pointer is trusted only as far as what it names verifies; a pointer to a checkpoint that never
completed is reported as rejected and ignored.

Events (``chaos.events.emit``; ``attempt`` is the torchrun restart count):
``target.checkpoint`` {step, path (the step's directory), attempt, duration_s, files: n, manifest} on every rank
once the checkpoint is committed; ``detect.checkpoint_stall`` {detector: "save_watchdog", step, path, elapsed_s,
phase} from a rank whose own write or commit has taken ``stall_after`` seconds (see :func:`save`); ``target.checkpoint_rejected`` {step, path, reason} from each rank that found
a candidate bad while choosing where to resume; ``target.restore`` {step, path, duration_s (this rank's own
reading and hashing, collectives excluded), bytes} and then ``target.resume`` {step, attempt, path, verified,
rejected: [steps]} on every rank.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from chaos.event_kinds import (
    DETECT_CHECKPOINT_STALL,
    TARGET_CHECKPOINT,
    TARGET_CHECKPOINT_REJECTED,
    TARGET_RESTORE,
    TARGET_RESUME,
)
from chaos.events import emit
from chaos.kernel.durable import fsync_path

STORE_FORMAT = 2
KEEP = 3  # committed checkpoints kept: fallback needs somewhere to go when the newest is damaged
POINTER = "latest"
MANIFEST = "manifest.json"
CHUNK = 8192  # bytes per write(): a real save reaches storage in bounded writes, so a tear can land mid-file
_STEP_DIR = re.compile(r"^ckpt-(\d{6,})$")
_PART = re.compile(r"^rank-(\d+)\.pt$")
_NONE = -1


def step_dir(directory: Path, step: int) -> Path:
    """Where the checkpoint of ``step`` lives (a directory)."""
    return directory / f"ckpt-{step:06d}"


def part_name(rank: int) -> str:
    """The file rank ``rank`` writes in each checkpoint."""
    return f"rank-{rank}.pt"


def step_of_dir(path: Path) -> int | None:
    """The step a checkpoint directory's name carries, or None for anything else."""
    match = _STEP_DIR.match(path.name)
    return int(match.group(1)) if match else None


def list_steps(directory: Path) -> list[int]:
    """Steps that have a checkpoint directory (committed or not), oldest first."""
    if not directory.is_dir():
        return []
    found = [step_of_dir(entry) for entry in directory.iterdir() if entry.is_dir()]
    return sorted(step for step in found if step is not None)


def committed_steps(directory: Path) -> list[int]:
    """Steps whose manifest exists (the commit point), oldest first; their files are not verified here."""
    return [step for step in list_steps(directory) if (step_dir(directory, step) / MANIFEST).is_file()]


def _write_atomic(final: Path, data: bytes, *, chunk: int | None = None) -> None:
    """Temp file next to ``final`` (same filesystem), streamed writes, fsync, rename, fsync the directory."""
    tmp = final.with_name(f".{final.name}.tmp.{os.getpid()}")
    with open(tmp, "wb") as handle:
        step = chunk or max(1, len(data))
        for offset in range(0, len(data), step):
            handle.write(data[offset : offset + step])
            handle.flush()  # each chunk reaches the OS as its own write, as a streaming writer's would
        os.fsync(handle.fileno())
    os.replace(tmp, final)
    fsync_path(final.parent)  # the rename itself must reach the disk


@dataclass(frozen=True)
class Part:
    """One rank's file of one checkpoint: its name in the step directory, sha256 and size."""

    name: str
    sha256: str
    size: int


def write_part(directory: Path, step: int, rank: int, state: dict[str, Any]) -> Part:
    """Phase 1 on one rank: write ``state`` as ``ckpt-<step>/rank-<rank>.pt`` durably; no collective."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    data = buffer.getvalue()
    target = step_dir(directory, step)
    target.mkdir(parents=True, exist_ok=True)
    _write_atomic(target / part_name(rank), data, chunk=CHUNK)
    return Part(part_name(rank), hashlib.sha256(data).hexdigest(), len(data))


def commit(directory: Path, step: int, parts: list[Part], world_size: int) -> Path:
    """Phase 2 on rank 0: the manifest (the commit point), then the pointer, then pruning. Returns the manifest."""
    manifest = step_dir(directory, step) / MANIFEST
    body = {
        "format": STORE_FORMAT,
        "step": step,
        "world_size": world_size,
        "files": {p.name: {"sha256": p.sha256, "size": p.size} for p in parts},
    }
    _write_atomic(manifest, (json.dumps(body, sort_keys=True) + "\n").encode())
    _write_atomic(directory / POINTER, (step_dir(directory, step).name + "\n").encode())
    prune(directory)
    return manifest


def prune(directory: Path, keep: int = KEEP) -> None:
    """Remove all but the newest ``keep`` committed checkpoints, and incomplete ones older than the newest kept."""
    committed = committed_steps(directory)
    kept = set(committed[-keep:])
    newest = committed[-1] if committed else None
    for step in list_steps(directory):
        if step in kept or newest is None or step > newest:
            continue  # a newer incomplete one may be another rank's save in progress: never ours to remove
        shutil.rmtree(step_dir(directory, step), ignore_errors=True)


def remove_own_temp_files(directory: Path, rank: int) -> None:
    """Debris of this rank's writer killed mid-save (every worker of the previous attempt is dead by now)."""
    for step in list_steps(directory):
        for entry in step_dir(directory, step).glob(f".{part_name(rank)}.tmp.*"):
            entry.unlink(missing_ok=True)


def save(
    directory: Path,
    step: int,
    state: dict[str, Any],
    *,
    rank: int,
    world_size: int,
    attempt: int,
    collective: Callable[[], AbstractContextManager[None]] = nullcontext,
    stall_after: float | None = None,
) -> tuple[Path, float]:
    """Both phases, called by every rank at the same step: returns the step directory and this rank's seconds.

    Collective (a gather and a barrier, each run inside ``collective()``, e.g. a straggler guard's "waiting"
    clock): when this returns on any rank, the checkpoint is committed, and only then does each rank report
    ``target.checkpoint``. ``duration_s`` is this rank's write plus, on rank 0, the commit.

    ``stall_after``: a watchdog. When this rank's own storage work (its write, and rank 0's commit) has not
    finished ``stall_after`` seconds after it began, a thread reports ``detect.checkpoint_stall`` {detector:
    "save_watchdog", step, path, elapsed_s, phase: "write" | "commit"} once. It is what detects a stall of
    storage every rank writes to (a shared filesystem): then every rank blocks in I/O, none waits in a
    collective, and no process-group timeout fires.
    """
    path = step_dir(directory, step)
    with _Watchdog(stall_after, step=step, rank=rank, path=path) as watchdog:
        started = time.monotonic()
        part = write_part(directory, step, rank, state)
        written = time.monotonic() - started
        watchdog.pause()
        gathered: list[Any] = [None] * world_size
        with collective():
            dist.all_gather_object(gathered, part)
        manifest = path / MANIFEST
        duration = written
        if rank == 0:
            watchdog.resume("commit")
            committing = time.monotonic()
            manifest = commit(directory, step, [p for p in gathered if isinstance(p, Part)], world_size)
            duration += time.monotonic() - committing
            watchdog.pause()
    with collective():
        dist.barrier()  # nobody reports or trains past step K before checkpoint K is committed
    emit(
        TARGET_CHECKPOINT,
        rank=rank,
        step=step,
        path=str(path),
        attempt=attempt,
        duration_s=round(duration, 6),
        files=world_size,
        manifest=str(manifest),
    )
    return path, duration


class _Watchdog:
    """Reports ``detect.checkpoint_stall`` once when the storage work it times runs past ``limit`` seconds.

    Timed: from entering to :meth:`pause` and from :meth:`resume` to the next pause (collectives in between are
    the process-group timeout's business, not this one's). A daemon thread waits on an event, so a main thread
    blocked in a system call (a hung filesystem) does not stop it; ``limit`` None: off.
    """

    def __init__(self, limit: float | None, *, step: int, rank: int, path: Path) -> None:
        self.limit, self.step, self.rank, self.path = limit, step, rank, path
        self.phase = "write"
        self._since: float | None = None
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> _Watchdog:
        if self.limit is not None:
            self.resume("write")
            self._thread = threading.Thread(target=self._watch, name="mlchaos-save-watchdog", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()

    def resume(self, phase: str) -> None:
        with self._lock:
            self.phase, self._since = phase, time.monotonic()

    def pause(self) -> None:
        with self._lock:
            self._since = None

    def _watch(self) -> None:
        assert self.limit is not None
        while not self._done.wait(min(0.1, self.limit / 10)):
            with self._lock:
                since, phase = self._since, self.phase
            if since is not None and time.monotonic() - since >= self.limit:
                emit(
                    DETECT_CHECKPOINT_STALL,
                    rank=self.rank,
                    detector="save_watchdog",
                    step=self.step,
                    path=str(self.path),
                    elapsed_s=round(time.monotonic() - since, 3),
                    phase=phase,
                )
                return


# --- restore ---------------------------------------------------------------------------------------------


class Rejected(Exception):
    """A checkpoint this rank cannot trust; the message is the reason."""


def read_pointer(directory: Path) -> int | None:
    """The step the ``latest`` pointer names, or None (no pointer, or not a checkpoint name)."""
    try:
        text = (directory / POINTER).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    match = _STEP_DIR.match(os.path.basename(text.rstrip("/")))
    return int(match.group(1)) if match else None


def verify_part(directory: Path, step: int, rank: int, world_size: int) -> bytes:
    """This rank's file of checkpoint ``step``, read and checked against the manifest; Rejected says why not."""
    where = step_dir(directory, step)
    try:
        manifest = json.loads((where / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise Rejected("no manifest: the checkpoint never completed") from None
    except (OSError, ValueError) as exc:
        raise Rejected(f"unreadable manifest: {exc}") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != STORE_FORMAT or manifest.get("step") != step:
        raise Rejected("the manifest is not this checkpoint's")
    if manifest.get("world_size") != world_size:
        raise Rejected(f"written by {manifest.get('world_size')} ranks, this run has {world_size}")
    files = manifest.get("files")
    entry = files.get(part_name(rank)) if isinstance(files, dict) else None
    if not isinstance(entry, dict):
        raise Rejected(f"the manifest lists no {part_name(rank)}")
    try:
        data = (where / part_name(rank)).read_bytes()
    except FileNotFoundError:
        raise Rejected(f"{part_name(rank)} is missing") from None
    except OSError as exc:
        raise Rejected(f"{part_name(rank)} unreadable: {exc}") from exc
    if len(data) != entry.get("size"):
        raise Rejected(f"{part_name(rank)} has {len(data)} bytes, the manifest says {entry.get('size')}")
    if hashlib.sha256(data).hexdigest() != entry.get("sha256"):
        raise Rejected(f"{part_name(rank)} sha256 does not match the manifest")
    return data


@dataclass
class _Choice:
    """One rank's view while the ranks agree: what verified, what it rejected, its own reading time."""

    directory: Path
    rank: int
    world_size: int
    verified: dict[int, tuple[int, dict[str, Any]]] = field(default_factory=dict)  # step: (bytes, state)
    rejected: dict[int, str] = field(default_factory=dict)
    read_s: float = 0.0

    def check(self, step: int) -> bool:
        if step in self.verified:
            return True
        if step in self.rejected:
            return False
        started = time.monotonic()
        try:
            data, state = read_part(self.directory, step, self.rank, self.world_size)
        except Rejected as exc:
            self.reject(step, str(exc))
            return False
        finally:
            self.read_s += time.monotonic() - started
        self.verified[step] = (len(data), state)
        return True

    def reject(self, step: int, reason: str) -> None:
        if step not in self.rejected:
            self.rejected[step] = reason
            path = str(step_dir(self.directory, step))
            emit(TARGET_CHECKPOINT_REJECTED, rank=self.rank, step=step, path=path, reason=reason)


def read_part(directory: Path, step: int, rank: int, world_size: int) -> tuple[bytes, dict[str, Any]]:
    """This rank's file of checkpoint ``step``, verified against the manifest and unpickled; Rejected says why
    not. Unpickled with ``weights_only=True``: a checkpoint directory is exactly where a storage fault (or anyone)
    could plant a pickle, and a file the manifest vouches for can still have been written wrong."""
    data = verify_part(directory, step, rank, world_size)
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - whatever the unpickler says, this checkpoint cannot be used
        raise Rejected(f"verified but does not load: {str(exc)[:200]}") from exc
    if not isinstance(state, dict):
        raise Rejected("verified but does not hold a state dict")
    return data, state


def all_min(value: int) -> int:
    """``value``'s minimum over the ranks (an all-reduce MIN on the default group)."""
    tensor = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
    return int(tensor.item())


def restore(
    directory: Path, *, rank: int, world_size: int, attempt: int, reduce_min: Callable[[int], int] = all_min
) -> tuple[int, Path, dict[str, Any]] | None:
    """The newest checkpoint every rank verified, loaded from this rank's own file; None when there is none.

    Collective (``reduce_min``: an all-reduce MIN over the ranks, replaceable for single-process tests). Emits
    ``target.checkpoint_rejected`` per bad candidate, then ``target.restore`` and ``target.resume``.
    """
    choice = _Choice(directory, rank, world_size)
    pointer = read_pointer(directory)
    candidates = sorted(set(list_steps(directory)) | ({pointer} if pointer is not None else set()), reverse=True)
    if pointer is not None and not (step_dir(directory, pointer) / MANIFEST).is_file():
        # A pointer to a checkpoint that never completed is not trusted; the scan below finds the newest good one.
        choice.reject(pointer, f"the {POINTER} pointer names it, but it never completed (no {MANIFEST})")
    bound: int | None = None
    while True:
        mine = next((s for s in candidates if (bound is None or s < bound) and choice.check(s)), _NONE)
        agreed = reduce_min(mine)
        if agreed == _NONE:
            return None
        if reduce_min(1 if choice.check(agreed) else 0) == 1:
            break
        bound = agreed  # some rank rejected it: go strictly below
    size, state = choice.verified[agreed]
    path = step_dir(directory, agreed)
    emit(TARGET_RESTORE, rank=rank, step=agreed, path=str(path), duration_s=round(choice.read_s, 6), bytes=size)
    rejected = [s for s in candidates if s > agreed]  # each was rejected by this rank or by another
    emit(TARGET_RESUME, rank=rank, step=agreed, attempt=attempt, path=str(path), verified=True, rejected=rejected)
    return agreed, path, state
