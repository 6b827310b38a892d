"""Turning SIGTERM/SIGHUP into an exception in the main thread, so ``finally`` blocks (healing) run, and holding a
signal back for the few steps that must not be cut in two (applying a fault and recording it)."""

from __future__ import annotations

import functools
import signal
import threading
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


@dataclass
class _Held:
    """Main thread only (Python runs signal handlers there): how deep in :func:`signals_deferred` it is, and the
    exception a signal asked for meanwhile."""

    depth: int = 0
    pending: BaseException | None = None


_held = _Held()


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextmanager
def signals_raise(make: Callable[[str], BaseException]) -> Iterator[None]:
    """While inside, SIGTERM and SIGHUP raise ``make(signal name)`` in the main thread, and SIGINT raises
    ``KeyboardInterrupt`` as it does by default, except inside :func:`signals_deferred`, where the exception waits
    for the block's end. The previous handlers come back on exit. Outside the main thread (a test worker, a game
    day's run thread) nothing is installed and callers rely on ``finally`` alone."""

    def handler(signum: int, _frame: types.FrameType | None) -> None:
        name = signal.Signals(signum).name
        exc = KeyboardInterrupt() if signum == signal.SIGINT else make(name)
        if _held.depth:
            _held.pending = _held.pending or exc  # the first signal decides; a second adds nothing
            return
        raise exc

    if not _in_main_thread():
        yield
        return
    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


@contextmanager
def signals_deferred() -> Iterator[None]:
    """Inside, an exception :func:`signals_raise` would raise for a signal waits until the (outermost) block ends,
    and is raised there. For steps whose halves must both happen or neither: a fault applied must also be
    recorded as applied and registered for healing, or the run's history shows a heal of a fault it never
    applied. In another thread it does nothing (signals only ever interrupt the main thread)."""
    if not _in_main_thread():
        yield
        return
    _held.depth += 1
    try:
        yield
    finally:
        _held.depth -= 1
        if not _held.depth and _held.pending is not None:
            exc, _held.pending = _held.pending, None
            raise exc


def signals_deferred_during(fn: Callable[P, R]) -> Callable[P, R]:
    """``fn`` run inside :func:`signals_deferred`."""

    @functools.wraps(fn)
    def deferred(*args: P.args, **kwargs: P.kwargs) -> R:
        with signals_deferred():
            return fn(*args, **kwargs)

    return deferred
