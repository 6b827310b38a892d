"""Serving checks: what clients of a model-serving stack saw while faults hit it.

The evidence is the load generator's ``load.request`` events (one per request: scheduled send time, status,
latency, the backend that served it, its priority) next to the faults and the serving stack's own events
(``detect.backend_down``, ``serving.backend_up``, ``serving.replica_start``, ``detect.wrong_answer``).
Windowed checks (``error_rate``, ``latency``, ``fallback_share``, ``no_flapping``, ``priority_preserved``)
share :class:`~chaos.checks.serving.windows.WindowParams`; a window without requests is ``unknown``.

- ``error_rate``: share of non-ok requests (ok: HTTP 200-399) in a window.
- ``latency``: a latency quantile in a window; timeouts count at their latency (the timeout, a lower bound).
- ``failover_within``: from each apply to the first ok request served by another backend than the primary.
- ``fallback_share``: share of the ok requests served by non-primary backends in a window.
- ``failback_within``: from the fault's end (or the primary's return) until traffic is back on the primary.
- ``no_flapping``: backend switches in the ok-request sequence, and failback hysteresis on the reference stack.
- ``wrong_answers_detected``: an in-job corruption of a replica is caught by the correctness probe in time.
- ``priority_preserved``: a priority's error rate while other priorities were shed.
"""

from __future__ import annotations

from functools import partial
from math import ceil
from typing import TYPE_CHECKING

from pydantic import Field, model_validator

from chaos.checks._evidence import (
    Verdict,
    at_most,
    capped,
    fmt_offset,
    fmt_seconds,
    missing_fault_reason,
    seconds,
    verdict_of,
)
from chaos.checks.base import CheckParams, CheckResult, register_check
from chaos.checks.latency import judge_op_times, latency_verdict
from chaos.checks.serving import events as ev
from chaos.checks.serving import measures
from chaos.checks.serving.windows import Window, WindowParams, resolve_window
from chaos.event_kinds import FAULT_APPLIED
from chaos.history.timeline import Event, History
from chaos.load.summary import is_ok, latency_s, request_events, responded, scheduled_ns, status_of
from chaos.spec.serving import PRIMARY
from chaos.spec.units import Duration

if TYPE_CHECKING:
    from chaos.spec.scenario import Scenario

CHECK_ERROR_RATE = "error_rate"
CHECK_LATENCY = "latency"
CHECK_FAILOVER = "failover_within"
CHECK_FALLBACK_SHARE = "fallback_share"
CHECK_FAILBACK = "failback_within"
CHECK_NO_FLAPPING = "no_flapping"
CHECK_WRONG_ANSWERS = "wrong_answers_detected"
CHECK_PRIORITY = "priority_preserved"
SERVING_CHECKS = (
    CHECK_ERROR_RATE,
    CHECK_LATENCY,
    CHECK_FAILOVER,
    CHECK_FALLBACK_SHARE,
    CHECK_FAILBACK,
    CHECK_NO_FLAPPING,
    CHECK_WRONG_ANSWERS,
    CHECK_PRIORITY,
)
SHOWN = 5  # example requests cited per problem
NEEDS_LOAD = "add a load: section (the open-loop load generator) to the scenario"
"""What gives a check of the load generator's requests its evidence (its ``to_add``)."""


def _ratio(value: float) -> str:
    return f"{value:.4f}".rstrip("0").rstrip(".") if value else "0"


def _in_window(
    history: History, scenario: Scenario, p: WindowParams, verdict: Verdict, priority: str | None = None
) -> tuple[Window, list[Event]] | CheckResult:
    """The window's requests (of ``priority`` when given), or an ``unknown`` verdict saying why there are none."""
    window = resolve_window(history, scenario, p)
    if not isinstance(window, Window):
        return verdict(status="unknown", reason=window.reason, evidence=list(window.evidence))
    reqs = window.select(request_events(history.events))
    if priority is not None:
        reqs = [e for e in reqs if ev.priority_of(e) == priority]
    if not reqs:
        of = "" if priority is None else f" of priority {priority!r}"
        return verdict(
            status="unknown", reason=f"no requests{of} scheduled in {window.text}", evidence=list(window.evidence)
        )
    return window, reqs


