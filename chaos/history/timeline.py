"""The run's one timeline: typed events, an append-only JSONL history, and the recorders that feed it.

Everything the runner learns (faults applied and healed, steps, checkpoints, restarts, detections, exits)
becomes an :class:`Event` in one :class:`History`. Checks read only the history, never the target, so every
check can be exercised offline on recorded or hand-made histories.

Every event kind, with its data keys, is declared once in :mod:`chaos.event_kinds`; the kinds this module
declared before it are re-exported here, so ``from chaos.history.timeline import FAULT_APPLIED`` still works.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel, ConfigDict, JsonValue

from chaos.event_kinds import FAULT_APPLIED as FAULT_APPLIED
from chaos.event_kinds import FAULT_CLAIMED as FAULT_CLAIMED
from chaos.event_kinds import FAULT_FAILED as FAULT_FAILED
from chaos.event_kinds import FAULT_HEALED as FAULT_HEALED
from chaos.event_kinds import FAULT_NOT_FIRED as FAULT_NOT_FIRED
from chaos.event_kinds import FAULT_OVERLAP as FAULT_OVERLAP
from chaos.event_kinds import RUNNER_BAD_EVENT
from chaos.event_kinds import RUNNER_GOLDEN as RUNNER_GOLDEN
from chaos.event_kinds import TARGET_AGENT_RESTART as TARGET_AGENT_RESTART
from chaos.event_kinds import TARGET_CHECKPOINT as TARGET_CHECKPOINT
from chaos.event_kinds import TARGET_DIGEST as TARGET_DIGEST
from chaos.event_kinds import TARGET_EXIT as TARGET_EXIT
from chaos.event_kinds import TARGET_PORTS as TARGET_PORTS
from chaos.event_kinds import TARGET_RESTART as TARGET_RESTART
from chaos.event_kinds import TARGET_RESUME as TARGET_RESUME
from chaos.event_kinds import TARGET_START as TARGET_START
from chaos.event_kinds import TARGET_STEP as TARGET_STEP
from chaos.event_kinds import TARGET_WORKER as TARGET_WORKER


class Event(BaseModel):
    """One timestamped fact. ``ts_ns`` is wall-clock nanoseconds on the harness timeline."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ts_ns: int
    kind: str
    source: str = "runner"
    rank: int | None = None
    data: dict[str, JsonValue] = {}

    def matches(self, pattern: str) -> bool:
        """True when ``kind`` matches a glob such as ``detect.*`` or an exact kind."""
        return fnmatch.fnmatchcase(self.kind, pattern)

    def get_int(self, key: str) -> int | None:
        """``data[key]`` as an int, or None when absent or not an integer."""
        value = self.data.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def get_str(self, key: str) -> str | None:
        """``data[key]`` as a str, or None when absent or not a string."""
        value = self.data.get(key)
        return value if isinstance(value, str) else None


def now_ns() -> int:
    """The harness clock: wall time in ns, so events from separate processes share one timeline."""
    return time.time_ns()


