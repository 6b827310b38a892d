"""Stream checks: what users of a streaming model server saw while faults hit it.

The evidence is the load generator's streamed ``load.request`` events (fields in
:mod:`chaos.checks.serving.streams`) next to the faults and the gateway's events. The windowed checks share
:class:`~chaos.checks.serving.windows.WindowParams`: a TTFT belongs to the window its stream was scheduled in,
a gap to the window its next token came in, a stream's ending to every window it was open in (a stream cut by
a fault was sent before it); a window without streamed requests is ``unknown``.

- ``ttft_within``: a quantile of time to first token; a stream that timed out before its first token counts
  at its timeout (a lower bound), so a stack that stops answering cannot look fast.
- ``inter_token_gap_within``: a quantile over every gap between tokens that ended in the window; a stream that
  timed out mid-way adds the wait from its last token to the timeout (a lower bound).
- ``streams_completed``: the share of the streams open in the window that ended complete (a stream the gateway resumed on another
  backend counts, unless ``cut_ok_if_resumed`` is off); a failure names the cut streams.
- ``session_affinity``: the requests of one session stay on one backend unless it failed between them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from math import ceil
from typing import TYPE_CHECKING

from pydantic import Field

from chaos.checks._evidence import Verdict, at_most, capped, fault_target, fmt_offset, fmt_seconds, verdict_of
from chaos.checks.base import CheckParams, CheckResult, register_check
from chaos.checks.serving import events as ev
from chaos.checks.serving import streams as st
from chaos.checks.serving.measures import sent_ns
from chaos.checks.serving.windows import Window, WindowParams, resolve_window
from chaos.event_kinds import DETECT_BACKEND_DOWN, FAULT_APPLIED, SERVING_BACKEND_UP, SERVING_BREAKER
from chaos.history.timeline import Event, History
from chaos.load.summary import latency_s, request_events, scheduled_ns
from chaos.spec.units import Duration

if TYPE_CHECKING:
    from chaos.spec.scenario import Scenario

CHECK_TTFT = "ttft_within"
CHECK_GAP = "inter_token_gap_within"
CHECK_COMPLETED = "streams_completed"
CHECK_AFFINITY = "session_affinity"
STREAM_CHECKS = (CHECK_TTFT, CHECK_GAP, CHECK_COMPLETED, CHECK_AFFINITY)
SHOWN = 5  # example streams cited per problem
NEEDS_STREAMS = "add a load: section that streams (the load generator's streamed requests) to the scenario"
NEEDS_SESSIONS = "add a load: section that streams with sessions (each request names its session)"


def _streams_in(
    history: History, scenario: Scenario | None, p: WindowParams, verdict: Verdict, *, open_in: bool = False
) -> tuple[Window, list[Event]] | CheckResult:
    """The window's streamed requests (scheduled in it; with ``open_in``, open at some time in it, so a stream
    sent just before a fault and cut by it belongs to the fault's window), or an ``unknown`` verdict saying why
    there are none."""
    window = resolve_window(history, scenario, p)
    if not isinstance(window, Window):
        return verdict(status="unknown", reason=window.reason, evidence=list(window.evidence))
    reqs = request_events(history.events)
    if open_in:
        found = [e for e in st.streams(reqs) if any(st.in_flight(e, lo, hi) for lo, hi in window.intervals)]
    else:
        found = st.streams(window.select(reqs))
    if not found:
        how = "open" if open_in else "scheduled"
        return verdict(
            status="unknown",
            reason=f"no streamed requests {how} in {window.text} (none with stream: true)",
            evidence=list(window.evidence),
        )
    return window, found


def _nearest_rank(values: Sequence[tuple[float, Event]], q: float) -> tuple[float, Event]:
    """The nearest-rank ``q`` quantile of ``values`` (sorted ascending)."""
    return values[max(1, ceil(q * len(values))) - 1]


class StreamQuantileParams(WindowParams):
    """Parameters of ``ttft_within`` and ``inter_token_gap_within``."""

    q: float = Field(gt=0, le=1, description="quantile in (0, 1], e.g. 0.99 for p99 (nearest rank, no interpolation)")
    max: Duration = Field(description="largest allowed value at that quantile (e.g. 500ms)")


def _judge_quantile(
    history: History,
    p: StreamQuantileParams,
    verdict: Verdict,
    window: Window,
    values: list[tuple[float, Event]],
    what: str,
    notes: list[str],
) -> CheckResult:
    """Hold the nearest-rank quantile of ``values`` ((seconds, stream) pairs) to ``p.max``; evidence: the count,
    the value at the quantile and the worst streams (each stream once, by its worst value)."""
    values.sort(key=lambda pair: (pair[0], scheduled_ns(pair[1])))
    value, at = _nearest_rank(values, p.q)
    worst: dict[int, tuple[float, Event]] = {}
    for seconds, e in reversed(values):
        if id(e) not in worst and len(worst) < SHOWN:
            worst[id(e)] = (seconds, e)
    evidence = [
        *window.evidence,
        f"{len(values)} {what}(s) in {window.text}",
        *notes,
        st.worst_line(history, at, value, f"at the quantile, {what}"),
        *(st.worst_line(history, e, seconds, f"worst {what}") for seconds, e in worst.values()),
    ]
    reason = f"p{p.q * 100:g} {what} {fmt_seconds(value)} over {len(values)} value(s) in {window.text}"
    return at_most(verdict, value, p.max, reason, f"{fmt_seconds(p.max)} bound", capped(evidence))


# ---------------------------------------------------------------------------------------------------------
# ttft_within


@register_check(CHECK_TTFT, StreamQuantileParams, to_add=NEEDS_STREAMS)
def ttft_within(history: History, p: StreamQuantileParams, scenario: Scenario) -> CheckResult:
    """a quantile of time to first token of the streams in a window is at most max

    Nearest-rank ``q`` quantile of time to first token (``ttft_s``: from the scheduled send) over the
    window's streams that got a token or timed out before one; a timeout counts at its recorded latency, the
    timeout, a lower bound. A stream that failed before its first token has no TTFT and is left out
    (``streams_completed`` judges it). ``unknown`` when no stream in the window has a TTFT."""
    verdict = verdict_of(CHECK_TTFT, p.fault, bound=f"p{p.q * 100:g} <= {fmt_seconds(p.max)}", unit="s")
    got = _streams_in(history, scenario, p, verdict)
    if isinstance(got, CheckResult):
        return got
    window, found = got
    values: list[tuple[float, Event]] = []
    timeouts = 0
    for e in found:
        ttft = st.ttft_of(e)
        if ttft is None and st.ended_of(e) == "timeout":
            ttft = latency_s(e)
            timeouts += ttft is not None
        if ttft is not None:
            values.append((ttft, e))
    if not values:
        return verdict(
            status="unknown",
            evidence=[*window.evidence, f"streams ended: {st.ended_counts(found)}"],
            reason=f"none of the {len(found)} stream(s) in {window.text} got a first token or timed out",
        )
    untimed = len(found) - len(values)
    notes = [
        f"{timeouts} timed out before the first token (counted at the timeout); {untimed} without a TTFT; "
        f"streams ended: {st.ended_counts(found)}"
    ]
    return _judge_quantile(history, p, verdict, window, values, "ttft", notes)


# ---------------------------------------------------------------------------------------------------------
# inter_token_gap_within


def trailing_wait(event: Event) -> float | None:
    """For a stream that timed out after its first token: the wait from its last token to the timeout (a lower
    bound on the gap it never finished), else None."""
    ttft, total = st.ttft_of(event), latency_s(event)
    if st.ended_of(event) != "timeout" or ttft is None or total is None:
        return None
    rest = total - ttft - sum(st.gaps_of(event))
    return rest if rest > 0 else None


@register_check(CHECK_GAP, StreamQuantileParams, to_add=NEEDS_STREAMS)
def inter_token_gap_within(history: History, p: StreamQuantileParams, scenario: Scenario) -> CheckResult:
    """a quantile of the gaps between tokens of the streams in a window is at most max

    Nearest-rank ``q`` quantile over every inter-token gap (``gaps_s``) that ended in the window (the token
    after it came there), all streams' gaps together; a stream that timed out after its first token adds the wait from its last token to the
    timeout (a lower bound), so a stream that stalls for good cannot look smooth. ``unknown`` when the window's
    streams have no gap (none got two tokens)."""
    verdict = verdict_of(CHECK_GAP, p.fault, bound=f"p{p.q * 100:g} <= {fmt_seconds(p.max)}", unit="s")
    got = _streams_in(history, scenario, p, verdict, open_in=True)
    if isinstance(got, CheckResult):
        return got
    window, found = got

    def inside(ts_ns: int) -> bool:
        return any(lo <= ts_ns < hi for lo, hi in window.intervals)

    values: list[tuple[float, Event]] = []
    stalled = 0
    for e in found:
        values.extend((gap, e) for gap, at in st.gap_times_ns(e) if inside(at))
        rest = trailing_wait(e)
        if rest is not None and inside(st.stream_end_ns(e)):
            values.append((rest, e))
            stalled += 1
    if not values:
        return verdict(
            status="unknown",
            evidence=[*window.evidence, f"streams ended: {st.ended_counts(found)}"],
            reason=f"none of the {len(found)} stream(s) in {window.text} has a gap between tokens",
        )
    notes = [f"from {len(found)} stream(s); {stalled} timed out mid-way (the wait to the timeout counted as a gap)"]
    return _judge_quantile(history, p, verdict, window, values, "gap", notes)


# ---------------------------------------------------------------------------------------------------------
# streams_completed


class CompletedParams(WindowParams):
    """Parameters of ``streams_completed``."""

    min_share: float = Field(default=0.99, ge=0, le=1, description="smallest allowed share of streams that completed")
    cut_ok_if_resumed: bool = Field(
        default=True,
        description="a stream the gateway moved to another backend mid-way and still completed counts as "
        "complete (the user saw a whole answer); false: it counts as cut",
    )


def _cut_text(e: Event) -> str:
    index = e.get_int("i")
    route = st.backends_of(e)
    tokens = st.tokens_of(e)
    return (
        f"{'?' if index is None else index} ({route[-1] if route else ev.backend_of(e) or '?'}, "
        f"{'?' if tokens is None else tokens} tokens)"
    )


@register_check(CHECK_COMPLETED, CompletedParams, to_add=NEEDS_STREAMS)
def streams_completed(history: History, p: CompletedParams, scenario: Scenario) -> CheckResult:
    """the share of streams in a window that ended complete is at least min_share; cut streams named

    Share of the streams open in the window (sent before its end, ended after its start, so the streams a
    fault cut are in its ``during`` window) that recorded how they ended and ended ``complete``: whole answers. A stream ``resumed`` by the gateway on another backend counts as complete with
    ``cut_ok_if_resumed`` (default), else as cut. ``cut`` (half an answer), ``error`` (nothing) and
    ``timeout`` streams count against it. The evidence counts how many streams were cut on a backend and of
    those how many the gateway resumed; a failure names every cut stream (i, backend, tokens at the cut).
    ``unknown`` when the window holds no stream that recorded its end."""
    verdict = verdict_of(CHECK_COMPLETED, p.fault, bound=f">= {p.min_share:g}")
    got = _streams_in(history, scenario, p, verdict, open_in=True)
    if isinstance(got, CheckResult):
        return got
    window, found = got
    judged = [e for e in found if st.ended_of(e) is not None]
    if not judged:
        return verdict(
            status="unknown",
            evidence=list(window.evidence),
            reason=f"none of the {len(found)} stream(s) in {window.text} recorded how it ended (ended)",
        )
    moved = [e for e in judged if st.resumed(e)]
    cut = [e for e in judged if st.ended_of(e) == "cut"]
    complete = [e for e in judged if st.ended_of(e) == "complete" and (p.cut_ok_if_resumed or not st.resumed(e))]
    lost = [e for e in judged if st.ended_of(e) in ("error", "timeout")]
    share = len(complete) / len(judged)
    evidence = [
        *window.evidence,
        f"{len(judged)} stream(s) in {window.text}: {st.ended_counts(judged)}",
        f"{len(moved) + len(cut)} cut on a backend: {len(moved)} resumed by the gateway, {len(cut)} reached the "
        "user cut",
        *(st.describe_stream(history, e) for e in cut),
        *(st.describe_stream(history, e) for e in lost[:SHOWN]),
    ]
    if not p.cut_ok_if_resumed and moved:
        evidence.append(f"{len(moved)} resumed stream(s) count as cut (cut_ok_if_resumed: false)")
    ok = share >= p.min_share
    reason = f"{len(complete)}/{len(judged)} stream(s) complete ({share:.4g}) in {window.text}"
    if not ok:
        reason += f", under {p.min_share:g}"
        if cut:
            shown = ", ".join(_cut_text(e) for e in cut[:SHOWN])
            reason += f"; {len(cut)} cut stream(s) (i, backend, tokens): {shown}" + (
                f" and {len(cut) - SHOWN} more" if len(cut) > SHOWN else ""
            )
        if lost:
            counts = Counter(str(st.ended_of(e)) for e in lost)
            reason += f"; {len(lost)} failed before completing: " + ", ".join(f"{k} x{n}" for k, n in counts.items())
    return verdict(status="pass" if ok else "fail", measured=share, evidence=capped(evidence, 40), reason=reason)


# ---------------------------------------------------------------------------------------------------------
# session_affinity


class AffinityParams(CheckParams):
    """Parameters of ``session_affinity``."""

    max_moves: int = Field(default=0, ge=0, description="moves of a session to another backend without cause allowed")
    failback_ok: bool = Field(
        default=True,
        description="a session may go back to its first backend once that backend is back (serving.backend_up "
        "or breaker closed after the session left it)",
    )
    slack: Duration = Field(default=0.05, description="clock tolerance between the gateway's and the client's events")


class _Failures:
    """The gateway's and the harness's word on when each backend failed and came back, read once per check."""

    def __init__(self, history: History, scenario: Scenario | None) -> None:
        self.history = history
        self.downs = [
            e
            for kind in (DETECT_BACKEND_DOWN, SERVING_BREAKER)
            for e in ev.events_of(history, kind)
            if e.get_str("state") in (None, "open")
        ]
        self.ups = [
            e
            for kind in (SERVING_BACKEND_UP, SERVING_BREAKER)
            for e in ev.events_of(history, kind)
            if e.kind == SERVING_BACKEND_UP or e.get_str("state") == "closed"
        ]
        self.faults: list[tuple[Event, int | None, frozenset[str]]] = []  # (op, its end, the replicas it hit)
        for op in ev.events_of(history, FAULT_APPLIED):
            spans = ev.fault_spans(history, scenario, op.get_str("fault") or "")
            end = next((span.end_ns for span in spans if span.applied == op), None)
            self.faults.append((op, end, fault_target(history, op, scenario).replicas))

    def cause(self, backend: str, lo: int, hi: int, between: Sequence[Event]) -> str | None:
        """Why a session could leave ``backend`` between ``lo`` and ``hi`` (ns): a request of the session in
        ``between`` that failed or was resumed off it, a ``detect.backend_down`` or ``serving.breaker`` open
        naming it, or a fault on it in force; None when nothing says it failed."""
        for e in between:
            if st.failed(e) or st.resumed(e):
                return st.describe_stream(self.history, e)
        for e in self.downs:
            if lo < e.ts_ns <= hi and ev.names_backend(e, backend):
                return ev.describe_serving(self.history, e)
        for op, end, hit in self.faults:
            if op.ts_ns <= hi and (end is None or end >= lo) and (backend in hit or ev.names_backend(op, backend)):
                return ev.describe_serving(self.history, op)
        return None

    def back_up(self, backend: str, lo: int, hi: int) -> bool:
        """``backend`` was reported back (serving.backend_up, or its breaker closed) in ``(lo, hi]``."""
        return any(lo < e.ts_ns <= hi and ev.names_backend(e, backend) for e in self.ups)


@register_check(CHECK_AFFINITY, AffinityParams, to_add=NEEDS_SESSIONS)
def session_affinity(history: History, p: AffinityParams, scenario: Scenario) -> CheckResult:
    """the requests of a session stay on one backend unless that backend failed between them

    For each session (``data.session``), its served requests in scheduled order (the backend each was routed
    to: a stream's first backend). A move to another backend has a cause when, between the send of the last
    request on the old backend and the first token of the moved one (the gateway may retry a request on another
    backend before it answers; ``slack`` after), a request of the session failed or was resumed
    off it, ``detect.backend_down`` or ``serving.breaker`` open named the old backend, or a fault on it was in
    force; with ``failback_ok``, returning to the session's first backend after it was reported back is no
    move. Fails when more than ``max_moves`` moves had no cause, naming the sessions. ``unknown`` when no
    request names a session, or no session has two served requests."""
    verdict = verdict_of(CHECK_AFFINITY, bound=f"<= {p.max_moves} moves without cause", unit=" moves")
    reqs = request_events(history.events)
    sessions: dict[str, list[Event]] = {}
    for e in reqs:
        name = st.session_of(e)
        if name is not None:
            sessions.setdefault(name, []).append(e)
    if not sessions:
        return verdict(status="unknown", reason=f"none of the {len(reqs)} request(s) names a session")
    slack = round(p.slack * 1e9)
    failures = _Failures(history, scenario)
    judged = 0
    caused: list[str] = []
    uncaused: list[tuple[str, str]] = []
    for name, mine in sorted(sessions.items()):
        served = [e for e in mine if st.served_by(e) is not None]
        judged += len(served) >= 2
        home = st.served_by(served[0]) if served else None
        left_home: int | None = None
        for prev, cur in zip(served, served[1:], strict=False):
            old, new = st.served_by(prev), st.served_by(cur)
            if old == new or old is None or new is None:
                continue
            lo, hi = sent_ns(prev), st.first_answer_ns(cur) + slack
            if new == home and left_home is not None and p.failback_ok and failures.back_up(new, left_home, hi):
                caused.append(f"session {name}: back on {new} at {fmt_offset(history, sent_ns(cur))}")
                left_home = None
                continue
            between = [e for e in mine if scheduled_ns(prev) <= scheduled_ns(e) < scheduled_ns(cur)]
            why = failures.cause(old, lo - slack, hi, between)
            if old == home:
                left_home = lo
            line = f"session {name}: {old} -> {new} at {fmt_offset(history, sent_ns(cur))}"
            if why is None:
                uncaused.append((name, f"{line} with no failure of {old} since {fmt_offset(history, lo)}"))
            else:
                caused.append(f"{line}, after {why}")
    if not judged:
        return verdict(status="unknown", reason=f"no session of {len(sessions)} has two served requests")
    evidence = [
        f"{len(sessions)} session(s), {judged} with two or more served requests; {len(caused)} move(s) with cause",
        *(line for _, line in uncaused),
        *caused,
    ]
    names = sorted({name for name, _ in uncaused})
    reason = f"{len(uncaused)} move(s) without cause in {len(names)} session(s)"
    if names:
        reason += f": {', '.join(names[:SHOWN])}" + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")
    return at_most(verdict, float(len(uncaused)), p.max_moves, reason, f"{p.max_moves} allowed", capped(evidence))
