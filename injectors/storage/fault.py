"""The ``storage`` fault's setting, as the FUSE daemon's JSON control file carries it, and the daemon's live copy.

:class:`Fault` is what the injector writes and the daemon (:mod:`injectors.storage.fuselayer`) polls;
:class:`FaultState` is the setting the daemon serves, which wakes every delayed or hung operation when it
changes. Standard library only: the daemon imports this module on the fault's host.
"""

from __future__ import annotations

import json
import random
import threading
import time
from dataclasses import dataclass
from typing import Literal, get_args

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
_READING = frozenset(
    {"getattr", "access", "readdir", "readlink", "statfs", "open", "read", "flush", "fsync", "release"}
)
MUTATING = frozenset(OPS) - _READING  # the operations that modify (open only with write access, so not here)
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


class FaultState:
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