def _bound_or_unknown(
    history: History, fault: str, ops: list[Event], within: float | None, verdict: Verdict
) -> float | CheckResult:
    """The time bound ``within`` to judge the fault's ``ops`` against; ``unknown`` instead when the fault never
    applied (no ``ops``) or no bound is known (not set, and the target is not the reference stack that would
    supply a default)."""
    if not ops:
        return verdict(status="unknown", reason=missing_fault_reason(history, fault))
    if within is None:
        return verdict(status="unknown", reason="within is not set and the target is not the reference serving stack")
    return within


# ---------------------------------------------------------------------------------------------------------
# error_rate


class ErrorRateParams(WindowParams):
    """Parameters of ``error_rate``."""

    max: float = Field(ge=0, le=1, description="largest allowed share of non-ok requests (ok: HTTP 200-399)")
    priority: str | None = Field(default=None, description="count only requests of this priority (null: all)")


@register_check(CHECK_ERROR_RATE, ErrorRateParams, to_add=NEEDS_LOAD)
def error_rate(history: History, p: ErrorRateParams, scenario: Scenario) -> CheckResult:
    """share of non-ok requests in a window is at most max

    Share of the window's requests that were not ok: any 4xx/5xx, ``timeout``, ``error``, ``dropped_client``
    (the generator had too many in flight) or ``cancelled``, over all requests scheduled in the window.
    ``unknown`` when the fault never applied or the window holds no requests."""
    verdict = verdict_of(CHECK_ERROR_RATE, p.fault, bound=f"<= {p.max:g}")
    got = _in_window(history, scenario, p, verdict, p.priority)
    if isinstance(got, CheckResult):
        return got
    window, reqs = got
    bad = [e for e in reqs if not is_ok(e)]
    rate = len(bad) / len(reqs)
    evidence = [
        *window.evidence,
        f"{len(reqs)} request(s) in {window.text}, {len(bad)} not ok; outcomes: {ev.status_counts(reqs)}",
        *(ev.describe_request(history, e) for e in bad[:SHOWN]),
    ]
    reason = f"error rate {_ratio(rate)} ({len(bad)}/{len(reqs)}) in {window.text}"
    return at_most(verdict, rate, p.max, reason, f"{p.max:g} bound", capped(evidence))


# ---------------------------------------------------------------------------------------------------------
# latency


class LatencyParams(WindowParams):
    """Parameters of ``latency``."""

    q: float = Field(gt=0, le=1, description="quantile in (0, 1], e.g. 0.99 for p99 (nearest rank, no interpolation)")
    max: Duration = Field(description="largest allowed latency at that quantile (e.g. 250ms)")
    priority: str | None = Field(default=None, description="count only requests of this priority (null: all)")


@register_check(CHECK_LATENCY, LatencyParams, to_add=NEEDS_LOAD)
def latency(history: History, p: LatencyParams, scenario: Scenario) -> CheckResult:
    """a latency quantile of the requests in a window is at most max

    Nearest-rank ``q`` quantile of latency (seconds from the scheduled send) over the window's requests that
    got an HTTP answer (any status) or timed out; a timeout counts at its recorded latency, the timeout, so a
    stack that stops answering cannot look fast. Connection errors, client drops and cancellations have no
    latency and are left out (``error_rate`` judges them). ``unknown`` when no request has a latency."""
    bound = f"p{p.q * 100:g} <= {fmt_seconds(p.max)}"
    verdict = verdict_of(CHECK_LATENCY, p.fault, bound=bound, unit="s")
    got = _in_window(history, scenario, p, verdict, p.priority)
    if isinstance(got, CheckResult):
        return got
    window, reqs = got
    timed = sorted(
        (
            (value, e)
            for e in reqs
            if (value := latency_s(e)) is not None and (responded(e) or status_of(e) == "timeout")
        ),
        key=lambda pair: (pair[0], scheduled_ns(pair[1])),
    )
    left_out = len(reqs) - len(timed)
    if not timed:
        return verdict(
            status="unknown",
            evidence=[*window.evidence, f"outcomes: {ev.status_counts(reqs)}"],
            reason=f"none of the {len(reqs)} request(s) in {window.text} has a latency (no answer, no timeout)",
        )
    value, at = timed[max(1, ceil(p.q * len(timed))) - 1]
    timeouts = sum(status_of(e) == "timeout" for _, e in timed)
    evidence = [
        *window.evidence,
        f"{len(timed)} latencies in {window.text} ({timeouts} timeouts at the timeout; {left_out} without latency)",
        f"at the quantile: {ev.describe_request(history, at)}, {fmt_seconds(value)}",
        f"slowest: {ev.describe_request(history, timed[-1][1])}, {fmt_seconds(timed[-1][0])}",
    ]
    reason = f"p{p.q * 100:g} latency {fmt_seconds(value)} over {len(timed)} request(s) in {window.text}"
    return at_most(verdict, value, p.max, reason, f"{fmt_seconds(p.max)} bound", evidence)


