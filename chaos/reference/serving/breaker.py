"""A circuit breaker over real requests to one replica (closed / open / half_open).

Contract (settings in :class:`~chaos.spec.serving.BreakerSettings`):

- closed: every request may go; ``failure_threshold`` consecutive failures open it.
- open: no request goes, for ``open_for`` seconds; after that the next :meth:`allow` moves it to half_open.
- half_open: ``half_open_trials`` requests may go (one each per :meth:`allow` that returned True); once that
  many succeeded it closes; any failure opens it again (for another ``open_for``).
- Every caller of :meth:`allow` that got True reports exactly one :meth:`success` or :meth:`failure`.
- ``on_change(state)`` is called on every transition, outside the breaker's lock.
- Disabled, it always allows and never changes state.

Thread-safe; the clock is injectable so the logic is testable without waiting.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Literal

from chaos.spec.serving import BreakerSettings

State = Literal["closed", "open", "half_open"]


@dataclass(eq=False)
class CircuitBreaker:
    settings: BreakerSettings
    _: KW_ONLY
    on_change: Callable[[State], None] | None = None
    clock: Callable[[], float] = time.monotonic
    _lock: threading.Lock = field(init=False, default_factory=threading.Lock)
    _state: State = field(init=False, default="closed")
    _failures: int = field(init=False, default=0)  # consecutive, while closed
    _opened_at: float = field(init=False, default=0.0)
    _trials_started: int = field(init=False, default=0)  # half_open: trials let through
    _trials_ok: int = field(init=False, default=0)

    @property
    def state(self) -> State:
        return self._state

    def peek(self) -> State:
        """The state :meth:`allow` would act on now, without changing anything (open past its time reads
        as half_open): what routing decisions look at."""
        with self._lock:
            if self._state == "open" and self.clock() - self._opened_at >= self.settings.open_for:
                return "half_open"
            return self._state

    def allow(self) -> bool:
        """May a request go to this replica now? True obliges the caller to report its outcome."""
        if not self.settings.enabled:
            return True
        changed: State | None = None
        with self._lock:
            if self._state == "open":
                if self.clock() - self._opened_at < self.settings.open_for:
                    return False
                changed = self._enter("half_open")
            if self._state == "half_open":
                allowed = self._trials_started < self.settings.half_open_trials
                if allowed:
                    self._trials_started += 1
            else:
                allowed = True
        self._notify(changed)
        return allowed

    def success(self) -> None:
        self._report(ok=True)

    def failure(self) -> None:
        self._report(ok=False)

    def _report(self, *, ok: bool) -> None:
        """One outcome of a request :meth:`allow` let through."""
        if not self.settings.enabled:
            return
        changed: State | None = None
        with self._lock:
            if self._state == "closed":
                self._failures = 0 if ok else self._failures + 1
                if self._failures >= self.settings.failure_threshold:
                    changed = self._enter("open")
            elif self._state == "half_open" and not ok:
                changed = self._enter("open")
            elif self._state == "half_open":
                self._trials_ok += 1
                if self._trials_ok >= self.settings.half_open_trials:
                    changed = self._enter("closed")
            # open: a late answer to a request let through before it opened changes nothing.
        self._notify(changed)

    def _enter(self, state: State) -> State:
        self._state = state
        self._failures = 0
        self._trials_started = 0
        self._trials_ok = 0
        if state == "open":
            self._opened_at = self.clock()
        return state

    def _notify(self, state: State | None) -> None:
        if state is not None and self.on_change is not None:
            self.on_change(state)
