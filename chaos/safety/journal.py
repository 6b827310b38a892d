"""Crash-safe record of applied faults, so that a killed harness still leaves something that can heal.

One append-only JSONL file per run at ``<state_dir>/journal/<run_id>.jsonl``. Every record is ONE ``os.write``
of one complete line followed by ``os.fsync`` before the call returns: once ``intent`` returns, the fault is
on disk even if the machine loses power the next instant. The lifecycle of one op is::

    intent (before the world changes) -> [deadman ...] -> applied | failed -> healed(by=...)

A ``deadman`` record arms a dead-man process; a later one with the SAME pid re-arms it (the harness pushing
the deadline of a duration-less fault while it is alive): the dead-man reads its latest deadline here.

An op is *unhealed* from its ``intent`` until its ``healed`` record, whatever happened in between: a
``failed`` apply may have half-changed the world (one of two pids stopped), so it still needs a heal.

A run that is still alive holds a shared ``flock`` on its journal; :func:`chaos.safety.cleanup.heal_leftovers` takes the lock
exclusively and skips journals it cannot lock, so cleanup never heals the faults of a run in progress.
The kernel drops the lock when the owner dies, however it dies.
"""

from __future__ import annotations

import fcntl
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, JsonValue, ValidationError

from chaos.cluster.base import Closing
from chaos.plugins.injector import Applied
from chaos.safety.state import state_dir

RecordKind = Literal["intent", "applied", "deadman", "healed", "failed"]
HEALED_BY_HARNESS, HEALED_BY_DEADMAN, HEALED_BY_CLEANUP = "harness", "deadman", "cleanup"
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def journal_dir(root: Path | None = None) -> Path:
    """The folder holding live journals (``done/`` below it holds fully healed ones)."""
    return (root if root is not None else state_dir()) / "journal"


class Record(BaseModel):
    """One journal line. Only the fields of its ``kind`` are set."""

    model_config = ConfigDict(extra="ignore")

    kind: RecordKind
    op_id: str
    t_ns: int
    applied: Applied | None = None  # intent
    state: dict[str, JsonValue] | None = None  # applied: state learned while applying (e.g. a helper pid)
    pid: int | None = None  # deadman
    fires_at_ns: int | None = None  # deadman
    by: str | None = None  # healed
    error: str | None = None  # failed


class _OpView:
    """Everything the journal says about one op, folded from its records in file order."""

    def __init__(self, applied: Applied) -> None:
        self.applied = applied
        self.healed_by: str | None = None
        self.deadman_pid: int | None = None
        self.deadman_fires_at_ns: dict[int, int] = {}  # dead-man pid -> its latest deadline
        self.errors: list[str] = []