# ---------------------------------------------------------------------------------------------------------
# failover_within


class FailoverParams(CheckParams):
    """Parameters of ``failover_within``."""

    fault: str = Field(description="the fault that takes the primary out")
    within: Duration | None = Field(
        default=None,
        description="largest allowed time from the apply to the first ok non-primary answer; "
        "default on the reference stack: its failover_bound(), elsewhere required",
    )
    primary: str = Field(default=PRIMARY, description="the backend traffic fails over from")
    to: list[str] | None = Field(
        default=None, min_length=1, description="backends that count as a failover target (null: any but primary)"
    )


@register_check(CHECK_FAILOVER, FailoverParams)
def failover_within(history: History, p: FailoverParams, scenario: Scenario) -> CheckResult:
    """after each apply of a fault, an ok request is served by a non-primary backend within a time bound

    Worst failover time over the fault's applied ops: for an op applied at T, the scheduled time of the
    first ok request scheduled at or after T that a backend other than ``primary`` (one of ``to`` when set)
    served, minus T. ``fail`` when some op has requests after it but no such answer (the evidence says what
    the clients got instead) or the worst time is over ``within``; ``unknown`` when the fault never applied,
    no requests were sent after it, no bound is known, or the primary did not serve the traffic just before
    an apply (under 90% of the last 20 ok requests answered 1 s or more before it,
    :func:`~chaos.checks.serving.measures.primary_before`)."""
    target = measures.reference_target(scenario)
    within = p.within if p.within is not None else (None if target is None else target.failover_bound())
    verdict = latency_verdict(CHECK_FAILOVER, p.fault, within)
    bound = _bound_or_unknown(history, p.fault, ev.applied_ops(history, p.fault), within, verdict)
    if isinstance(bound, CheckResult):
        return bound
    times = measures.failover_times(history, p.fault, primary=p.primary, to=p.to, horizon=bound)
    return judge_op_times(history, "failover", times, bound, p.fault, verdict)


# ---------------------------------------------------------------------------------------------------------
# fallback_share


class FallbackShareParams(WindowParams):
    """Parameters of ``fallback_share``."""

    min: float | None = Field(default=None, ge=0, le=1, description="smallest allowed share (null: no lower bound)")
    max: float | None = Field(default=None, ge=0, le=1, description="largest allowed share (null: no upper bound)")
    primary: str = Field(default=PRIMARY, description="the backend that does not count as fallback")
    to: list[str] | None = Field(
        default=None, min_length=1, description="backends that count as fallback (null: any but primary)"
    )

    @model_validator(mode="after")
    def _bounds(self) -> FallbackShareParams:
        # "Neither bound" is judged unknown, not rejected here: the scenario model builds Params() as the
        # default of a check whose params are all optional, so this model must validate empty.
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min ({self.min}) is above max ({self.max})")
        return self


@register_check(CHECK_FALLBACK_SHARE, FallbackShareParams)
def fallback_share(history: History, p: FallbackShareParams, scenario: Scenario) -> CheckResult:
    """the share of ok requests served by fallback backends in a window lies within [min, max]

    Share of the window's ok requests that name their backend which a fallback served (any backend but
    ``primary``, or one of ``to``). Failed requests and answers without a backend are left out, so this
    measures where answers came from, not whether they came. ``unknown`` when there is no such request, or
    neither ``min`` nor ``max`` is given."""
    bound = " and ".join(
        part
        for part in (None if p.min is None else f">= {p.min:g}", None if p.max is None else f"<= {p.max:g}")
        if part
    )
    verdict = verdict_of(CHECK_FALLBACK_SHARE, p.fault, bound=bound)
    if not bound:
        return verdict(status="unknown", bound="-", reason="no bound to hold the share to: give min, max or both")
    got = _in_window(history, scenario, p, verdict)
    if isinstance(got, CheckResult):
        return got
    window, reqs = got
    served = [e for e in reqs if is_ok(e) and ev.backend_of(e) is not None]
    if not served:
        return verdict(
            status="unknown",
            evidence=[*window.evidence, f"outcomes: {ev.status_counts(reqs)}"],
            reason=f"no ok request naming its backend in {window.text}",
        )
    fallback = [e for e in served if ev.backend_of(e) != p.primary and (p.to is None or ev.backend_of(e) in p.to)]
    share = len(fallback) / len(served)
    low = p.min is not None and share < p.min
    high = p.max is not None and share > p.max
    return verdict(
        status="fail" if low or high else "pass",
        measured=share,
        evidence=[*window.evidence, f"{len(served)} ok request(s) in {window.text}: {ev.backend_counts(served)}"],
        reason=f"fallback share {_ratio(share)} ({len(fallback)}/{len(served)}) in {window.text}"
        + (f", under {p.min:g}" if low else "")
        + (f", over {p.max:g}" if high else ""),
    )


