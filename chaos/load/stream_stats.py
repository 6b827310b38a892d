"""Pure summary of streamed ``load.request`` events: how streams ended, tokens, TTFT and inter-token gaps.

:func:`stream_stats` takes any iterable of events and looks at the streamed requests (``stream: true``); the
percentiles are nearest-rank (:func:`chaos.load.summary.percentile`), over every stream's ``ttft_s`` and over
every gap of every stream. What the CLI and benchmarks print; checks have their own readers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict

from chaos.history.timeline import Event
from chaos.load.summary import percentile, request_events


class StreamStats(BaseModel):
    model_config = ConfigDict(frozen=True)
    streams: int
    ended: dict[str, int]  # complete / cut / error / timeout -> count
    resumed: int
    tokens: int
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    gap_p50_s: float | None
    gap_p99_s: float | None
    gap_max_s: float | None


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def stream_stats(events: Iterable[Event], *, source: str | None = None) -> StreamStats:
    streams = [e for e in request_events(events, source=source) if e.data.get("stream") is True]
    ended: Counter[str] = Counter(str(e.data.get("ended")) for e in streams)
    ttfts = [t for e in streams if (t := _number(e.data.get("ttft_s"))) is not None]
    gaps: list[float] = []
    tokens = 0
    for e in streams:
        found = e.data.get("gaps_s")
        if isinstance(found, list):
            gaps += [g for value in found if (g := _number(value)) is not None]
        count = e.data.get("tokens")
        tokens += count if isinstance(count, int) else 0
    return StreamStats(
        streams=len(streams),
        ended=dict(ended),
        resumed=sum(e.data.get("resumed") is True for e in streams),
        tokens=tokens,
        ttft_p50_s=percentile(ttfts, 50),
        ttft_p99_s=percentile(ttfts, 99),
        gap_p50_s=percentile(gaps, 50),
        gap_p99_s=percentile(gaps, 99),
        gap_max_s=max(gaps) if gaps else None,
    )
