"""What a job uses to report to mlchaos: append one JSON event per line to the file in ``CHAOS_EVENTS``.

Stdlib only, so any training or serving process can import it (or copy it). When ``CHAOS_EVENTS`` is unset
every call is a no-op, so instrumented code runs unchanged outside a chaos run.

``CHAOS_EVENTS=stdout`` sends each event to standard output instead, as one line starting with
:data:`STDOUT_PREFIX`. That is how jobs on other hosts report: their output reaches the harness over the same
SSH channel that started them, so no shared filesystem is needed.

An event's ``ts_ns`` is the machine's wall clock even in a process whose libc clock a ``clock`` fault shifts
(``MLCHAOS_CLOCK_DIR`` set): there it comes from the clock_gettime system call, which the shim does not see.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any

ENV_EVENTS = "CHAOS_EVENTS"
STDOUT_SINK = "stdout"
STDOUT_PREFIX = "@@mlchaos-event "
ENV_CLOCK_DIR = "MLCHAOS_CLOCK_DIR"  # set in a job whose wall clock a `clock` fault may shift (injectors.clock)
_SYS_CLOCK_GETTIME = {"x86_64": 228, "aarch64": 113}


def _wall_clock() -> Callable[[], int]:
    """``time.time_ns``, or where the clock shim may be preloaded, the clock_gettime(CLOCK_REALTIME) system call
    made directly (no libc wrapper for the shim to shift); ``time.time_ns`` again when that call fails."""
    number = _SYS_CLOCK_GETTIME.get(os.uname().machine)
    if not os.environ.get(ENV_CLOCK_DIR) or number is None:
        return time.time_ns
    import ctypes

    syscall = ctypes.CDLL(None, use_errno=True).syscall

    def now_ns() -> int:
        spec = (ctypes.c_int64 * 2)()
        if syscall(ctypes.c_long(number), ctypes.c_long(0), spec) != 0:  # 0: CLOCK_REALTIME
            return time.time_ns()
        return int(spec[0]) * 1_000_000_000 + int(spec[1])

    return now_ns


_now_ns = _wall_clock()


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
        "ts_ns": _now_ns(),
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