# ---------------------------------------------------------------------------------------------------------
# failback_within


class FailbackParams(CheckParams):
    """Parameters of ``failback_within``."""

    fault: str = Field(description="the fault that took the primary out")
    within: Duration = Field(description="largest allowed time from the reference point until traffic is back")
    since: measures.FailbackSince | None = Field(
        default=None,
        description="reference point: end (the fault's heal or duration), replica_start or backend_up (the "
        "primary's first after the apply); null: end when known, else the primary's replica_start",
    )
    primary: str = Field(default=PRIMARY, description="the backend traffic must come back to")
    confirm: int = Field(default=10, ge=1, description="ok requests from the failback on that must mostly be primary")
    min_share: float = Field(default=0.9, gt=0, le=1, description="share of those confirm requests served by primary")


@register_check(CHECK_FAILBACK, FailbackParams)
def failback_within(history: History, p: FailbackParams, scenario: Scenario) -> CheckResult:
    """after a fault ends, traffic is back on the primary backend within a time bound

    Worst failback time over the fault's applied ops: from the reference point R (``since``) to the first
    ok primary-served request scheduled at or after R from which at least ``min_share`` of the next ``confirm``
    ok requests were served by the primary (a stray answer amid fallbacks is not a failback). ``fail`` when
    traffic never comes back or is too slow; ``unknown`` when the fault never applied, R is missing (no heal,
    no replica_start ...), no requests came after R, or traffic never left the primary (nothing to fail back)."""
    verdict = latency_verdict(CHECK_FAILBACK, p.fault, p.within)
    bound = _bound_or_unknown(history, p.fault, ev.applied_ops(history, p.fault), p.within, verdict)
    if isinstance(bound, CheckResult):
        return bound
    times = measures.failback_times(
        history, scenario, p.fault, since=p.since, primary=p.primary, confirm=p.confirm, min_share=p.min_share
    )
    return judge_op_times(history, "failback", times, p.within, p.fault, verdict)


# ---------------------------------------------------------------------------------------------------------
# no_flapping


class NoFlappingParams(WindowParams):
    """Parameters of ``no_flapping``."""

    max_switches: int | None = Field(
        default=None, ge=0, description="most backend switches allowed (null: 2 per applied fault op, over and back)"
    )
    min_run: int = Field(
        default=3,
        ge=1,
        description="runs of fewer ok requests on one backend are transition noise, not a switch, unless more "
        "than min_run of them come in a row (traffic going back and forth: flapping)",
    )
    primary: str = Field(default=PRIMARY, description="the backend whose failback hysteresis is checked")
    slack: Duration = Field(default=0.05, description="clock tolerance between the gateway's and the client's events")