class History:
    """Append-only, thread-safe event log; mirrored line by line to a JSONL file when ``path`` is set."""

    def __init__(self, path: Path | None = None) -> None:
        self._events: list[Event] = []
        self._lock = threading.Lock()
        self._path = path
        self._file = open(path, "a", encoding="utf-8") if path is not None else None  # noqa: SIM115

    @classmethod
    def from_events(cls, events: Iterable[Event]) -> History:
        """An in-memory history holding ``events`` sorted by time (for checks and tests)."""
        history = cls()
        history._events = sorted(events, key=lambda e: e.ts_ns)
        return history

    @classmethod
    def load(cls, path: Path) -> History:
        """Read a history.jsonl written by a run."""
        with open(path, encoding="utf-8") as handle:
            events = [Event.model_validate_json(line) for line in handle if line.strip()]
        return cls.from_events(events)

    @property
    def path(self) -> Path | None:
        return self._path

    def append(self, event: Event) -> Event:
        """Add ``event`` (kept in time order) and persist it before returning."""
        with self._lock:
            if self._events and event.ts_ns < self._events[-1].ts_ns:
                # Job events arrive slightly late through file tails; keep the list sorted by time.
                index = len(self._events)
                while index > 0 and self._events[index - 1].ts_ns > event.ts_ns:
                    index -= 1
                self._events.insert(index, event)
            else:
                self._events.append(event)
            if self._file is not None:
                self._file.write(event.model_dump_json() + "\n")
                self._file.flush()
        return event

    def record(
        self,
        kind: str,
        *,
        source: str = "runner",
        rank: int | None = None,
        ts_ns: int | None = None,
        **data: JsonValue,
    ) -> Event:
        """Create and append an event stamped now (or at ``ts_ns``)."""
        return self.append(
            Event(ts_ns=now_ns() if ts_ns is None else ts_ns, kind=kind, source=source, rank=rank, data=data)
        )

    @property
    def events(self) -> tuple[Event, ...]:
        with self._lock:
            return tuple(self._events)

    def of(self, pattern: str, *, after_ns: int | None = None) -> list[Event]:
        """Events whose kind matches ``pattern`` (glob), optionally strictly after ``after_ns``."""
        return [e for e in self.events if e.matches(pattern) and (after_ns is None or e.ts_ns > after_ns)]

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events)

    def __len__(self) -> int:
        with self._lock:
            return len(self._events)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class LineTail:
    """The complete lines a growing file gained since the last :meth:`new_lines`: a half-written last line
    waits for its end; a file that is not there yet has none."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""

    def new_lines(self) -> list[bytes]:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self._offset)
                chunk = handle.read()
        except FileNotFoundError:
            return []
        self._offset += len(chunk)
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        return lines


class EventFileTail(LineTail):
    """Reads new complete JSON lines from the event file a job writes (env ``CHAOS_EVENTS``).

    Lines the job wrote with :func:`chaos.events.emit` are already Event-shaped; anything unparsable is
    turned into a ``runner.bad_event`` event instead of being dropped silently.
    """

    def __init__(self, path: Path, source: str = "target") -> None:
        super().__init__(path)
        self.source = source

    def poll(self) -> list[Event]:
        """Return events appended since the last poll (never a half-written line)."""
        return [parse_event_line(line, self.source) for line in self.new_lines() if line.strip()]


def parse_event_line(line: bytes | str, source: str = "target") -> Event:
    """One JSON event line as written by :func:`chaos.events.emit`; an unparsable line becomes a
    ``runner.bad_event`` event (kept, not dropped silently)."""
    try:
        raw = json.loads(line)
        if not isinstance(raw, dict):
            raise ValueError("an event line must be a JSON object")
        raw.setdefault("source", source)
        return Event.model_validate(raw)
    except ValueError as exc:
        text = line.decode(errors="replace") if isinstance(line, bytes) else line
        return Event(ts_ns=now_ns(), kind=RUNNER_BAD_EVENT, data={"line": text[:500], "error": str(exc)[:300]})


RANK_PREFIX = re.compile(r"^\[rank(?P<rank>\d+)\]:")
"""torch's prefix on a rank's uncaught traceback and C++ log lines once its process group exists."""


class LineMatcher(Protocol):
    """Anything that turns a line of a job's output into an event (or None)."""

    def match(self, line: str, ts_ns: int) -> Event | None: ...


class LogMatcher:
    """Turns log lines into events: ``pattern`` is a regex; named groups become event data, ``fixed`` is added.

    The event's rank is a group named ``rank`` (digits) when the pattern has one, else the ``[rankN]:`` prefix
    torch puts on a rank's traceback and log lines (:data:`RANK_PREFIX`), else none. Used by every target that
    reads a job's output: the scenario's ``matchers:``, torch's failure signatures, torchrun's agent log.
    """

    def __init__(
        self, pattern: str, kind: str, source: str = "log", fixed: Mapping[str, JsonValue] | None = None
    ) -> None:
        self.regex = re.compile(pattern)
        self.kind = kind
        self.source = source
        self.fixed = dict(fixed or {})

    def match(self, line: str, ts_ns: int) -> Event | None:
        found = self.regex.search(line)
        if found is None:
            return None
        groups = {k: v for k, v in found.groupdict().items() if v is not None}
        rank_text = groups.pop("rank", None)
        if rank_text is None:
            prefix = RANK_PREFIX.match(line)
            rank_text = prefix.group("rank") if prefix is not None else None
        data: dict[str, JsonValue] = {"line": line.rstrip()[:500], **self.fixed}
        for key, value in groups.items():
            data[key] = int(value) if value.lstrip("-").isdigit() else value
        rank = int(rank_text) if rank_text is not None and rank_text.isdigit() else None
        return Event(ts_ns=ts_ns, kind=self.kind, source=self.source, rank=rank, data=data)


def write_jsonl(path: Path, events: Iterable[Event]) -> None:
    """Write events to ``path`` atomically (temp file, fsync, rename)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        for event in events:
            handle.write(event.model_dump_json() + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
