"""What the ``storage`` fault layer actually did: its path filter and its per-(op, path, errno) hit counts.

Pure pieces shared by the FUSE layer (:mod:`injectors.storage.passthrough`, which filters and counts) and the
injector (:mod:`injectors.storage.injector`, which turns the counts into ``storage.hit`` events at heal), so that
checks judge what the layer really returned, never the job's own account of it.

The hits file is JSON ``{"hits": [Hit, ...]}``, rewritten atomically by the daemon whenever it changed (at most
every poll) and once more when it stops; one entry per (op, path, errno_name) with the number of hits, the
first/last wall-clock ns, the longest delay actually waited, and the first :data:`MAX_TIMES` hit times (enough
to see the gaps between a job's attempts; ``count`` stays exact past the cap).
"""

from __future__ import annotations

import fnmatch
import json
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from chaos.event_kinds import STORAGE_HIT  # stdlib only, like this module

if TYPE_CHECKING:  # the daemon imports this module on the fault's host: only the standard library at run time
    from pydantic import JsonValue

    from chaos.history.timeline import History
    from chaos.plugins.injector import Applied

MAX_TIMES = 256
"""Hit times kept per entry: a job that retries 1000 times a second shows itself by ``count`` past this."""


def matches(rel: str, patterns: tuple[str, ...]) -> bool:
    """Whether the mount-relative path ``rel`` is selected by ``patterns`` (empty: every path is).

    A pattern with a ``/`` is matched (fnmatch) against the whole relative path, so ``step-*/rank-2*`` selects
    ``step-20/rank-2.pt``; one without is matched against the last path component too (``rank-2*`` selects
    that file in any directory). A leading ``/`` or ``./`` is ignored.
    """
    if not patterns:
        return True
    rel = rel.lstrip("/")
    base = rel.rsplit("/", 1)[-1]
    for pattern in patterns:
        pat = pattern.removeprefix("./").lstrip("/")
        if fnmatch.fnmatchcase(rel, pat) or ("/" not in pat and fnmatch.fnmatchcase(base, pat)):
            return True
    return False


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass
class Hit:
    """Every hit of one (op, path, errno_name): ``errno_name`` None for a delay (latency, hang, fsync_stall)."""

    op: str
    path: str
    errno_name: str | None
    count: int = 0
    first_ns: int = 0
    last_ns: int = 0
    latency_s: float = 0.0  # the longest delay one hit actually waited (0 for an error)
    times_ns: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, JsonValue]:
        return {**asdict(self), "latency_s": round(self.latency_s, 6)}  # asdict copies times_ns

    @classmethod
    def from_json(cls, raw: object) -> Hit | None:
        """One entry of a hits file; None when it is malformed (a hits file is evidence, never trusted blindly)."""
        if not isinstance(raw, dict):
            return None
        op, path, code = raw.get("op"), raw.get("path"), raw.get("errno_name")
        count, first, last = _int(raw.get("count")), _int(raw.get("first_ns")), _int(raw.get("last_ns"))
        latency, times = raw.get("latency_s"), raw.get("times_ns", [])
        if not (isinstance(op, str) and isinstance(path, str) and (code is None or isinstance(code, str))):
            return None
        if count is None or first is None or last is None:
            return None
        if not isinstance(latency, int | float) or isinstance(latency, bool) or not isinstance(times, list):
            return None
        kept = [t for item in times if (t := _int(item)) is not None]
        return cls(op, path, code, count, first, last, float(latency), kept)


class HitCounter:
    """Thread-safe hit counts of the daemon; ``dirty`` tells the watcher there is something new to write."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hits: dict[tuple[str, str, str | None], Hit] = {}
        self.dirty = False

    def add(
        self, op: str, path: str, errno_name: str | None, *, at_ns: int | None = None, waited_s: float = 0.0
    ) -> None:
        now = time.time_ns() if at_ns is None else at_ns
        with self._lock:
            hit = self._hits.get((op, path, errno_name))
            if hit is None:
                hit = self._hits[(op, path, errno_name)] = Hit(op, path, errno_name, first_ns=now)
            hit.count += 1
            hit.last_ns = max(hit.last_ns, now)
            hit.latency_s = max(hit.latency_s, waited_s)
            if len(hit.times_ns) < MAX_TIMES:
                hit.times_ns.append(now)
            self.dirty = True

    def snapshot(self) -> bytes:
        """The hits file's content now (clears ``dirty``)."""
        with self._lock:
            self.dirty = False
            body = [hit.to_json() for hit in sorted(self._hits.values(), key=lambda h: (h.first_ns, h.op, h.path))]
        return json.dumps({"hits": body}, sort_keys=True).encode() + b"\n"


def parse_hits(text: str | None) -> list[Hit]:
    """The entries of a hits file's text (none for a missing or unreadable file; malformed entries dropped)."""
    if not text:
        return []
    try:
        raw = json.loads(text)
    except ValueError:
        return []
    entries = raw.get("hits") if isinstance(raw, dict) else None
    if not isinstance(entries, list):
        return []
    return [hit for entry in entries if (hit := Hit.from_json(entry)) is not None]


def hits_path(control: str) -> str:
    """Where the daemon of the fault whose control file is ``control`` writes its hits."""
    return control.removesuffix(".json") + ".hits.json"


def record_hits(history: History | None, applied: Applied, mount: str, mode: str, text: str | None) -> int:
    """One ``storage.hit`` event per entry of the hits file ``text`` of ``applied`` (a layer on ``mount``),
    stamped at its first hit; returns how many. Nothing without a history (a heal by ``mlchaos cleanup``)."""
    if history is None:
        return 0
    hits = parse_hits(text)
    for hit in hits:
        history.record(
            STORAGE_HIT,
            source="injector",
            ts_ns=hit.first_ns,
            op_id=applied.op_id.removesuffix(f"@{applied.host}"),  # the plan's op id, as fault.applied names it
            fault=applied.fault,
            host=applied.host,
            op=hit.op,
            path=hit.path,
            mount=mount,
            mode=mode,
            errno_name=hit.errno_name,
            latency_s=hit.latency_s,
            count=hit.count,
            first_ns=hit.first_ns,
            last_ns=hit.last_ns,
            times_ns=list(hit.times_ns),
        )
    return len(hits)