@register_check(CHECK_NO_FLAPPING, NoFlappingParams, to_add=NEEDS_LOAD)
def no_flapping(history: History, p: NoFlappingParams, scenario: Scenario) -> CheckResult:
    """traffic switches backends at most max_switches times, and fails back only after the hysteresis

    Backend switches in the window: the backends of its ok requests in scheduled order, runs shorter than
    ``min_run`` dropped (concurrent requests interleave at a transition) unless more than ``min_run`` such
    runs come in a row (alternating request by request is flapping), counted where the backend changes.
    On the reference stack, every ``serving.backend_up`` of the primary that follows its ``detect.backend_down``
    and a ``serving.replica_start`` is also held to the hysteresis: no ok primary answer sent (scheduled +
    send lag) between the down and replica_start + (success_threshold - 1) x probe interval + failback_hold.
    ``unknown`` when the window holds fewer than two ok requests naming their backend."""
    applied = ev.events_of(history, FAULT_APPLIED)
    limit = 2 * len(applied) if p.max_switches is None else p.max_switches
    verdict = verdict_of(CHECK_NO_FLAPPING, p.fault, bound=f"<= {limit} switches", unit=" switches")
    got = _in_window(history, scenario, p, verdict)
    if isinstance(got, CheckResult):
        return got
    window, reqs = got
    served = [e for e in reqs if is_ok(e) and ev.backend_of(e) is not None]
    if len(served) < 2:
        return verdict(status="unknown", reason=f"fewer than 2 ok requests naming their backend in {window.text}")
    switches = measures.backend_switches(served, min_run=p.min_run)
    evidence = [
        *window.evidence,
        f"{len(served)} ok request(s) in {window.text}; runs under {p.min_run} ignored",
        *(f"{s.before} -> {s.after}: {ev.describe_request(history, s.at)}" for s in switches),
    ]
    problems = [] if len(switches) <= limit else [f"{len(switches)} backend switches, over the {limit} allowed"]
    target = measures.reference_target(scenario)
    if target is not None:
        needed = (target.probes.success_threshold - 1) * target.probes.interval + target.failback_hold
        early, lines = measures.early_failbacks(history, served, p.primary, needed, p.slack)
        problems += early
        evidence += lines
    return verdict(
        status="fail" if problems else "pass",
        measured=float(len(switches)),
        evidence=capped(evidence),
        reason="; ".join(problems) or f"{len(switches)} backend switch(es) in {window.text}, within {limit}",
    )


# ---------------------------------------------------------------------------------------------------------
# wrong_answers_detected


class WrongAnswersParams(CheckParams):
    """Parameters of ``wrong_answers_detected``."""

    fault: str = Field(description="the in-job fault that corrupts a replica (e.g. a weight bitflip)")
    backend: str = Field(default=PRIMARY, description="the backend the fault corrupts")
    within: Duration | None = Field(
        default=None,
        description="largest allowed time from the apply to the detection; default on the reference stack: "
        "correctness.interval x 2 + probes.timeout, elsewhere required",
    )
    max_wrong: int | None = Field(
        default=None, ge=0, description="most ok answers the backend may serve before detection (null: report only)"
    )


@register_check(CHECK_WRONG_ANSWERS, WrongAnswersParams)
def wrong_answers_detected(history: History, p: WrongAnswersParams, scenario: Scenario) -> CheckResult:
    """a corrupted replica is caught by the correctness probe in time; answers exposed before are counted

    For each apply of the fault: the first ``detect.wrong_answer`` (or ``detect.backend_down`` with reason
    ``correctness``) naming ``backend`` strictly after it must come within ``within``. Measured: the most ok
    answers ``backend`` served between an apply and its detection (scheduled in that interval), i.e. clients
    exposed to possibly wrong numbers; held to ``max_wrong`` when set. ``unknown`` when the fault never fired,
    no bound is known, or (with ``max_wrong``) no requests were recorded."""
    target = measures.reference_target(scenario)
    within = p.within
    if within is None and target is not None:
        within = target.correctness.interval * 2 + target.probes.timeout
    bound = "-" if within is None else f"detected within {fmt_seconds(within)}"
    if p.max_wrong is not None:
        bound += f", <= {p.max_wrong} answers exposed"
    verdict = verdict_of(CHECK_WRONG_ANSWERS, p.fault, bound=bound, unit=" answers")
    ops = ev.applied_ops(history, p.fault)
    limit = _bound_or_unknown(history, p.fault, ops, within, verdict)
    if isinstance(limit, CheckResult):
        return limit
    detections = [e for e in ev.events_of(history, "detect.*") if measures.is_wrong_answer_detection(e, p.backend)]
    reqs = request_events(history.events)
    span = ev.load_span(history.events)
    evidence: list[str] = []
    problems: list[str] = []
    exposed_most: int | None = None
    for op in ops:
        found = next((e for e in detections if e.ts_ns > op.ts_ns), None)
        evidence.append(ev.describe_serving(history, op))
        if found is None:
            problems.append(
                f"no wrong-answer detection of {p.backend} after the apply at {fmt_offset(history, op.ts_ns)}"
            )
        else:
            taken = seconds(found.ts_ns - op.ts_ns)
            evidence.append(ev.describe_serving(history, found, f"{fmt_seconds(taken)} after the apply"))
            if taken > limit:
                problems.append(f"detection took {fmt_seconds(taken)}, over the {fmt_seconds(limit)} bound")
        if span is not None:
            exposed = measures.served_between(reqs, p.backend, op.ts_ns, span[1] if found is None else found.ts_ns)
            evidence.append(f"{len(exposed)} ok answer(s) from {p.backend} before the detection")
            exposed_most = max(exposed_most or 0, len(exposed))
    if p.max_wrong is not None and exposed_most is not None and exposed_most > p.max_wrong:
        problems.append(f"{exposed_most} answers exposed before detection, over {p.max_wrong}")
    verdict = partial(
        verdict, evidence=capped(evidence), measured=None if exposed_most is None else float(exposed_most)
    )
    if problems:
        return verdict(status="fail", reason="; ".join(problems))
    if p.max_wrong is not None and exposed_most is None:
        return verdict(status="unknown", reason="detected in time, but no load.request events to count exposed answers")
    exposed_text = "" if exposed_most is None else f"; at most {exposed_most} answer(s) exposed"
    return verdict(status="pass", reason=f"all {len(ops)} op(s) of {p.fault!r} detected in time{exposed_text}")


