"""Ladder checks: the gateway's fallback ladder (big model -> small model -> cached answer) and its alert.

- ``fallback_ladder``: the rung that served traffic over time (from the gateway's ``serving.route`` when it
  records them, else from the requests) moves down only on a configured signal about the rungs it leaves,
  and back up only ``up_after`` (the hysteresis) after the rung it returns to recovered.
- ``fallback_share_alert``: the textbook's rule made a check: the share of requests served below the top rung,
  over a sliding window, stayed above ``max_share`` for ``for`` (5 minutes by default), i.e. the alert would
  fire; ``expect: quiet`` fails when it would, ``expect: fire`` when it would not.

Rungs, routes and signals are read by :mod:`chaos.checks.serving.ladder`.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Literal

from pydantic import ConfigDict, Field, field_validator

from chaos.checks._evidence import capped, fmt_offset, fmt_seconds, seconds, verdict_of
from chaos.checks.base import CheckParams, CheckResult, register_check
from chaos.checks.serving import streams as st
from chaos.checks.serving.events import load_span
from chaos.checks.serving.ladder import (
    DEFAULT_DOWN_ON,
    DEFAULT_UP_ON,
    SIGNAL_SPEC,
    Ladder,
    Move,
    Rung,
    RungPoint,
    Signal,
    moves,
    request_points,
    route_points,
    signals,
    smoothed,
)
from chaos.history.timeline import History
from chaos.load.summary import request_events, scheduled_ns
from chaos.spec.serving import PRIMARY
from chaos.spec.units import Duration

if TYPE_CHECKING:
    from chaos.spec.scenario import Scenario

CHECK_LADDER = "fallback_ladder"
CHECK_ALERT = "fallback_share_alert"
LADDER_CHECKS = (CHECK_LADDER, CHECK_ALERT)
NEEDS_LOAD = "add a load: section (the open-loop load generator) to the scenario"
SHOWN = 5


def _specs(value: list[str]) -> list[str]:
    bad = [s for s in value if not SIGNAL_SPEC.match(s)]
    if bad:
        raise ValueError(f"not an event kind (optionally :state): {', '.join(map(repr, bad))}")
    return value


# ---------------------------------------------------------------------------------------------------------
# fallback_ladder


class LadderParams(CheckParams):
    """Parameters of ``fallback_ladder``."""

    rungs: list[Rung] = Field(
        min_length=2,
        description="backends and their rungs, top to bottom, e.g. [{backend: primary, rung: big}, "
        "{backend: small, rung: small}, {backend: cache, rung: cached}]",
    )
    down_on: list[str] = Field(
        default=list(DEFAULT_DOWN_ON),
        min_length=1,
        description="signals that justify a move down, each an event kind with an optional :state; "
        "load.request:failed is a request that failed (cut, error, timeout) on the rung left",
    )
    up_on: list[str] = Field(
        default=list(DEFAULT_UP_ON), min_length=1, description="signals that a rung recovered (for the hysteresis)"
    )
    up_after: Duration = Field(
        default=0.0, description="the hysteresis: a move up comes at least this long after the rung recovered"
    )
    grace: Duration = Field(
        default=5.0,
        description="a down signal up to this long after the move still justifies it (the gateway tries the "
        "higher rung first; its failures open the breaker and mark it down a moment later)",
    )
    slack: Duration = Field(default=0.05, description="clock tolerance between the gateway's and the client's events")
    min_run: int = Field(
        default=3,
        ge=1,
        description="requests: runs on one rung shorter than this are transition noise (see no_flapping)",
    )
    require_move: bool = Field(default=True, description="unknown when the ladder never moved (nothing was tested)")

    _down = field_validator("down_on")(_specs)
    _up = field_validator("up_on")(_specs)


_Signals = tuple[list[list[Signal]], list[list[Signal]]]
"""Per rung, its down signals and its recovery signals."""


def _since_up(ups: list[Signal], t: int) -> int | None:
    """The last recovery in ``ups`` at or before ``t``."""
    return max((s.ts_ns for s in ups if s.ts_ns <= t), default=None)


def _still_served(points: list[RungPoint], rung: int, lo_ns: int, hi_ns: int) -> RungPoint | None:
    """The first request sent in (lo, hi) that ``rung`` served to its user (None when there is none)."""
    return next((pt for pt in points if pt.rung == rung and lo_ns < pt.ts_ns < hi_ns and not st.failed(pt.event)), None)


def _judge_down(
    history: History,
    p: LadderParams,
    ladder: Ladder,
    move: Move,
    stay: int | None,
    signals_of: _Signals,
    points: list[RungPoint],
) -> tuple[str | None, str]:
    """(problem or None, evidence) of a move down: every rung left or skipped needs a down signal since it last
    recovered (the rung left: since traffic moved onto it), by the move + grace. A signal after the move
    justifies it only if the rung served no request sent between the move and the signal: a rung that went on
    serving was not what the move was for."""
    t = move.at.ts_ns
    limit = t + round(p.grace * 1e9)
    slack = round(p.slack * 1e9)
    found: list[str] = []
    downs, ups = signals_of
    for rung in range(move.before, move.after):
        floor = _since_up(ups[rung], t)
        if rung == move.before and stay is not None:
            floor = stay if floor is None else max(floor, stay)
        hit = next((s for s in downs[rung] if (floor is None or s.ts_ns > floor) and s.ts_ns <= limit), None)
        name = ladder.names[rung]
        what = f"moved down {ladder.names[move.before]} -> {ladder.names[move.after]} at {fmt_offset(history, t)}"
        if hit is None:
            since = "" if floor is None else f" since {fmt_offset(history, floor)}"
            problem = (
                f"{what} with no signal ({', '.join(p.down_on)}) about {name}"
                f" ({', '.join(ladder.backends(rung))}){since} up to {fmt_seconds(p.grace)} after the move"
            )
            return problem, problem
        served = _still_served(points, rung, t + slack, hit.ts_ns)
        if served is not None:
            problem = (
                f"{what}, while {name} went on serving (request {served.event.get_int('i')} sent at "
                f"{fmt_offset(history, served.ts_ns)}) until its signal at {fmt_offset(history, hit.ts_ns)}"
            )
            return problem, problem
        found.append(f"{name}: {hit.text}")
    return None, f"down {ladder.names[move.before]} -> {ladder.names[move.after]} at {fmt_offset(history, t)} on " + (
        "; ".join(found)
    )


def _judge_up(
    history: History, p: LadderParams, ladder: Ladder, move: Move, downs: list[list[Signal]], ups: list[list[Signal]]
) -> tuple[str | None, str]:
    """(problem or None, evidence) of a move up onto a rung: at least ``up_after`` after its first recovery
    following its last down signal (none: it was never signalled down)."""
    t = move.at.ts_ns
    slack = round(p.slack * 1e9)
    rung = move.after
    what = f"up {ladder.names[move.before]} -> {ladder.names[rung]} at {fmt_offset(history, t)}"
    down = max((s for s in downs[rung] if s.ts_ns <= t - slack), key=lambda s: s.ts_ns, default=None)
    if down is None:
        return None, f"{what}; {ladder.names[rung]} was never signalled down"
    back = next((s for s in ups[rung] if s.ts_ns >= down.ts_ns), None)
    if back is None or back.ts_ns > t + slack:
        problem = f"moved {what}, before {ladder.names[rung]} recovered ({', '.join(p.up_on)}) from {down.text}"
        return problem, problem
    waited = seconds(t - back.ts_ns)
    line = f"{what}, {fmt_seconds(max(waited, 0.0))} after {back.text}"
    if waited + p.slack < p.up_after:
        problem = f"moved {line}: sooner than the {fmt_seconds(p.up_after)} hysteresis"
        return problem, problem
    return None, line


@register_check(CHECK_LADDER, LadderParams, to_add=NEEDS_LOAD)
def fallback_ladder(history: History, p: LadderParams, scenario: Scenario) -> CheckResult:
    """the fallback ladder moves down only on a configured signal and back up only after the hysteresis

    The rung timeline: the gateway's ``serving.route`` events naming a ladder backend when there are any (its
    own record of where new requests go), else the served requests' rungs by sent time with runs under
    ``min_run`` dropped as noise. Each move down must have, for the rung it leaves (since traffic moved onto it)
    and every rung it skips (since it last recovered), a ``down_on`` signal at or before the move + ``grace``;
    each move up must come at least ``up_after`` after the first ``up_on`` signal of the rung it returns to
    that follows that rung's last down signal. Fails naming the offending moves; ``unknown`` when no request
    was served by a ladder backend, or (``require_move``) the ladder never moved."""
    verdict = verdict_of(CHECK_LADDER, bound=f"down on signal, up >= {fmt_seconds(p.up_after)} after recovery")
    ladder = Ladder.of(p.rungs)
    reqs = request_events(history.events)
    points = request_points(reqs, ladder)
    if not points:
        served = Counter(b for e in reqs if (b := st.served_by(e)) is not None)
        got = ", ".join(f"{b} x{n}" for b, n in served.most_common()) or "nothing"
        return verdict(
            status="unknown",
            reason=f"no request was served by a backend on the ladder ({', '.join(ladder.rung_of)}); served by: {got}",
        )
    routes = route_points(history, ladder)
    # the gateway records a route when it changes: before its first change, traffic was on the first request's rung
    timeline: list[RungPoint] = smoothed(points, p.min_run)
    if routes:
        timeline = ([points[0]] if points[0].ts_ns < routes[0].ts_ns else []) + routes
    source = "serving.route events" if routes else f"{len(points)} served request(s), runs under {p.min_run} dropped"
    shown = [f"{fmt_offset(history, pt.ts_ns)} {ladder.names[pt.rung]}" for pt in timeline]
    evidence = [f"rung timeline from {source}: {', '.join(shown[:40])}" + (" ..." if len(shown) > 40 else "")]
    found = moves(timeline)
    if not found and p.require_move:
        return verdict(
            status="unknown",
            evidence=evidence,
            reason=f"the ladder never moved: traffic stayed on {ladder.names[timeline[0].rung]}, nothing was tested",
        )
    downs = signals(history, ladder, p.down_on, reqs)
    ups = signals(history, ladder, p.up_on, reqs)
    problems: list[str] = []
    stay: list[int | None] = [None] * len(ladder.names)  # when traffic last moved onto each rung
    for move in found:
        if move.down:
            problem, line = _judge_down(history, p, ladder, move, stay[move.before], (downs, ups), points)
        else:
            problem, line = _judge_up(history, p, ladder, move, downs, ups)
        stay[move.after] = move.at.ts_ns
        evidence.append(line)
        if problem is not None:
            problems.append(problem)
    reason = "; ".join(problems[:SHOWN]) if problems else f"{len(found)} move(s), each on its signal"
    return verdict(
        status="fail" if problems else "pass",
        measured=float(len(problems)),
        unit=" bad moves",
        evidence=capped(evidence),
        reason=reason + (f"; and {len(problems) - SHOWN} more" if len(problems) > SHOWN else ""),
    )


# ---------------------------------------------------------------------------------------------------------
# fallback_share_alert


class AlertParams(CheckParams):
    """Parameters of ``fallback_share_alert``."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    max_share: float = Field(ge=0, lt=1, description="the alert's bound on the share served below the top rung")
    for_: Duration = Field(
        default=300.0, alias="for", gt=0, description="how long the share must stay above max_share to fire (5m)"
    )
    over: Duration = Field(default=60.0, gt=0, description="the sliding window the share is measured over")
    expect: Literal["quiet", "fire"] = Field(
        default="quiet", description="quiet: fail when the alert would fire; fire: fail when it would not"
    )
    top: list[str] = Field(
        default=[PRIMARY], min_length=1, description="backends of the top rung (any other backend is a fallback)"
    )


