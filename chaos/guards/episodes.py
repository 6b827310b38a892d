"""One detection per episode, for the straggler guard's detectors (local work and ring links): the settings they
share, checked alike, the gate that lets a rank fire once when it turns slow and re-arms it after a full
window of calm steps, the rule that calls a rank slow against its peers (:class:`PeerDetector`) and the
:class:`Episode` each detector reports."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, TypeVar


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


@dataclass(frozen=True)
class Episode:
    """``rank`` turned slow over the ``window`` steps ending at ``step``: its windowed value was
    ``observed_ratio`` times its peers' median ``median_s`` (inf when that median is 0). Each detector's
    subclass says what the value is and adds its evidence."""

    rank: int
    step: int
    window: int
    observed_ratio: float
    median_s: float


E = TypeVar("E", bound=Episode)


class PeerDetector:
    """What both detectors share: ``world_size`` ranks judged over the last ``window`` steps, the settings
    (:func:`check_settings`) and one :class:`Episode` per slow spell of a rank (:class:`Episodes`)."""

    def __init__(self, world_size: int, window: int, ratio: float, min_excess: float) -> None:
        check_settings(window, ratio, min_excess)
        self.world_size, self.window, self.ratio, self.min_excess = world_size, window, ratio, min_excess
        self._episodes = Episodes(world_size, window)

    def _episode(self, kind: type[E], rank: int, step: int, value: float, median: float, **extra: Any) -> E | None:
        """The ``kind`` of episode ``rank`` starts at ``step`` (with ``extra``, its subclass's fields), or None.

        ``value`` is slow when it is at least ``ratio`` times its peers' ``median`` AND exceeds it by at least
        ``min_excess``, and by more than zero too: a rank merely level with its peers is never slow, whatever
        ratio and min_excess are.
        """
        excess = value - median
        slow = value >= self.ratio * median and excess >= self.min_excess and excess > 0
        if not self._episodes.fires(rank, slow):
            return None
        observed = value / median if median > 0 else math.inf
        return kind(rank=rank, step=step, window=self.window, observed_ratio=observed, median_s=median, **extra)
