"""One detection per episode, for the straggler guard's detectors (local work and ring links): the settings they
share, checked alike, and the gate that lets a rank fire once when it turns slow and re-arms it after a full
window of calm steps."""

from __future__ import annotations

import math


def check_settings(window: int, ratio: float, min_excess: float) -> None:
    """ValueError unless ``window`` >= 1, ``ratio`` a finite number >= 1 and ``min_excess`` a finite number >= 0."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    if not ratio >= 1.0 or not math.isfinite(ratio):
        raise ValueError(f"ratio must be a finite number >= 1, got {ratio}")
    if not min_excess >= 0.0 or not math.isfinite(min_excess):
        raise ValueError(f"min_excess must be a finite number >= 0, got {min_excess}")


class Episodes:
    """Per rank: armed at first; :meth:`fires` is True when a slow step finds the rank armed (it is disarmed then),
    and a rank re-arms after ``window`` consecutive steps that were not slow."""

    def __init__(self, world_size: int, window: int) -> None:
        self.window = window
        self._armed = [True] * world_size
        self._calm = [0] * world_size

    def fires(self, rank: int, slow: bool) -> bool:
        if not slow:
            self._calm[rank] += 1
            if self._calm[rank] >= self.window:
                self._armed[rank] = True
            return False
        self._calm[rank] = 0
        armed, self._armed[rank] = self._armed[rank], False
        return armed
