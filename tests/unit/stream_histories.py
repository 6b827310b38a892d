"""Hand-made histories of a streaming fleet behind a fallback ladder, for the stream and ladder checks
(``ttft_within``, ``inter_token_gap_within``, ``streams_completed``, ``session_affinity``, ``fallback_ladder``,
``fallback_share_alert``; the event contract: streamed ``load.request`` events, the gateway's ``serving.*`` and
``detect.backend_down``, ``fault.applied`` of a kill).

:class:`StreamRun`: a constant-rate streamed load from t=0 (request i sent at i / rate, ``tokens`` tokens, the
first ``ttft`` after the send, then one every ``gap``; session ``s{i % sessions}``). The primary (rung big) is
killed at ``fault_at``: its breaker opens, ``detect.backend_down`` follows ``down_after`` later, and from then
on requests go to ``small`` (or the cache with ``skip_small``; to the cache from ``cache_from`` when small dies
too); streams open on the primary at the kill are resumed on the new rung (``resume``) or cut. The primary is
back (``serving.backend_up``) at ``back_at`` and takes traffic again ``hold`` later. :meth:`but` makes the
variations that break a property. :data:`STREAMS` is the check-safety entry: name -> (strategy of holding
cases, [(what, strategy of violating cases, verdict)]), each case a tuple (events, params, scenario).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Any

from hypothesis import strategies as st
from support import ev

from chaos.history.timeline import Event

KILL = "kill-primary"
KILL_SMALL = "kill-small"
RUNGS = [
    {"backend": "primary", "rung": "big"},
    {"backend": "small", "rung": "small"},
    {"backend": "cache", "rung": "cached"},
]
MIGRATION = 0.2  # the extra gap where a resumed stream moves to its new backend


@dataclass(frozen=True)
class StreamRun:
    duration: float = 20.0
    rate: float = 10.0
    fault_at: float = 5.0
    with_fault: bool = True  # False: the kill never happened, yet the gateway moves as if it had
    back_at: float = 12.0
    hold: float = 1.0
    down_after: float | None = 0.5  # None: no detect.backend_down of the primary
    breaker: bool = True  # serving.breaker open (at the kill) and closed (at back_at) of the primary
    ups: bool = True  # serving.backend_up of the primary at back_at
    routes: bool = False  # the gateway records serving.route at each move
    cache_from: float | None = None  # small dies too: the cache serves from here until the primary is back
    small_signal: bool = True  # with cache_from: small's kill and detect.backend_down
    leak: float = 0.0  # with cache_from: for this long small (still up) and the cache alternate, then small dies
    skip_small: bool = False  # the kill sends traffic straight to the cache
    resume: bool = True  # the gateway resumes streams the kill cut; False: they end cut
    tokens: int = 20
    ttft: float = 0.1
    gap: float = 0.05
    slow: float = 1.0  # ttft and gaps on the lower rungs, times this
    stall: bool = False  # streams on the lower rungs stall after 3 tokens and time out
    no_first_token: bool = False  # streams on the lower rungs time out before their first token
    errors: float = 0.0  # streams sent in the first `errors` s after the kill fail before their first token
    stream: bool = True  # False: ordinary requests (no stream: true)
    ended: bool = True  # False: streams do not record how they ended
    sessions: int | None = 8  # None: requests carry no session
    spread: bool = False  # no affinity: before the kill, a session's requests alternate primary / primary-b
    timeout: float = 5.0

    def but(self, **changes: Any) -> StreamRun:
        return replace(self, **changes)

    @property
    def back(self) -> float:
        """When traffic returns to the primary."""
        return self.back_at + self.hold

    @property
    def length(self) -> float:
        """Seconds from the send to the last token of a stream on the primary."""
        return self.ttft + (self.tokens - 1) * self.gap

    def backend_at(self, t: float, i: int) -> str:
        if t < self.fault_at or t >= self.back:
            return ("primary", "primary-b")[(i // (self.sessions or 1)) % 2] if self.spread else "primary"
        if self.cache_from is not None and self.cache_from <= t < self.cache_from + self.leak:
            return ("cache", "small")[i % 2]
        if self.skip_small or (self.cache_from is not None and t >= self.cache_from):
            return "cache"
        return "small"

    def fallback_seconds(self) -> float:
        """How long traffic is off the primary."""
        return self.back - self.fault_at

    # -- events

    def events(self) -> list[Event]:
        out = [
            ev(0.0, "load.start", source="load", start_ns=0, duration_s=self.duration, rate=self.rate),
            ev(0.0, "serving.ready", url="http://127.0.0.1:1/", replicas=["primary", "small"]),
        ]
        for i in range(round(self.duration * self.rate)):
            out.append(self._request(i, i / self.rate))
        out.append(ev(self.duration + 1.0, "load.end", source="load", stopped_early=False))
        out += self._gateway()
        return sorted(out, key=lambda e: e.ts_ns)

    def _gateway(self) -> list[Event]:
        out: list[Event] = []
        t0 = self.fault_at
        if self.with_fault:
            out.append(_killed(t0, KILL, "op-1", "primary"))
            out.append(ev(t0 + 0.01, "serving.replica_exit", source="runner", replica="primary", code=-9))
            if self.breaker:
                out.append(ev(t0 + 0.02, "serving.breaker", backend="primary", state="open"))
            if self.down_after is not None:
                out.append(ev(t0 + self.down_after, "detect.backend_down", backend="primary", reason="health"))
        if self.ups:
            out.append(ev(self.back_at - 1.0, "serving.replica_start", source="runner", replica="primary"))
            out.append(ev(self.back_at, "serving.backend_up", backend="primary", successes=2))
            if self.breaker and self.with_fault:
                out.append(ev(self.back_at, "serving.breaker", backend="primary", state="closed"))
        if self.cache_from is not None and self.small_signal:
            at = self.cache_from + self.leak
            out.append(_killed(at, KILL_SMALL, "op-2", "small"))
            out.append(ev(at + 0.2, "detect.backend_down", backend="small", reason="health"))
        if self.routes:
            lower = "cache" if self.skip_small else "small"
            moves = [(t0 + 0.001, lower, "primary")]
            if self.cache_from is not None:
                moves.append((self.cache_from + 0.001, "cache", "small"))
            moves.append((self.back - 0.001, "primary", "cache" if self.cache_from is not None else lower))
            out += [ev(t, "serving.route", backend=b, previous=prev) for t, b, prev in moves]
        return out

    def _request(self, i: int, t: float) -> Event:
        backend = self.backend_at(t, i)
        lower = backend != "primary" and not backend.startswith("primary")
        ttft, gap = (self.ttft * self.slow, self.gap * self.slow) if lower else (self.ttft, self.gap)
        times = [t + ttft + k * gap for k in range(self.tokens)]
        backends, resumed, ended = [backend], False, "complete"
        status: int | str = 200  # a stream that does not complete: "error" or "timeout", as the generator records
        latency = times[-1] - t
        gaps = [gap] * (self.tokens - 1)
        first: float | None = ttft
        if self.with_fault and backend == "primary" and t < self.fault_at < times[-1]:  # open at the kill
            before = sum(x < self.fault_at for x in times)
            new = "cache" if self.skip_small else "small"
            if self.resume and before:
                backends, resumed = ["primary", new], True
                gaps = [gap] * (before - 1) + [gap + MIGRATION] + [gap] * (self.tokens - before)
                latency = ttft + sum(gaps)
            elif self.resume:  # retried before the first token: served by the new rung from the start
                backends, first = [new], self.fault_at + MIGRATION + ttft - t
                latency = first + sum(gaps)
            elif before:
                ended, status, gaps, latency = "cut", "error", [gap] * (before - 1), self.fault_at - t
            else:
                backends, first, ended, status, gaps, latency = [], None, "error", 502, [], self.fault_at - t
        elif lower and self.errors and t < self.fault_at + self.errors:
            backends, first, ended, status, gaps, latency = [], None, "error", 502, [], 0.05
        elif lower and self.no_first_token:
            backends, first, ended, status, gaps, latency = [], None, "timeout", "timeout", [], self.timeout
        elif lower and self.stall:
            ended, status, gaps, latency = "timeout", "timeout", [gap, gap], self.timeout
        tokens = 0 if first is None else len(gaps) + 1
        data: dict[str, Any] = {
            "i": i,
            "scheduled_ns": round(t * 1e9),
            "latency_s": latency,
            "status": status,
            "backend": backends[0] if backends else None,
            "degraded": backends[:1] == ["cache"],
            "priority": None,
            "send_lag_s": 0.0,
        }
        if self.stream:
            data.update(
                stream=True,
                ttft_s=first,
                gaps_s=gaps,
                tokens=tokens,
                backends=backends,
                resumed=resumed,
                session=None if self.sessions is None else f"s{i % self.sessions}",
            )
            if self.ended:
                data["ended"] = ended
        elif self.sessions is not None:
            data["session"] = f"s{i % self.sessions}"
        return ev(t + latency, "load.request", source="load", **data)

    # -- what the checks measure on it

    def cut(self) -> list[int]:
        """The requests the kill cut (without resume), by i."""
        return [e.get_int("i") or 0 for e in self.events() if e.kind == "load.request" and e.data.get("ended") == "cut"]

    def worst(self, field: str) -> float:
        """The largest TTFT (``ttft_s``) or gap (``gaps_s``) any stream recorded."""
        found: list[float] = []
        for e in self.events():
            value = e.data.get(field)
            found += value if isinstance(value, list) else [] if value is None else [value]
        return max(found, default=0.0)


def _killed(at: float, fault: str, op: str, replica: str) -> Event:
    """The runner's ``fault.applied`` of a ``kill`` of ``replica`` at ``at``."""
    return ev(at, "fault.applied", source="runner", fault=fault, op=op, injector="kill", host="local", replica=replica)


