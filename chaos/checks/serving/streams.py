"""The fields of a streamed request: what the stream checks read of one ``load.request`` event.

A streamed request carries, besides the request fields, ``stream: true``, ``ttft_s`` (scheduled send to the
first token; null when none came), ``gaps_s`` (each inter-token gap in order), ``tokens``, ``ended``
(``complete``; ``cut``: the connection ended after a token without the end marker; ``error``: it failed before
the first token; ``timeout``), ``backends`` (the distinct backends that produced tokens, in order),
``resumed`` (moved to another backend mid-way and still ended complete) and ``session``. Every reader here
is a pure function of one event and tolerates a missing or mistyped field (None, empty); a request without
``stream: true`` is no stream.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal, cast, get_args

from chaos.checks._evidence import fmt_offset, fmt_seconds
from chaos.checks.serving.events import backend_of
from chaos.history.timeline import Event, History
from chaos.load.summary import is_ok, latency_s, scheduled_ns, status_of

Ended = Literal["complete", "cut", "error", "timeout"]
ENDINGS: tuple[str, ...] = get_args(Ended)


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def is_stream(event: Event) -> bool:
    """A streamed request: ``data.stream`` is true."""
    return event.data.get("stream") is True


def streams(reqs: Iterable[Event]) -> list[Event]:
    """The streamed requests of ``reqs``, in their order."""
    return [e for e in reqs if is_stream(e)]


def ttft_of(event: Event) -> float | None:
    """Seconds from the scheduled send to the first token, or None (no token, or not recorded)."""
    return _number(event.data.get("ttft_s"))


def gaps_of(event: Event) -> list[float]:
    """The inter-token gaps in seconds, in order (non-numbers dropped)."""
    gaps = event.data.get("gaps_s")
    if not isinstance(gaps, list):
        return []
    return [g for item in gaps if (g := _number(item)) is not None]


def tokens_of(event: Event) -> int | None:
    return event.get_int("tokens")


def ended_of(event: Event) -> Ended | None:
    """How the stream ended, or None when it did not say (or said something unknown)."""
    value = event.data.get("ended")
    return cast(Ended, value) if value in ENDINGS else None


def backends_of(event: Event) -> list[str]:
    """The backends that produced tokens, in order; for a request without ``backends``, its ``backend`` when
    it was answered (ok)."""
    listed = event.data.get("backends")
    if isinstance(listed, list):
        return [b for b in listed if isinstance(b, str)]
    backend = backend_of(event)
    return [backend] if backend is not None and is_ok(event) else []


def served_by(event: Event) -> str | None:
    """The backend a request was routed to and answered from: a stream's first backend that produced a token
    (``backends[0]``, else ``backend`` when tokens came), an ordinary request's ``backend`` when ok."""
    if is_stream(event):
        first = backends_of(event)
        if first:
            return first[0]
        return backend_of(event) if (tokens_of(event) or 0) > 0 else None
    backend = backend_of(event)
    return backend if backend is not None and is_ok(event) else None


def resumed(event: Event) -> bool:
    """The gateway moved the stream to another backend mid-way and it still ended complete."""
    return event.data.get("resumed") is True and ended_of(event) == "complete"


def session_of(event: Event) -> str | None:
    return event.get_str("session")


def failed(event: Event) -> bool:
    """The request failed its user: a stream that did not end complete, any request that was not ok."""
    if is_stream(event):
        return ended_of(event) != "complete" or not is_ok(event)
    return not is_ok(event)


def last_token_ns(event: Event) -> int | None:
    """When the stream's last token came (scheduled + ttft + every gap), or None when no token came."""
    ttft = ttft_of(event)
    return None if ttft is None else scheduled_ns(event) + round((ttft + sum(gaps_of(event))) * 1e9)


def first_answer_ns(event: Event) -> int:
    """When the request's first token (or, without one, its answer) came."""
    ttft = ttft_of(event)
    wait = ttft if ttft is not None else latency_s(event) or 0.0
    return scheduled_ns(event) + round(wait * 1e9)


def gap_times_ns(event: Event) -> list[tuple[float, int]]:
    """Each gap (seconds) with when it ended (the token after it came); none when the TTFT is unknown."""
    ttft = ttft_of(event)
    if ttft is None:
        return []
    found, at = [], ttft
    for gap in gaps_of(event):
        at += gap
        found.append((gap, scheduled_ns(event) + round(at * 1e9)))
    return found


def failure_ns(event: Event) -> int:
    """When the request failed on its first backend: for a stream resumed elsewhere, when the token before its
    longest gap came (the gap is the cut and the resume; the event does not say more); else when it ended."""
    gaps = gap_times_ns(event)
    if resumed(event) and gaps:
        gap, after_ns = max(gaps, key=lambda pair: pair[0])
        return after_ns - round(gap * 1e9)
    return stream_end_ns(event)


def stream_end_ns(event: Event) -> int:
    """When the request ended: the later of its answer's end (scheduled + latency) and its last token."""
    answered = scheduled_ns(event) + round((latency_s(event) or 0.0) * 1e9)
    last = last_token_ns(event)
    return answered if last is None else max(answered, last)


def in_flight(event: Event, lo_ns: int, hi_ns: int) -> bool:
    """The request was open at some time in ``[lo_ns, hi_ns)``: scheduled before ``hi_ns``, ended at or after
    ``lo_ns``."""
    return scheduled_ns(event) < hi_ns and stream_end_ns(event) >= lo_ns


def describe_stream(history: History, event: Event) -> str:
    """``"stream 17 (cut after 12 tokens, via primary) sent at +12.301s"``: one evidence line for a stream."""
    index = event.get_int("i")
    name = ("stream" if is_stream(event) else "request") + ("" if index is None else f" {index}")
    ended = ended_of(event) if is_stream(event) else None
    tokens = tokens_of(event)
    if ended == "cut":
        what = f"cut after {tokens if tokens is not None else '?'} tokens"
    elif ended is not None:
        what = ended + ("" if tokens is None or ended != "complete" else f", {tokens} tokens")
    else:
        what = str(status_of(event))
    route = backends_of(event)
    if route:
        what += f", via {' -> '.join(route)}"
    if resumed(event):
        what += ", resumed"
    session = session_of(event)
    if session is not None:
        what += f", session {session}"
    return f"{name} ({what}) sent at {fmt_offset(history, scheduled_ns(event))}"


def ended_counts(reqs: Sequence[Event]) -> str:
    """``"complete x90, cut x8, resumed x3"``: how the streams of ``reqs`` ended."""
    parts = [f"{name} x{n}" for name in ENDINGS if (n := sum(ended_of(e) == name for e in reqs))]
    unsaid = sum(ended_of(e) is None for e in reqs)
    if unsaid:
        parts.append(f"not recorded x{unsaid}")
    again = sum(resumed(e) for e in reqs)
    if again:
        parts.append(f"resumed x{again}")
    return ", ".join(parts) or "none"


def worst_line(history: History, event: Event, value: float, what: str) -> str:
    """``"stream 17 (...) sent at +1.000s: ttft 2.5s"``."""
    return f"{describe_stream(history, event)}: {what} {fmt_seconds(value)}"
