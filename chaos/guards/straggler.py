"""Straggler guard: the rank whose LOCAL work per step is far above its peers'. Emits ``detect.straggler``
naming the slow rank.

What is measured: each rank splits its wall time between two consecutive exchanges (one per step) into

- ``compute_s``: time NOT spent inside a collective: wall clock since the previous exchange returned, less
  the time the caller reported as blocked through :meth:`StragglerGuard.collective` (DDP's ``backward()``
  with its gradient all-reduce, a checkpoint barrier, a guard's all-reduce); and
- ``wait_s``: the time blocked in those collectives, plus the previous exchange's own wait.

Once per step, right after the gradient sync, every rank calls :meth:`StragglerGuard.exchange`: one tiny
``gather`` of ``[compute_s, wait_s]`` (two float64 per rank) to the reporter rank, the only one that judges.
The decision uses ``compute_s``; ``wait_s`` is evidence in the event (the straggler's is the smallest).

The decision (:class:`StragglerDetector`, pure and deterministic): a sliding window of the last ``window`` (K)
steps of every rank's ``compute_s``. Once the window is full, a rank is a straggler when its windowed sum is at
least ``ratio`` (R) times the median of the OTHER ranks' sums AND exceeds that median by at least
``min_excess`` (S) seconds (and by more than zero, so ranks that are level never fire whatever R and S). One
detection per episode: after firing, a rank re-arms only once it has been under the threshold for K
consecutive steps.

Limits: in a DDP job ``backward()`` counts as blocked, so a rank slow ONLY inside ``backward()`` is not singled
out (slowness in data loading, forward, the optimizer step or between steps is). A single long hiccup counts:
with K=5, steps of 50 ms and R=2, S=0.2 s, one 0.5 s stall on a rank fires. Local work that is legitimately
uneven (rank 0 writing a checkpoint) counts too; keep checkpoints out of short windows, or raise S.

With ``links=True`` (three ranks or more) the exchange also carries each rank's round trip to its ring
successor (:mod:`chaos.guards.ring_links`), and a rank whose two ring links are both slow is named too, with
``cause: "link"``: a delayed path into or out of one host slows every rank's collectives alike, so local time
cannot show it, but the ring links adjacent to that host can.

Why local time and not step time, why a gather, and why the median of the others: docs/design/straggler.md.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist

from chaos import events
from chaos.event_kinds import DETECT_STRAGGLER
from chaos.guards.episodes import Episode, PeerDetector
from chaos.guards.ring_links import (
    DEFAULT_LINK_MIN_EXCESS_S,
    DEFAULT_LINK_RATIO,
    LinkDetection,
    LinkDetector,
    ring_rtt,
)

DEFAULT_WINDOW = 5
DEFAULT_RATIO = 2.0
DEFAULT_MIN_EXCESS_S = 0.2


@dataclass(frozen=True)
class Detection(Episode):
    """One straggler episode: ``rank`` was slow over the ``window`` steps ending at ``step``; ``observed_ratio``:
    its windowed compute over ``median_s``, the median of the other ranks' windowed compute."""

    compute_s: tuple[float, ...]  # per-rank windowed sums of compute_s
    wait_s: tuple[float, ...]  # per-rank windowed sums of wait_s

    def __str__(self) -> str:
        return (
            f"rank {self.rank} straggles at step {self.step}: {self.compute_s[self.rank]:.3f}s of local work over "
            f"{self.window} steps, {self.observed_ratio:.3g}x its peers' median {self.median_s:.3f}s"
        )


def _rounded(values: Sequence[float]) -> tuple[float, ...]:
    return tuple(round(v, 6) for v in values)


class StragglerDetector(PeerDetector):
    """Windowed peer comparison of per-rank local step time (see the module docstring). Pure: no clocks, no
    collectives; feed it one row per step in step order."""

    def __init__(
        self,
        world_size: int,
        *,
        window: int = DEFAULT_WINDOW,
        ratio: float = DEFAULT_RATIO,
        min_excess: float = DEFAULT_MIN_EXCESS_S,
    ) -> None:
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        super().__init__(world_size, window, ratio, min_excess)
        self._compute: deque[tuple[float, ...]] = deque(maxlen=window)
        self._wait: deque[tuple[float, ...]] = deque(maxlen=window)

    def _row(self, name: str, values: Sequence[float]) -> tuple[float, ...]:
        if len(values) != self.world_size:
            raise ValueError(f"{name}: expected {self.world_size} values, got {len(values)}")
        row = tuple(float(v) for v in values)
        if not all(math.isfinite(v) and v >= 0.0 for v in row):
            raise ValueError(f"{name}: values must be finite and >= 0, got {row}")
        return row

    def observe(self, step: int, compute_per_rank: Sequence[float], wait_per_rank: Sequence[float]) -> list[Detection]:
        """Add one step's per-rank ``compute_s`` and ``wait_s``; return the ranks that start straggling now.

        Usually zero or one detection; several when several ranks cross the threshold in the same step.
        """
        self._compute.append(self._row("compute_per_rank", compute_per_rank))
        self._wait.append(self._row("wait_per_rank", wait_per_rank))
        if len(self._compute) < self.window or self.world_size < 2:
            return []
        sums = [math.fsum(row[r] for row in self._compute) for r in range(self.world_size)]
        waits = [math.fsum(row[r] for row in self._wait) for r in range(self.world_size)]
        evidence = {"compute_s": _rounded(sums), "wait_s": _rounded(waits)}
        found: list[Detection] = []
        for rank in range(self.world_size):
            median = statistics.median(s for r, s in enumerate(sums) if r != rank)
            detection = self._episode(Detection, rank, step, sums[rank], median, **evidence)
            if detection is not None:
                found.append(detection)
        return found