def scenario() -> Any:
    """A stand-in for a Scenario: the checks read only ``faults`` (name, duration) and ``target``."""
    faults = [SimpleNamespace(name=KILL, duration=None, params=None)]
    return SimpleNamespace(name="t", target=SimpleNamespace(type="http"), faults=faults)


def stream_runs() -> st.SearchStrategy[StreamRun]:
    """Kills at 3-6 s, the primary back 2-6 s later, traffic on it again after a 0.5-2 s hold."""

    @st.composite
    def build(draw: st.DrawFn) -> StreamRun:
        fault_at = draw(st.floats(3.0, 6.0))
        back_at = fault_at + draw(st.floats(3.0, 6.0))
        cache = draw(st.booleans())
        return StreamRun(
            rate=draw(st.sampled_from([5.0, 10.0])),
            fault_at=fault_at,
            back_at=back_at,
            hold=draw(st.floats(0.5, 2.0)),
            down_after=draw(st.floats(0.1, 3.0)),
            breaker=draw(st.booleans()),
            routes=draw(st.booleans()),
            cache_from=fault_at + draw(st.floats(1.0, 2.0)) if cache else None,
            tokens=draw(st.integers(10, 30)),
            ttft=draw(st.floats(0.05, 0.3)),
            gap=draw(st.floats(0.03, 0.1)),
            slow=draw(st.floats(1.0, 3.0)),
        )

    return build()


