"""Turning SIGTERM/SIGHUP into an exception in the main thread, so ``finally`` blocks (healing) run."""

from __future__ import annotations

import signal
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def signals_raise(make: Callable[[str], BaseException]) -> Iterator[None]:
    """While inside, SIGTERM and SIGHUP raise ``make(signal name)`` in the main thread; the previous handlers
    come back on exit. Outside the main thread (a test worker, a game day's run thread) nothing is installed
    and callers rely on ``finally`` alone."""

    def handler(signum: int, _frame: types.FrameType | None) -> None:
        raise make(signal.Signals(signum).name)

    try:
        previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)
