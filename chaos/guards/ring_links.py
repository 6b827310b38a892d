"""The straggler guard's link half: a ping-pong around the ring of ranks once per step, and the rank whose two
ring links are both slow.

:func:`ring_rtt` (collective: every rank of the group calls it once per exchange) sends a one-element tensor
to the next rank and echoes the one it receives from the previous rank, through the process group's own
point-to-point connections (the sockets the collectives use), twice; it returns this rank's round trip to its
successor, the faster of the two rounds (the first also absorbs the ranks' arrival skew).

:class:`LinkDetector` (pure) takes one row per step: ``rtt[r]`` is the round trip of the link from rank ``r`` to
rank ``r + 1`` (mod N). Over the last ``window`` steps it takes each link's MEDIAN (one stall of a process does
not make a link slow). Rank ``x`` is named when both links it is on (``x - 1 -> x`` and ``x -> x + 1``) are at
least ``ratio`` times the median of the other links AND above it by ``min_excess`` seconds: a delayed or lossy
path out of or into one host. Needs three ranks or more (with two, both ring links are the same pair and no
rank can be told from the other). One detection per episode, re-armed after ``window`` calm steps.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from chaos.guards.episodes import Episode, PeerDetector

DEFAULT_LINK_RATIO = 3.0
DEFAULT_LINK_MIN_EXCESS_S = 0.005
ROUNDS = 2
_PING_TAG, _ECHO_TAG = 7311, 7312


def ring_rtt(group: dist.ProcessGroup | None = None, clock: Callable[[], float] = time.monotonic) -> float:
    """This rank's round trip to its ring successor in seconds (the faster of :data:`ROUNDS` rounds). Collective."""
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    if size < 2:
        return 0.0

    def peer(r: int) -> int:
        return dist.get_global_rank(group, r) if group is not None else r

    successor, predecessor = peer((rank + 1) % size), peer((rank - 1) % size)
    best = math.inf
    for _ in range(ROUNDS):
        ping, echo, incoming = torch.zeros(1), torch.zeros(1), torch.zeros(1)
        received = dist.irecv(incoming, predecessor, group=group, tag=_PING_TAG)
        answered = dist.irecv(echo, successor, group=group, tag=_ECHO_TAG)
        # The echo is sent the moment the predecessor's ping is in, whatever this rank's own ping is waiting for.
        echoer = threading.Thread(target=_echo, args=(received, incoming, predecessor, group), daemon=True)
        echoer.start()
        began = clock()
        sent = dist.isend(ping, successor, group=group, tag=_PING_TAG)
        _wait(answered)
        best = min(best, clock() - began)
        _wait(sent)
        echoer.join()
    return best


def _echo(
    received: dist.Work | None, incoming: torch.Tensor, predecessor: int, group: dist.ProcessGroup | None
) -> None:
    _wait(received)
    _wait(dist.isend(incoming, predecessor, group=group, tag=_ECHO_TAG))


def _wait(work: dist.Work | None) -> None:
    if work is not None:  # None: this rank is not in the group (ring_rtt is only called by members)
        work.wait()


@dataclass(frozen=True)
class LinkDetection(Episode):
    """Rank ``rank``'s two ring links were slow over the ``window`` steps ending at ``step``; ``observed_ratio``:
    the faster of its two links' medians over ``median_s``, the median of the other links' medians."""

    rtt_s: tuple[float, ...]  # per link r -> r+1, its median round trip over the window

    def __str__(self) -> str:
        return (
            f"rank {self.rank}'s links are slow at step {self.step}: round trips "
            f"{self.rtt_s[(self.rank - 1) % len(self.rtt_s)] * 1e3:.1f} and {self.rtt_s[self.rank] * 1e3:.1f} ms, "
            f"{self.observed_ratio:.3g}x the other links' median {self.median_s * 1e3:.2f} ms"
        )


class LinkDetector(PeerDetector):
    """Windowed comparison of the ring links' round trips (see the module docstring). Pure: feed one row per step."""

    def __init__(
        self,
        world_size: int,
        *,
        window: int,
        ratio: float = DEFAULT_LINK_RATIO,
        min_excess: float = DEFAULT_LINK_MIN_EXCESS_S,
    ) -> None:
        super().__init__(world_size, window, ratio, min_excess)
        self._rows: deque[tuple[float, ...]] = deque(maxlen=window)

    def observe(self, step: int, rtt_per_link: Sequence[float]) -> list[LinkDetection]:
        """Add one step's round trips (``rtt_per_link[r]``: link r -> r+1); return the ranks named now."""
        if len(rtt_per_link) != self.world_size:
            raise ValueError(f"expected {self.world_size} round trips, got {len(rtt_per_link)}")
        row = tuple(float(v) for v in rtt_per_link)
        if not all(math.isfinite(v) and v >= 0.0 for v in row):
            raise ValueError(f"round trips must be finite and >= 0, got {row}")
        self._rows.append(row)
        if len(self._rows) < self.window or self.world_size < 3:
            return []
        medians = [statistics.median(r[link] for r in self._rows) for link in range(self.world_size)]
        rtt_s = tuple(round(m, 6) for m in medians)
        found: list[LinkDetection] = []
        for rank in range(self.world_size):
            mine = {(rank - 1) % self.world_size, rank}
            others = statistics.median(m for link, m in enumerate(medians) if link not in mine)
            slower = min(medians[link] for link in mine)  # both links are slow when the faster one is
            detection = self._episode(LinkDetection, rank, step, slower, others, rtt_s=rtt_s)
            if detection is not None:
                found.append(detection)
        return found


__all__ = ["DEFAULT_LINK_MIN_EXCESS_S", "DEFAULT_LINK_RATIO", "LinkDetection", "LinkDetector", "ring_rtt"]