# ---------------------------------------------------------------------------------------------------------
# the cases: (events, params, scenario)


def case(run: StreamRun, **params: Any) -> tuple[list[Event], dict[str, Any], Any]:
    return run.events(), params, scenario()


def _quantile_bound(run: StreamRun) -> dict[str, Any]:
    return {"q": 1.0, "max": run.worst("ttft_s") + 0.001}


def _gap_bound(run: StreamRun) -> dict[str, Any]:
    return {"q": 1.0, "max": run.worst("gaps_s") + 0.001}


def _ladder(run: StreamRun, **extra: Any) -> tuple[list[Event], dict[str, Any], Any]:
    return case(run, rungs=RUNGS, up_after=run.hold, **extra)


def _alert(run: StreamRun, slack: float, **extra: Any) -> tuple[list[Event], dict[str, Any], Any]:
    """The alert at share 0.5 over a 1 s window, ``for`` = the fallback's length + ``slack``."""
    return case(run, max_share=0.5, over=1.0, **{"for": run.fallback_seconds() + slack}, **extra)


RUNS = stream_runs()
DURING = {"fault": KILL, "window": "during", "until": "serving.backend_up", "until_backend": "primary"}

Cases = tuple[Any, list[tuple[str, Any, str]]]


def _quantile_cases(
    bound: Callable[[StreamRun], dict[str, Any]],
    slower: tuple[str, float],
    times_out: tuple[str, dict[str, Any]],
    unmeasured: list[tuple[str, Any, str]],
) -> Cases:
    """A quantile-bound stream check: it passes at ``bound``; it fails when the lower rung is ``slower[1]`` s
    slower (``slower[0]`` names the case) and when its streams time out (``times_out``: the name, the run's
    changes); it is unknown in the ``unmeasured`` cases and when the fault never applied."""
    (slow_name, slow_by), (out_name, out_changes) = slower, times_out
    return (
        RUNS.map(lambda r: case(r, **bound(r))),
        [
            (slow_name, RUNS.map(lambda r: case(r.but(slow=r.slow + slow_by), **bound(r))), "fail"),
            (out_name, RUNS.map(lambda r: case(r.but(**out_changes), **bound(r))), "fail"),
            *unmeasured,
            (
                "the fault never applied",
                RUNS.map(lambda r: case(r.but(with_fault=False), **DURING, q=0.5, max=1.0)),
                "unknown",
            ),
        ],
    )


