"""Operator commands for a run in progress (the game day's keyboard): inject the next fault now, heal every
active fault now, add a note, abort.

Any thread may queue a command; the runner's loop drains the queue on every poll (every 50 ms), executes
the commands in order and records each in the history as ``runner.operator`` (notes as ``runner.note``),
so everything an operator did is part of the run's record and its report.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Literal

Command = Literal["inject_next", "heal_all", "abort", "note"]


@dataclass(frozen=True)
class Order:
    """One queued operator command (``text``: the note, or why the run is aborted)."""

    command: Command
    text: str = ""
    author: str = ""


class RunControl:
    """A thread-safe command queue handed to :func:`chaos.run.orchestrator.execute` through ``RunOptions.control``."""

    def __init__(self) -> None:
        self._orders: deque[Order] = deque()
        self._lock = threading.Lock()

    def _put(self, order: Order) -> None:
        with self._lock:
            self._orders.append(order)

    def inject_next(self, author: str = "") -> None:
        """Fire the next planned fault now instead of at its trigger (no-op when none is pending)."""
        self._put(Order("inject_next", author=author))

    def heal_all(self, author: str = "") -> None:
        """Heal every active fault now; planned faults still fire later."""
        self._put(Order("heal_all", author=author))

    def abort(self, reason: str = "aborted by the operator", author: str = "") -> None:
        """End the run now; everything applied is healed as at any other end."""
        self._put(Order("abort", text=reason, author=author))

    def note(self, text: str, author: str = "") -> None:
        """Write a note into the run's history."""
        self._put(Order("note", text=text, author=author))

    def drain(self) -> list[Order]:
        """Every queued command, oldest first (the runner calls this)."""
        with self._lock:
            orders = list(self._orders)
            self._orders.clear()
        return orders
