"""Whether the gateway sends traffic to one replica: liveness and correctness probe results, with
hysteresis both ways.

Contract (settings in :class:`~chaos.spec.serving.ProbeSettings`, plus ``failback_hold``):

- A replica starts down (reason ``startup``) and comes up on its first successful liveness probe: a server
  that just started and answers is fresh, and the stack should become ready quickly.
- Up -> down (reason ``health``) after ``failure_threshold`` consecutive failed liveness probes.
- Up -> down (reason ``correctness``) at once on one wrong answer to the correctness probe.
- Down (health) -> up after ``success_threshold`` consecutive liveness successes; down (correctness) -> up
  after ``success_threshold`` consecutive CORRECT answers (liveness successes do not count: a corrupted
  replica answers /healthz happily). Either way the replica must then stay eligible (no failure in
  between) for ``failback_hold`` seconds before it is up again, so a flapping replica does not pull
  traffic back and forth (checked at each probe: the hold ends at the first probe after it has passed).
- ``on_down(reason, failures)`` and ``on_up(successes)`` are called on each transition, outside the lock.

Thread-safe (the liveness and correctness probes run in separate threads); the clock is injectable.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Literal

from chaos.spec.serving import ProbeSettings

Reason = Literal["startup", "health", "correctness"]


@dataclass(eq=False)
class ReplicaHealth:
    probes: ProbeSettings
    _: KW_ONLY
    failback_hold: float = 0.0
    on_down: Callable[[Reason, int], None] | None = None
    on_up: Callable[[int], None] | None = None
    clock: Callable[[], float] = time.monotonic
    _lock: threading.Lock = field(init=False, default_factory=threading.Lock)
    up: bool = field(init=False, default=False)
    reason: Reason = field(init=False, default="startup")  # why it is down (meaningless while up)
    _fails: int = field(init=False, default=0)  # consecutive failed liveness probes
    _oks: int = field(init=False, default=0)  # consecutive liveness successes
    _correct: int = field(init=False, default=0)  # consecutive correct answers while down for correctness
    _eligible_since: float | None = field(init=False, default=None)

    def wants_correctness_probe(self) -> bool:
        """Probe correctness while up, and while down for correctness (that is how it comes back)."""
        return self.up or self.reason == "correctness"

    def health_ok(self) -> None:
        up_with = 0
        with self._lock:
            self._fails = 0
            self._oks += 1
            if not self.up:
                if self.reason == "startup":
                    up_with = self._come_up(self._oks)
                elif self.reason == "health" and self._oks >= self.probes.success_threshold:
                    up_with = self._eligible(self._oks)
        self._notify_up(up_with)

    def health_failed(self) -> None:
        down: int = 0
        with self._lock:
            self._oks = 0
            self._fails += 1
            self._correct = 0  # a comeback needs an unbroken run: liveness and correctness alike
            self._eligible_since = None
            if self.up and self._fails >= self.probes.failure_threshold:
                down = self._go_down("health", self._fails)
        if down and self.on_down is not None:
            self.on_down("health", down)

    def answer_wrong(self) -> bool:
        """One wrong answer: down at once. True when this starts a new episode (it was not already down for
        correctness), i.e. when a detection should be reported."""
        with self._lock:
            self._correct = 0
            if self.reason == "correctness" and not self.up:
                self._eligible_since = None
                return False
            self._go_down("correctness", 1)
        if self.on_down is not None:
            self.on_down("correctness", 1)
        return True

    def answer_correct(self) -> None:
        up_with = 0
        with self._lock:
            if not self.up and self.reason == "correctness":
                self._correct += 1
                if self._correct >= self.probes.success_threshold:
                    up_with = self._eligible(self._correct)
        self._notify_up(up_with)

    def answer_missing(self) -> None:
        """No comparable answer (timeout, refused, 5xx): not wrong, but it breaks a run of correct answers."""
        with self._lock:
            if not self.up and self.reason == "correctness":
                self._correct = 0
                self._eligible_since = None

    # -- internals (called with the lock held)
    def _eligible(self, successes: int) -> int:
        """Up now if eligible for ``failback_hold`` already; returns the success count when it came up."""
        now = self.clock()
        if self._eligible_since is None:
            self._eligible_since = now
        if now - self._eligible_since >= self.failback_hold:
            return self._come_up(successes)
        return 0

    def _come_up(self, successes: int) -> int:
        self.up = True
        self._eligible_since = None
        self._correct = 0
        return max(successes, 1)

    def _go_down(self, reason: Reason, failures: int) -> int:
        self.up = False
        self.reason = reason
        self._oks = 0
        self._correct = 0
        self._eligible_since = None
        return failures

    def _notify_up(self, successes: int) -> None:
        if successes and self.on_up is not None:
            self.on_up(successes)
