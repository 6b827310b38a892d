"""Waiting for state nobody announces (a socket that appears, a daemon that adopts a setting or exits): the one
poll the harness, its testbeds and the injectors wait with."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(ready: Callable[[], bool], timeout: float, *, interval: float = 0.05) -> bool:
    """True as soon as ``ready()``; False once ``timeout`` seconds have passed (``ready`` is asked once more at the
    deadline)."""
    deadline = time.monotonic() + timeout
    while True:
        if ready():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