class StragglerGuard:
    """The in-job side: measures this rank's local and blocked time, exchanges them once per step, and on the
    reporter rank runs a :class:`StragglerDetector` and emits ``detect.straggler``. Collective: every rank of
    ``group`` calls :meth:`exchange` once per step, in step order.

    Usage (see ``chaos/reference/trainer.py``)::

        guard = StragglerGuard()
        guard.start()                          # after the last collective before the loop
        for step in ...:
            ...data, forward...                # local work
            with guard.collective():
                loss.backward()                # DDP's all-reduce: blocked time, not local work
            guard.exchange(step)               # right after the gradient sync
            ...optimizer step...               # local work
    """

    def __init__(
        self,
        *,
        window: int = DEFAULT_WINDOW,
        ratio: float = DEFAULT_RATIO,
        min_excess: float = DEFAULT_MIN_EXCESS_S,
        reporter: int = 0,
        group: dist.ProcessGroup | None = None,
        emit: Callable[..., None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        links: bool = False,
        link_ratio: float = DEFAULT_LINK_RATIO,
        link_min_excess: float = DEFAULT_LINK_MIN_EXCESS_S,
    ) -> None:
        distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank(group) if distributed else 0
        self.world_size = dist.get_world_size(group) if distributed else 1
        if not 0 <= reporter < self.world_size:
            raise ValueError(f"reporter {reporter} is not a rank of a world of {self.world_size}")
        self.reporter, self.group, self.emit, self.clock = reporter, group, emit, clock
        # gather's ``dst`` is a rank of the default group, whatever ``group`` is.
        self._reporter_global = dist.get_global_rank(group, reporter) if distributed and group is not None else reporter
        self.detector = StragglerDetector(self.world_size, window=window, ratio=ratio, min_excess=min_excess)
        self.links = (
            LinkDetector(self.world_size, window=window, ratio=link_ratio, min_excess=link_min_excess)
            if links
            else None
        )
        self.detections: list[Detection] = []  # every detection so far (on the reporter rank only)
        self.link_detections: list[LinkDetection] = []  # every rank named by its links (reporter rank only)
        self.last = (0.0, 0.0)  # this rank's (compute_s, wait_s) sent in the latest exchange
        self._mark = clock()
        self._blocked = 0.0
        self._exchange_wait = 0.0

    def start(self) -> None:
        """Restart the interval now (call right after the last collective before the training loop)."""
        self._mark = self.clock()
        self._blocked = 0.0

    @contextmanager
    def collective(self) -> Iterator[None]:
        """Count the time spent in the ``with`` body as blocked in a collective, not as local work."""
        began = self.clock()
        try:
            yield
        finally:
            self._blocked += self.clock() - began

    def exchange(self, step: int) -> list[Detection]:
        """Send this rank's numbers for ``step`` to the reporter; on the reporter, judge, emit, and return the local-work
        detections (ranks named by their links go to :attr:`link_detections`)."""
        now = self.clock()
        compute = max(0.0, now - self._mark - self._blocked)
        rtt = ring_rtt(self.group, self.clock) if self.links is not None and self.world_size > 1 else 0.0
        mine = torch.tensor([compute, self._blocked + self._exchange_wait, rtt], dtype=torch.float64)
        reporting = self.rank == self.reporter
        rows = [torch.empty_like(mine) for _ in range(self.world_size)] if reporting else []
        if self.world_size > 1:
            dist.gather(mine, rows if reporting else None, dst=self._reporter_global, group=self.group)
        else:
            rows = [mine]
        done = self.clock()
        self._exchange_wait = done - now
        self.last = (compute, float(mine[1]))
        self._mark, self._blocked = done, 0.0
        if not reporting:
            return []
        found = self.detector.observe(step, [float(r[0]) for r in rows], [float(r[1]) for r in rows])
        for detection in found:
            self._emit(
                detection,
                self.detector,
                compute_s=list(detection.compute_s),
                wait_s=list(detection.wait_s),
                cause="compute",
            )
        self.detections.extend(found)
        if self.links is not None:
            self._judge_links(step, [float(r[2]) for r in rows])
        return found

    def _judge_links(self, step: int, rtt_per_link: list[float]) -> None:
        assert self.links is not None
        for found in self.links.observe(step, rtt_per_link):
            # rank: the one both of whose ring links are slow
            self._emit(found, self.links, cause="link", rtt_ms=[round(v * 1e3, 3) for v in found.rtt_s])
            self.link_detections.append(found)

    def _emit(self, episode: Episode, by: PeerDetector, **evidence: object) -> None:
        """``detect.straggler`` naming ``episode.rank`` (the STRAGGLER, not the reporter), with ``by``'s settings
        and the detector's ``evidence``."""
        observed = episode.observed_ratio
        (self.emit or events.emit)(
            DETECT_STRAGGLER,
            rank=episode.rank,
            detector="straggler",
            reporter=self.rank,
            step=episode.step,
            window=episode.window,
            ratio=by.ratio,
            min_excess=by.min_excess,
            observed_ratio=round(observed, 4) if math.isfinite(observed) else None,
            **evidence,
        )


__all__ = [
    "DEFAULT_MIN_EXCESS_S",
    "DEFAULT_RATIO",
    "DEFAULT_WINDOW",
    "Detection",
    "StragglerDetector",
    "StragglerGuard",
]