class Journal(Closing):
    """The journal file of one run. Appends are durable when they return; reads fold the whole file.

    ``owner=True`` (the run itself) holds a shared lock for the object's lifetime, marking the run live;
    helpers that only append or read (the dead-man, cleanup) pass ``owner=False``.
    """

    def __init__(self, path: Path | str, *, owner: bool = True) -> None:
        self._lock_fd: int | None = None
        self.path = Path(path).absolute()
        self.unreadable: list[str] = []
        if owner:
            self._lock_fd = self._create_locked()

    @classmethod
    def for_run(cls, run_id: str, *, root: Path | None = None) -> Journal:
        """The (owned) journal of ``run_id`` under ``root`` (default :func:`state_dir`)."""
        if not _RUN_ID.match(run_id):
            raise ValueError(f"run id {run_id!r} is not a safe file name (letters, digits, _ . -)")
        return cls(journal_dir(root) / f"{run_id}.jsonl")

    @property
    def run_id(self) -> str:
        return self.path.stem

    def close(self) -> None:
        """Release the liveness lock (the records stay); idempotent."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def archive(self) -> bool:
        """Close, and move the journal to ``done/`` when nothing in it is left to heal; True if moved.

        A run calls this at its end so the state directory holds only journals that still matter.
        """
        self.close()
        if not self.path.exists() or self.unhealed() or self.unreadable:
            return False
        done = self.path.parent / "done"
        done.mkdir(exist_ok=True)
        os.replace(self.path, done / self.path.name)
        self.path = done / self.path.name
        return True

    def __del__(self) -> None:
        self.close()

    # -- writing ----------------------------------------------------------------------------------------
    def intent(self, applied: Applied) -> None:
        """Record ``applied`` BEFORE the world changes: from here on cleanup knows how to undo it."""
        self._append(Record(kind="intent", op_id=applied.op_id, t_ns=time.time_ns(), applied=applied))

    def applied(self, op_id: str, state: Mapping[str, JsonValue] | None = None) -> None:
        """The fault is in place; ``state`` (optional) replaces the intent's state for later heals."""
        record = Record(kind="applied", op_id=op_id, t_ns=time.time_ns(), state=dict(state) if state else None)
        self._append(record)

    def deadman(self, op_id: str, pid: int, fires_at_ns: int) -> None:
        """A dead-man process ``pid`` will revert ``op_id`` at ``fires_at_ns`` (wall clock) unless disarmed."""
        self._append(Record(kind="deadman", op_id=op_id, t_ns=time.time_ns(), pid=pid, fires_at_ns=fires_at_ns))

    def healed(self, op_id: str, by: str) -> None:
        """``op_id`` is undone; ``by`` is who did it: "harness", "deadman", "cleanup" (or "irreversible")."""
        self._append(Record(kind="healed", op_id=op_id, t_ns=time.time_ns(), by=by))

    def failed(self, op_id: str, error: str) -> None:
        """Applying or healing ``op_id`` failed. The op stays unhealed until a ``healed`` record follows."""
        self._append(Record(kind="failed", op_id=op_id, t_ns=time.time_ns(), error=error))

    def _create_locked(self) -> int:
        """The journal's file, held with the owner's shared lock from the moment its name exists: it is made
        under a temporary name, locked, then linked into place. (Created, then locked, another run's start-up
        cleanup could take it between the two for a dead run's, and move it away: the new run then died at
        start, or wrote to a journal nobody held.)"""
        if self.path.exists():
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            fcntl.flock(fd, fcntl.LOCK_SH)
            return fd
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{id(self):x}.new")
        fd = os.open(tmp, os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            os.fsync(fd)
            os.link(tmp, self.path)
        except BaseException:
            os.close(fd)
            raise
        finally:
            tmp.unlink(missing_ok=True)
        dir_fd = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)  # the new directory entry must be durable too
        finally:
            os.close(dir_fd)
        return fd

    def _create(self) -> None:
        if self.path.exists():
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        # The new directory entry must be durable too, or the file can vanish with its fsync'd contents.
        dir_fd = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def _append(self, record: Record) -> None:
        self._create()
        line = (record.model_dump_json(exclude_none=True) + "\n").encode()
        # os.write on an O_APPEND fd is unbuffered (nothing to flush) and lands the whole line at the end in
        # one syscall, so concurrent writers (harness and dead-man) never interleave inside a line.
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                line = b"\n" + line  # a crash tore the last line: start ours on a fresh one
            written = os.write(fd, line)
            if written != len(line):
                raise OSError(f"short write to journal {self.path} ({written}/{len(line)} bytes)")
            os.fsync(fd)
        finally:
            os.close(fd)

    # -- reading ----------------------------------------------------------------------------------------
    def records(self) -> list[Record]:
        """Every readable record in file order (see :attr:`unreadable` for lines that were not)."""
        self.unreadable = []
        try:
            text = self.path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return []
        found = []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                found.append(Record.model_validate_json(line))
            except ValidationError:
                # Only a torn tail can be unreadable (every record is one write); it is reported, not hidden.
                self.unreadable.append(f"{self.path.name}:{number}: {line[:120]}")
        return found

    def _ops(self) -> dict[str, _OpView]:
        ops: dict[str, _OpView] = {}
        for record in self.records():
            if record.kind == "intent" and record.applied is not None:
                ops[record.op_id] = _OpView(record.applied)
                continue
            view = ops.get(record.op_id)
            if view is None:
                continue  # a record without intent: nothing was (or will be) changed for it
            if record.kind == "applied" and record.state is not None:
                view.applied = view.applied.model_copy(update={"state": record.state})
            elif record.kind == "deadman":
                view.deadman_pid = record.pid
                if record.pid is not None and record.fires_at_ns is not None:
                    view.deadman_fires_at_ns[record.pid] = record.fires_at_ns
            elif record.kind == "healed":
                view.healed_by = record.by or "?"
            elif record.kind == "failed" and record.error:
                view.errors.append(record.error)
        return ops

    def unhealed(self) -> list[Applied]:
        """Reversible ops with an intent and no ``healed`` record, newest first (the order to undo them)."""
        pending = [v.applied for v in self._ops().values() if v.healed_by is None and v.applied.reversible]
        return pending[::-1]

    def healed_by(self, op_id: str) -> str | None:
        """Who healed ``op_id`` ("harness", "deadman", "cleanup" …), or None while it is not healed."""
        view = self._ops().get(op_id)
        return view.healed_by if view is not None else None

    def deadman_pid(self, op_id: str) -> int | None:
        """The pid of the dead-man last armed for ``op_id``, if any."""
        view = self._ops().get(op_id)
        return view.deadman_pid if view is not None else None

    def deadman_status(self, op_id: str, pid: int) -> tuple[str | None, int | None]:
        """(who healed ``op_id`` or None, the latest deadline journaled for its dead-man ``pid`` or None): what a
        sleeping dead-man reads on every poll, from one pass over the file."""
        view = self._ops().get(op_id)
        if view is None:
            return None, None
        return view.healed_by, view.deadman_fires_at_ns.get(pid)

    def deadman_pids(self) -> dict[str, int]:
        """The last dead-man pid of every op that had one."""
        return {op_id: v.deadman_pid for op_id, v in self._ops().items() if v.deadman_pid is not None}

    def try_lock_exclusive(self) -> bool:
        """Take the journal over (cleanup): False while its run is alive and holds its shared lock."""
        if self._lock_fd is None:
            try:
                self._lock_fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                return False
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True


def all_journals(root: Path | None = None) -> list[Path]:
    """Journals that may still hold unhealed faults under ``root`` (default :func:`state_dir`), oldest first."""
    folder = journal_dir(root)
    if not folder.is_dir():
        return []
    return sorted(folder.glob("*.jsonl"), key=lambda p: (p.stat().st_mtime_ns, p.name))
