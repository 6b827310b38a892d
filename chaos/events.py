"""What a job uses to report to mlchaos: append one JSON event per line to the file in ``CHAOS_EVENTS``.

Stdlib only, so any training or serving process can import it (or copy it). When ``CHAOS_EVENTS`` is unset
every call is a no-op, so instrumented code runs unchanged outside a chaos run.

``CHAOS_EVENTS=stdout`` sends each event to standard output instead, as one line starting with
:data:`STDOUT_PREFIX`. That is how jobs on other hosts report: their output reaches the harness over the same
SSH channel that started them, so no shared filesystem is needed.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

ENV_EVENTS = "CHAOS_EVENTS"
STDOUT_SINK = "stdout"
STDOUT_PREFIX = "@@mlchaos-event "


def _rank_from_env() -> int | None:
    value = os.environ.get("RANK")
    return int(value) if value is not None and value.isdigit() else None


def emit(kind: str, *, rank: int | None = None, **data: Any) -> None:
    """Append an event (``kind`` such as ``target.step`` or ``detect.collective_error``) for the harness.

    One ``os.write`` of a whole line to a file opened with O_APPEND, so concurrent ranks never interleave
    partial lines. ``rank`` defaults to the ``RANK`` environment variable torchrun sets.
    """
    path = os.environ.get(ENV_EVENTS)
    if not path:
        return
    record = {
        "ts_ns": time.time_ns(),
        "kind": kind,
        "source": "target",
        "rank": _rank_from_env() if rank is None else rank,
        "data": data,
    }
    line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
    if path == STDOUT_SINK:
        # One write of the whole line: below PIPE_BUF it never interleaves with other ranks' output.
        os.write(1, STDOUT_PREFIX.encode() + line)
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