def _stretches(times: list[int], below: list[bool], over: int, bound: float) -> list[tuple[int, int, float]]:
    """(first, last, peak share) of each run of request times at which the share of ``below`` over the window
    ``(t - over, t]`` was above ``bound``; a time with no other request in its window before it (a gap in the
    traffic longer than the window) resets a run, as an alert's ``for`` resets on missing data."""
    found: list[tuple[int, int, float]] = []
    lo = count = 0
    run: tuple[int, int, float] | None = None
    for k, t in enumerate(times):
        count += below[k]
        while times[lo] <= t - over:
            count -= below[lo]
            lo += 1
        share = count / (k - lo + 1)
        gap = k > 0 and t - times[k - 1] >= over
        if run is not None and (share <= bound or gap):
            found.append(run)
            run = None
        if share > bound:
            run = (t, t, share) if run is None else (run[0], t, max(run[2], share))
    if run is not None:
        found.append(run)
    return found


@register_check(CHECK_ALERT, AlertParams, to_add=NEEDS_LOAD)
def fallback_share_alert(history: History, p: AlertParams, scenario: Scenario) -> CheckResult:
    """the share served below the top rung stays above max_share for `for` (the alert fires) or not

    At each served request (scheduled time t), the share of the served requests in ``(t - over, t]`` that a
    backend other than ``top`` served; a stretch is a run of requests at which that share was above
    ``max_share`` (a gap in traffic longer than ``over`` ends it) and lasts from its first request to its last.
    The alert fires when a stretch lasts ``for`` or longer. ``expect: quiet`` fails when it would fire,
    ``expect: fire`` when it would not. ``unknown`` when no request was served, or the served requests span
    less than ``for`` (the alert could not have fired)."""
    rule = f"share > {p.max_share:g} for {fmt_seconds(p.for_)}"
    verdict = verdict_of(CHECK_ALERT, bound=f"{rule}: {p.expect}", unit="s")
    served = sorted(
        ((scheduled_ns(e), b) for e in request_events(history.events) if (b := st.served_by(e)) is not None),
        key=lambda pair: pair[0],
    )
    if not served:
        return verdict(status="unknown", reason="no request was served (none answered with a backend)")
    times = [t for t, _ in served]
    span = load_span(history.events)
    lo, hi = span if span is not None else (times[0], times[-1])
    evidence = [
        f"{len(served)} served request(s) {fmt_offset(history, times[0])}..{fmt_offset(history, times[-1])}; "
        f"share below {'/'.join(p.top)} over a sliding {fmt_seconds(p.over)} window at each request",
    ]
    if seconds(times[-1] - times[0]) < p.for_:
        return verdict(
            status="unknown",
            evidence=evidence,
            reason=f"the served requests span {fmt_seconds(seconds(times[-1] - times[0]))}, less than "
            f"for ({fmt_seconds(p.for_)}): the alert could not have fired",
        )
    runs = _stretches(times, [b not in p.top for _, b in served], round(p.over * 1e9), p.max_share)
    runs.sort(key=lambda r: (r[0] - r[1], r[0]))
    evidence += [
        f"above {p.max_share:g}: {fmt_offset(history, a)}..{fmt_offset(history, b)} "
        f"({fmt_seconds(seconds(b - a))}, peak {peak:.3g})"
        for a, b, peak in runs[:SHOWN]
    ]
    longest = seconds(runs[0][1] - runs[0][0]) if runs else 0.0
    fires = longest >= p.for_
    if fires:
        evidence.append(f"the alert would fire at {fmt_offset(history, runs[0][0] + round(p.for_ * 1e9))}")
    load_text = f"load {fmt_offset(history, lo)}..{fmt_offset(history, hi)}"
    what = (
        f"the fallback share stayed above {p.max_share:g} for {fmt_seconds(longest)} at most ({load_text})"
        if runs
        else f"the fallback share never rose above {p.max_share:g} ({load_text})"
    )
    ok = fires == (p.expect == "fire")
    tail = "" if ok else ("; the alert would fire" if fires else f"; the alert would not fire ({rule})")
    return verdict(status="pass" if ok else "fail", measured=longest, evidence=evidence, reason=what + tail)