# ---------------------------------------------------------------------------------------------------------
# priority_preserved


class PriorityParams(WindowParams):
    """Parameters of ``priority_preserved``."""

    priority: str = Field(default="premium", description="the priority that must keep being served")
    max_error_rate: float = Field(default=0.01, ge=0, le=1, description="largest allowed error rate of that priority")
    require_shedding: bool = Field(
        default=True, description="unknown unless other priorities were shed in the window (the test really bit)"
    )
    shed_statuses: list[int] = Field(
        default=[503], min_length=1, description="HTTP statuses that mean shed (a gateway-served answer always does)"
    )


@register_check(
    CHECK_PRIORITY,
    PriorityParams,
    to_add="add a load: section with priorities (load.priorities) to the scenario",
)
def priority_preserved(history: History, p: PriorityParams, scenario: Scenario) -> CheckResult:
    """while other priorities are shed, a priority's error rate in a window stays at most max_error_rate

    Error rate (as in ``error_rate``) of the window's ``priority`` requests. With ``require_shedding``
    (default) the verdict is ``unknown`` unless some request of another priority was shed in the window (a
    ``shed_statuses`` status or an answer from ``gateway``): without shedding, preserving a priority was never
    put to the test. ``unknown`` also when the window holds no request of ``priority``."""
    verdict = verdict_of(CHECK_PRIORITY, p.fault, bound=f"<= {p.max_error_rate:g}")
    got = _in_window(history, scenario, p, verdict)
    if isinstance(got, CheckResult):
        return got
    window, reqs = got
    mine = [e for e in reqs if ev.priority_of(e) == p.priority]
    others = [e for e in reqs if ev.priority_of(e) != p.priority]
    shed = [e for e in others if ev.is_shed(e, p.shed_statuses)]
    evidence = [
        *window.evidence,
        f"{len(others)} other request(s), {len(shed)} shed: {ev.status_counts(others)}",
        *(ev.describe_request(history, e) for e in shed[:1]),
    ]
    if not mine:
        return verdict(status="unknown", evidence=evidence, reason=f"no {p.priority!r} requests in {window.text}")
    bad = [e for e in mine if not is_ok(e)]
    rate = len(bad) / len(mine)
    evidence += [
        f"{len(mine)} {p.priority} request(s), {len(bad)} not ok: {ev.status_counts(mine)}",
        *(ev.describe_request(history, e) for e in bad[:SHOWN]),
    ]
    verdict = partial(verdict, measured=rate, evidence=capped(evidence))
    what = f"{p.priority} error rate {_ratio(rate)} ({len(bad)}/{len(mine)}) in {window.text}"
    if rate > p.max_error_rate:
        return verdict(status="fail", reason=f"{what}, over the {p.max_error_rate:g} bound")
    if p.require_shedding and not shed:
        return verdict(
            status="unknown",
            reason=f"{what}, but no other-priority request was shed there: the load never forced a choice",
        )
    return verdict(status="pass", reason=f"{what} while {len(shed)} other request(s) were shed")