STREAMS: dict[str, Cases] = {
    "ttft_within": _quantile_cases(
        _quantile_bound,
        ("the lower rung answers slower than the bound", 10.0),
        (
            "the lower rung never sends a first token: streams time out (counted at the timeout)",
            {"no_first_token": True},
        ),
        [
            (
                "no stream got a first token in the window (every one failed before it)",
                RUNS.map(lambda r: case(r.but(errors=30.0, resume=False), **DURING, q=0.5, max=1.0)),
                "unknown",
            ),
            ("the requests are not streams", RUNS.map(lambda r: case(r.but(stream=False), q=0.5, max=1.0)), "unknown"),
        ],
    ),
    "inter_token_gap_within": _quantile_cases(
        _gap_bound,
        ("the lower rung streams tokens slower than the bound", 8.0),
        ("streams on the lower rung stall after 3 tokens and time out (the wait counts as a gap)", {"stall": True}),
        [
            (
                "every stream has one token: no gap to measure",
                RUNS.map(lambda r: case(r.but(tokens=1), q=0.5, max=1.0)),
                "unknown",
            )
        ],
    ),
    "streams_completed": (
        st.one_of(RUNS.map(lambda r: case(r, min_share=1.0)), RUNS.map(lambda r: case(r, **DURING, min_share=1.0))),
        [
            (
                "the gateway does not resume: the kill cuts the open streams",
                RUNS.map(lambda r: case(r.but(resume=False), **DURING, min_share=1.0)),
                "fail",
            ),
            (
                "resumed streams, but cut_ok_if_resumed is off",
                RUNS.map(lambda r: case(r, min_share=1.0, cut_ok_if_resumed=False)),
                "fail",
            ),
            (
                "streams sent during the failover fail before their first token",
                RUNS.map(lambda r: case(r.but(errors=1.0), **DURING, min_share=1.0)),
                "fail",
            ),
            (
                "streams on the lower rung stall and time out",
                RUNS.map(lambda r: case(r.but(stall=True), min_share=0.99)),
                "fail",
            ),
            ("no stream recorded how it ended", RUNS.map(lambda r: case(r.but(ended=False))), "unknown"),
            ("the requests are not streams", RUNS.map(lambda r: case(r.but(stream=False))), "unknown"),
            ("the fault never applied", RUNS.map(lambda r: case(r.but(with_fault=False), **DURING)), "unknown"),
        ],
    ),
    "session_affinity": (
        RUNS.map(lambda r: case(r)),
        [
            (
                "no affinity: a session's requests alternate between two healthy replicas",
                RUNS.map(lambda r: case(r.but(spread=True))),
                "fail",
            ),
            (
                "the gateway moved every session with no failure at all (nothing was killed, nothing went down)",
                RUNS.map(lambda r: case(r.but(with_fault=False, down_after=None, ups=False))),
                "fail",
            ),
            (
                "sessions return to their first backend although failback_ok is off",
                RUNS.map(lambda r: case(r, failback_ok=False)),
                "fail",
            ),
            ("no request names a session", RUNS.map(lambda r: case(r.but(sessions=None))), "unknown"),
        ],
    ),
    "fallback_ladder": (
        RUNS.map(_ladder),
        [
            (
                "the ladder moved down with no signal (nothing failed, nothing went down)",
                RUNS.map(lambda r: _ladder(r.but(with_fault=False))),
                "fail",
            ),
            (
                "the ladder skipped the small rung, which was healthy",
                RUNS.map(lambda r: _ladder(r.but(skip_small=True, cache_from=None))),
                "fail",
            ),
            (
                "the ladder moved from small to the cache with no signal about small",
                RUNS.filter(lambda r: r.cache_from is not None).map(lambda r: _ladder(r.but(small_signal=False))),
                "fail",
            ),
            (
                "the cache served while small went on serving, until small's signal within the grace",
                RUNS.filter(lambda r: r.cache_from is not None).map(lambda r: _ladder(r.but(leak=1.0, routes=False))),
                "fail",
            ),
            (
                "the ladder moved back up before the hysteresis",
                RUNS.map(lambda r: case(r, rungs=RUNGS, up_after=r.hold + 1.0)),
                "fail",
            ),
            (
                "the ladder moved back up though the big rung never recovered",
                RUNS.map(lambda r: _ladder(r.but(ups=False))),
                "fail",
            ),
            (
                "no request was served by a backend on the ladder",
                RUNS.map(lambda r: case(r, rungs=[{"backend": "a", "rung": "x"}, {"backend": "b", "rung": "y"}])),
                "unknown",
            ),
            (
                "the ladder never moved (no fault, no move)",
                RUNS.map(lambda r: _ladder(r.but(with_fault=False, fault_at=30.0, back_at=40.0, routes=False))),
                "unknown",
            ),
        ],
    ),
    "fallback_share_alert": (
        st.one_of(
            RUNS.map(lambda r: _alert(r, 1.5)),
            RUNS.map(lambda r: _alert(r, -1.5, expect="fire")),
        ),
        [
            ("expect quiet: the share stayed above the bound for `for`", RUNS.map(lambda r: _alert(r, -1.5)), "fail"),
            (
                "expect fire: the share fell back before `for`",
                RUNS.map(lambda r: _alert(r, 1.5, expect="fire")),
                "fail",
            ),
            (
                "the load is shorter than `for`: the alert could not have fired",
                RUNS.map(lambda r: case(r, max_share=0.5, over=1.0, **{"for": 60.0})),
                "unknown",
            ),
            (
                "no request was served",
                RUNS.map(lambda r: _alert(r.but(no_first_token=True, fault_at=0.0, back_at=30.0, resume=False), 1.5)),
                "unknown",
            ),
        ],
    ),
}
