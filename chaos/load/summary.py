"""Pure functions over ``load.request`` events: what checks and reports ask of a load run.

Every function takes any iterable of events (a :class:`~chaos.history.timeline.History` works) and looks at the
``load.request`` ones, and at ``load.start`` / ``load.end`` for the run's bounds. Requests are placed in time by their SCHEDULED send time (``scheduled_ns``), so a
window holds the requests the generator was asked to send in it, however late their answers came.

Outcomes: ``ok`` is an HTTP status 200-399; anything else is an error: 4xx/5xx, ``timeout`` (no complete
answer within the timeout), ``error`` (connection or protocol failure), ``dropped_client`` (never sent:
max_in_flight requests were outstanding, i.e. the server was not keeping up) and ``cancelled`` (in flight
when the run was stopped without draining).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence

from pydantic import BaseModel, ConfigDict

from chaos.event_kinds import LOAD_END, LOAD_REQUEST, LOAD_START
from chaos.history.timeline import Event


def run_bounds(events: Iterable[Event], *, source: str | None = None) -> tuple[int, int] | None:
    """``(start_ns, end_ns)`` of the load's schedule, ``[0, duration)`` after its ``load.start``, when the
    events hold exactly one ``load.start`` (of ``source`` when given) and the run was not stopped early."""
    starts, stopped = [], False
    for e in events:
        if source is not None and e.source != source:
            continue
        if e.kind == LOAD_START:
            starts.append(e)
        elif e.kind == LOAD_END and e.data.get("stopped_early") is True:
            stopped = True
    if len(starts) != 1 or stopped:
        return None
    start, duration = starts[0].get_int("start_ns"), starts[0].data.get("duration_s")
    if start is None or not isinstance(duration, (int, float)) or isinstance(duration, bool) or duration <= 0:
        return None
    return start, start + round(duration * 1e9)


def _bounds(events: list[Event], reqs: list[Event], source: str | None) -> tuple[int, int]:
    """The run's own bounds when known, else first send to first send + :func:`span_s` (at least past the
    last send)."""
    known = run_bounds(events, source=source)
    if known is not None:
        return known
    if not reqs:
        return 0, 0
    first = scheduled_ns(reqs[0])
    return first, max(first + round(span_s(reqs) * 1e9), scheduled_ns(reqs[-1]) + 1)


def request_events(events: Iterable[Event], *, source: str | None = None) -> list[Event]:
    """The ``load.request`` events (of one generator ``source`` when given), ordered by scheduled time."""
    found = [e for e in events if e.kind == LOAD_REQUEST and (source is None or e.source == source)]
    found.sort(key=scheduled_ns)
    return found


def scheduled_ns(event: Event) -> int:
    value = event.data.get("scheduled_ns")
    return value if isinstance(value, int) else event.ts_ns


def status_of(event: Event) -> int | str:
    value = event.data.get("status")
    return value if isinstance(value, (int, str)) and not isinstance(value, bool) else "error"


def is_ok(event: Event) -> bool:
    status = status_of(event)
    return isinstance(status, int) and 200 <= status < 400


def responded(event: Event) -> bool:
    """True when the server answered with an HTTP status (any status)."""
    return isinstance(status_of(event), int)


def latency_s(event: Event) -> float | None:
    value = event.data.get("latency_s")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in 0..100) of ``values``; None when empty. Never interpolates, so a
    p99 is a latency some request really had."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def latencies(events: Iterable[Event], *, include_timeouts: bool = True) -> list[float]:
    """Latencies (seconds from scheduled send) of the requests that were answered, plus timed-out ones
    (their latency is the timeout, a lower bound) unless ``include_timeouts`` is False."""
    found = []
    for e in request_events(events):
        value = latency_s(e)
        if value is not None and (responded(e) or (include_timeouts and status_of(e) == "timeout")):
            found.append(value)
    return found


def latency_quantile(events: Iterable[Event], q: float, *, include_timeouts: bool = True) -> float | None:
    return percentile(latencies(events, include_timeouts=include_timeouts), q)


def error_rate(events: Iterable[Event]) -> float | None:
    """Share of scheduled requests that were not ``ok`` (None when there are none)."""
    reqs = request_events(events)
    return None if not reqs else sum(not is_ok(e) for e in reqs) / len(reqs)


def span_s(reqs: Sequence[Event]) -> float:
    """Seconds the requests' schedule covers: first to last send plus one mean gap (n sends at rate r → n/r)."""
    if len(reqs) < 2:
        return 0.0
    first, last = scheduled_ns(reqs[0]), scheduled_ns(reqs[-1])
    return (last - first) / 1e9 * len(reqs) / (len(reqs) - 1)


