"""Open-loop HTTP load generation whose every request is an event in the run's history.

- :mod:`chaos.spec.load`: :class:`LoadSpec` (pydantic, embeddable in scenario YAML) and the send schedule.
- :mod:`chaos.load.engine`: the asyncio HTTP/1.1 keep-alive client that follows the schedule.
- :mod:`chaos.load.stream`: reading a streamed answer (SSE or chunked JSON lines) token by token.
- :mod:`chaos.load.run`: :class:`LoadRun`, the engine in a background thread or child process.
- :mod:`chaos.load.summary`: pure functions over the events (error rate, latency percentiles, achieved
  rate, backend shares, per-window stats), the ones checks use.
- ``python -m chaos.load --url URL --rate 500 --duration 10s``: standalone, prints a summary.

Event kinds (source ``load`` unless renamed):

- ``load.start``: ``url``, ``method``, ``rate``, ``pattern``, ``arrivals``, ``duration_s``, ``timeout_s``,
  ``max_in_flight``, ``seed``, ``start_ns`` (wall time of offset 0 of the schedule)
- ``load.request``, one per scheduled request, stamped when its outcome was known (due time + latency):
  ``i`` (index in the schedule), ``scheduled_ns`` (wall time it was due), ``latency_s`` (from the scheduled
  time; null for ``dropped_client``), ``status`` (HTTP status int, or ``"timeout"``, ``"error"``,
  ``"dropped_client"``, ``"cancelled"``), ``backend`` (per ``served_by``; null if unread), ``degraded``
  (per the ``degraded`` rule; null without a rule or an answer), ``priority``, ``send_lag_s`` (how late the
  generator itself wrote it; null if never sent), for ``error``, ``error`` (what failed) and, with
  ``sessions`` set, ``session``.
  With ``stream`` set (:mod:`chaos.load.stream` reads the answers), also: ``stream`` (true), ``ttft_s`` (from
  the SCHEDULED time to the first token; null without one), ``gaps_s`` (each inter-token gap in order,
  seconds rounded to 1 us), ``tokens``, ``ended`` (``"complete"``: the end marker came; ``"cut"``: the
  connection or body ended after a token without it; ``"error"``: nothing streamed (refused, reset, non-2xx,
  dropped, cancelled first); ``"timeout"``: the timeout hit, ``tokens`` says whether any came), ``backends``
  (distinct backends that produced tokens, in order of first appearance), ``resumed`` (complete with 2+
  backends) and ``session`` (``s{i % sessions}``, or null); ``latency_s`` runs to the stream's end, ``backend``
  is the first backend, and a stream not ``complete`` has status ``"error"`` (or ``"timeout"``/``"cancelled"``)
- ``load.end``: totals (``scheduled``, ``sent``, ``responded``, ``ok``, ``timeouts``, ``errors``,
  ``dropped_client``, ``cancelled``, ``retries``, ``connections``), ``cpu_s`` (the generator's own CPU),
  ``wall_s``, ``max_send_lag_s``, ``stopped_early``; with ``stream`` also ``complete``, ``cut``, ``resumed``,
  ``tokens``
"""

from chaos.load.engine import LOAD_END, LOAD_REQUEST, LOAD_START, LoadEngine
from chaos.load.run import LoadRun
from chaos.load.summary import (
    LoadStats,
    achieved_rate,
    backend_shares,
    error_rate,
    latency_quantile,
    percentile,
    request_events,
    run_bounds,
    summarize,
    windows,
)
from chaos.spec.load import (
    BodyFile,
    Burst,
    BurstPattern,
    HeaderField,
    HeaderMatch,
    JsonField,
    JsonMatch,
    LoadSpec,
    Step,
    StepPattern,
    offered,
    priority_sequence,
    rate_segments,
    schedule,
)

__all__ = [
    "LOAD_END",
    "LOAD_REQUEST",
    "LOAD_START",
    "BodyFile",
    "Burst",
    "BurstPattern",
    "HeaderField",
    "HeaderMatch",
    "JsonField",
    "JsonMatch",
    "LoadEngine",
    "LoadRun",
    "LoadSpec",
    "LoadStats",
    "Step",
    "StepPattern",
    "achieved_rate",
    "backend_shares",
    "error_rate",
    "latency_quantile",
    "offered",
    "percentile",
    "priority_sequence",
    "rate_segments",
    "request_events",
    "run_bounds",
    "schedule",
    "summarize",
    "windows",
]