def achieved_rate(
    events: Iterable[Event], duration_s: float | None = None, *, source: str | None = None
) -> float | None:
    """Answered requests (any HTTP status) per second over ``duration_s`` (default: the run's duration from
    its ``load.start``, else the schedule's span)."""
    events = list(events)
    reqs = request_events(events, source=source)
    if duration_s is None:
        lo, hi = _bounds(events, reqs, source)
        duration_s = (hi - lo) / 1e9
    return None if duration_s <= 0 else sum(responded(e) for e in reqs) / duration_s


def backend_shares(events: Iterable[Event]) -> dict[str, float]:
    """Share of the answered requests each backend served, among those whose backend could be read."""
    counts = Counter(
        e.data["backend"] for e in request_events(events) if responded(e) and isinstance(e.data.get("backend"), str)
    )
    total = sum(counts.values())
    return {str(name): n / total for name, n in sorted(counts.items(), key=lambda kv: (-kv[1], str(kv[0])))}


class LoadStats(BaseModel):
    """Summary of the requests scheduled in ``[start_ns, end_ns)``; latencies in seconds."""

    model_config = ConfigDict(frozen=True)

    start_ns: int
    end_ns: int
    scheduled: int
    responded: int
    ok: int
    timeouts: int
    errors: int
    dropped_client: int
    cancelled: int
    error_rate: float | None
    offered_rate: float | None
    achieved_rate: float | None
    p50_s: float | None
    p90_s: float | None
    p99_s: float | None
    max_s: float | None
    statuses: dict[str, int]
    backends: dict[str, float]
    degraded_share: float | None
    priorities: dict[str, int]
    max_send_lag_s: float | None


def summarize(
    events: Iterable[Event], *, start_ns: int | None = None, end_ns: int | None = None, source: str | None = None
) -> LoadStats:
    """Stats of the requests scheduled in ``[start_ns, end_ns)``; the defaults are the run's bounds (from its
    ``load.start``; without one, from the first send over the schedule's span)."""
    events = list(events)
    reqs = request_events(events, source=source)
    lo, hi = _bounds(events, reqs, source)
    lo = lo if start_ns is None else start_ns
    hi = hi if end_ns is None else end_ns
    return _stats([e for e in reqs if lo <= scheduled_ns(e) < hi], lo, hi)


def windows(
    events: Iterable[Event],
    width_s: float,
    *,
    start_ns: int | None = None,
    end_ns: int | None = None,
    source: str | None = None,
) -> list[LoadStats]:
    """:func:`summarize` per consecutive window of ``width_s`` seconds over ``[start_ns, end_ns)`` (defaults
    as in :func:`summarize`); the last window may be shorter, empty windows are kept."""
    if width_s <= 0:
        raise ValueError("width_s must be positive")
    events = list(events)
    reqs = request_events(events, source=source)
    lo, hi = _bounds(events, reqs, source)
    lo = lo if start_ns is None else start_ns
    hi = hi if end_ns is None else end_ns
    width = round(width_s * 1e9)
    count = max(0, math.ceil((hi - lo) / width))
    buckets: list[list[Event]] = [[] for _ in range(count)]
    for e in reqs:
        at = scheduled_ns(e)
        if lo <= at < hi:
            buckets[(at - lo) // width].append(e)
    return [_stats(b, lo + k * width, min(lo + (k + 1) * width, hi)) for k, b in enumerate(buckets)]


def _stats(reqs: list[Event], start_ns: int, end_ns: int) -> LoadStats:
    statuses = Counter(str(status_of(e)) for e in reqs)
    answered = [e for e in reqs if responded(e)]
    lat = latencies(reqs)
    seconds = (end_ns - start_ns) / 1e9
    flags = [d for e in answered if isinstance(d := e.data.get("degraded"), bool)]
    lags = [v for e in reqs if isinstance(v := e.data.get("send_lag_s"), (int, float)) and not isinstance(v, bool)]
    ok = sum(is_ok(e) for e in reqs)
    return LoadStats(
        start_ns=start_ns,
        end_ns=end_ns,
        scheduled=len(reqs),
        responded=len(answered),
        ok=ok,
        timeouts=statuses.get("timeout", 0),
        errors=statuses.get("error", 0),
        dropped_client=statuses.get("dropped_client", 0),
        cancelled=statuses.get("cancelled", 0),
        error_rate=(len(reqs) - ok) / len(reqs) if reqs else None,
        offered_rate=len(reqs) / seconds if seconds > 0 else None,
        achieved_rate=len(answered) / seconds if seconds > 0 else None,
        p50_s=percentile(lat, 50),
        p90_s=percentile(lat, 90),
        p99_s=percentile(lat, 99),
        max_s=max(lat) if lat else None,
        statuses=dict(sorted(statuses.items())),
        backends=backend_shares(answered),
        degraded_share=sum(flags) / len(flags) if flags else None,
        priorities=dict(sorted(Counter(p for e in reqs if isinstance(p := e.data.get("priority"), str)).items())),
        max_send_lag_s=max(float(v) for v in lags) if lags else None,
    )
