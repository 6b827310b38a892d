"""Request-level measures of a load run, shared by the serving checks and the serving report.

Everything here is a pure function of events; request sequences are sorted by scheduled send time. Per applied
op as an :class:`OpTime`: :func:`failover_times` (apply -> first ok non-primary answer) and
:func:`failback_times` (reference point -> traffic back on the primary); over a request sequence:
:func:`backend_switches`; on the reference stack: :func:`early_failbacks` (failback hysteresis).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from chaos.checks._evidence import fmt_offset, fmt_seconds, seconds
from chaos.checks.serving.events import (
    FaultSpan,
    applied_ops,
    backend_counts,
    backend_of,
    describe_request,
    describe_serving,
    events_of,
    fault_spans,
    names_backend,
    status_counts,
)
from chaos.event_kinds import DETECT_BACKEND_DOWN as BACKEND_DOWN
from chaos.event_kinds import DETECT_WRONG_ANSWER
from chaos.event_kinds import SERVING_BACKEND_UP as BACKEND_UP
from chaos.event_kinds import SERVING_REPLICA_START as REPLICA_START
from chaos.history.timeline import Event, History
from chaos.load.summary import is_ok, latency_s, request_events, scheduled_ns
from chaos.spec.serving import PRIMARY, ServingTarget

if TYPE_CHECKING:
    from chaos.spec.scenario import Scenario


# ---------------------------------------------------------------------------------------------------------
# measures over requests (sorted by scheduled time)


def first_failover(
    reqs: Sequence[Event], applied_ns: int, *, primary: str = PRIMARY, to: Sequence[str] | None = None
) -> Event | None:
    """The first ok request scheduled at or after ``applied_ns`` served by a backend other than ``primary``
    (and among ``to`` when given)."""
    for e in reqs:
        if scheduled_ns(e) < applied_ns or not is_ok(e):
            continue
        backend = backend_of(e)
        if backend is not None and backend != primary and (to is None or backend in to):
            return e
    return None


def first_failback(
    reqs: Sequence[Event], since_ns: int, *, primary: str = PRIMARY, confirm: int = 10, min_share: float = 0.9
) -> Event | None:
    """The first ok request R scheduled at or after ``since_ns`` served by ``primary`` such that at least
    ``min_share`` of the ``confirm`` ok requests from R on (fewer when the load ends first) were served by
    ``primary``: traffic is back on the primary, not one stray request in a run of fallbacks."""
    served = [e for e in reqs if scheduled_ns(e) >= since_ns and is_ok(e) and backend_of(e) is not None]
    on_primary = [backend_of(e) == primary for e in served]
    prefix = [0]
    for flag in on_primary:
        prefix.append(prefix[-1] + flag)
    for k, flag in enumerate(on_primary):
        if not flag:
            continue
        stop = min(len(served), k + confirm)
        if prefix[stop] - prefix[k] >= min_share * (stop - k):
            return served[k]
    return None


@dataclass(frozen=True)
class Switch:
    """Traffic moved from ``before`` to ``after`` with request ``at`` (the first of the new run)."""

    at: Event
    before: str
    after: str


def backend_switches(reqs: Sequence[Event], *, min_run: int = 1) -> list[Switch]:
    """Switches in the backend sequence of the ok requests (known backend, by scheduled time), after dropping
    runs shorter than ``min_run`` requests where they are transition noise: at a transition, concurrent
    in-flight requests interleave the two backends for a moment, a few short runs in a row. More than
    ``min_run`` short runs in a row (e.g. primary/fallback/primary/... request by request) is traffic going
    back and forth, flapping: those runs are kept, each change a switch."""
    runs: list[tuple[str, list[Event]]] = []
    for e in reqs:
        backend = backend_of(e)
        if backend is None or not is_ok(e):
            continue
        if runs and runs[-1][0] == backend:
            runs[-1][1].append(e)
        else:
            runs.append((backend, [e]))
    kept: list[tuple[str, Event]] = []  # (backend, first request) of the runs left, same-backend runs merged
    burst: list[tuple[str, list[Event]]] = []  # the short runs since the last long one
    for backend, members in [*runs, ("", [])]:  # the empty sentinel closes the last burst
        if 0 < len(members) < min_run:
            burst.append((backend, members))
            continue
        flapping = len(burst) > min_run
        for run_backend, run_members in [*(burst if flapping else []), (backend, members)]:
            if run_members and (not kept or kept[-1][0] != run_backend):
                kept.append((run_backend, run_members[0]))
        burst = []
    return [Switch(at, prev, backend) for (prev, _), (backend, at) in zip(kept, kept[1:], strict=False)]


def served_between(reqs: Sequence[Event], backend: str, lo_ns: int, hi_ns: int) -> list[Event]:
    """Ok requests served by ``backend`` scheduled in ``[lo_ns, hi_ns)``."""
    return [e for e in reqs if lo_ns <= scheduled_ns(e) < hi_ns and is_ok(e) and backend_of(e) == backend]


# ---------------------------------------------------------------------------------------------------------
# reference points


def reference_target(scenario: Scenario | None) -> ServingTarget | None:
    """The scenario's target when it is the reference serving stack (defaults come from it), else None."""
    target = getattr(scenario, "target", None)
    return target if isinstance(target, ServingTarget) else None


FailbackSince = Literal["end", "replica_start", "backend_up"]


def failback_reference(
    history: History, span: FaultSpan, since: FailbackSince | None, primary: str = PRIMARY
) -> tuple[int, str] | None:
    """When the primary could take traffic again after ``span``'s op, and how that was found: ``end`` is the
    op's end (heal or duration); ``replica_start``/``backend_up`` the first such event of ``primary`` after
    the apply; None (auto) is the end when known, else the primary's next replica_start. None when missing."""
    if since in (None, "end") and span.end_ns is not None:
        return span.end_ns, f"fault end ({span.ended_by})"
    if since == "end":
        return None
    kind = BACKEND_UP if since == "backend_up" else REPLICA_START
    found = next(
        (e for e in events_of(history, kind) if e.ts_ns > span.applied.ts_ns and names_backend(e, primary)), None
    )
    return None if found is None else (found.ts_ns, describe_serving(history, found))


@dataclass(frozen=True)
class OpTime:
    """How long a transition (failover, failback) took after one applied op.

    ``outcome`` is ``ok`` (``seconds`` and the request ``at`` that marks it are set), ``never`` (there were
    requests but the transition never showed) or ``unknown`` (it cannot be told; ``note`` says why)."""

    applied: Event
    outcome: Literal["ok", "never", "unknown"]
    seconds: float | None = None
    at: Event | None = None
    note: str = ""
    evidence: tuple[str, ...] = ()


PRE_FAULT_REQUESTS = 20  # ok requests just before an apply that show where the traffic went
PRE_FAULT_PRIMARY_SHARE = 0.9  # share of them the primary must have served for a failover to be told
# Only answers that arrived this long before the recorded apply count: the apply's timestamp is taken once the
# fault is in place, so requests in flight while it was being applied (a SIGSTOP lands tens of ms before the
# record) already show the fault and must not count as the traffic's normal route. The shipped
# serving-primary-slow scenario's last 20 ok requests scheduled before the apply were only 70-85% primary for
# that reason alone; answered 1 s earlier, 100%.
PRE_FAULT_GUARD_S = 1.0


def primary_before(reqs: Sequence[Event], applied_ns: int, primary: str = PRIMARY) -> str | None:
    """Why a failover from ``primary`` cannot be told at ``applied_ns``, or None when it can: of the last
    :data:`PRE_FAULT_REQUESTS` ok requests naming their backend whose answer arrived at least
    :data:`PRE_FAULT_GUARD_S` before the apply (fewer when the load started later), at least
    :data:`PRE_FAULT_PRIMARY_SHARE` must have been served by ``primary``. A load balancer spreading requests over
    primary and fallback alike would otherwise "fail over" at once, with the first request after the apply; 10%
    leaves room for a stray fallback answer (a probe blip, a retry)."""
    cut = applied_ns - round(PRE_FAULT_GUARD_S * 1e9)
    served = [
        e
        for e in reqs
        if is_ok(e) and backend_of(e) is not None and scheduled_ns(e) + round((latency_s(e) or 0.0) * 1e9) < cut
    ]
    last = served[-PRE_FAULT_REQUESTS:]
    if not last:
        return (
            f"no ok request naming its backend answered {PRE_FAULT_GUARD_S:g} s or more before the apply: "
            f"whether {primary} served the traffic is unknown"
        )
    share = sum(backend_of(e) == primary for e in last) / len(last)
    if share >= PRE_FAULT_PRIMARY_SHARE:
        return None
    return (
        f"only {share:.0%} of the last {len(last)} ok request(s) answered before the apply were served by "
        f"{primary}; failover cannot be told from normal spreading"
    )


def failover_times(
    history: History,
    fault: str,
    *,
    primary: str = PRIMARY,
    to: Sequence[str] | None = None,
    horizon: float | None = None,
    reqs: Sequence[Event] | None = None,
) -> list[OpTime]:
    """Per applied op of ``fault`` (applied at T): the time from T to the first ok request scheduled at or
    after T served by a backend other than ``primary`` (one of ``to`` when given), see :func:`first_failover`;
    ``unknown`` unless the primary served the traffic just before T (:func:`primary_before`).
    When there is none, the evidence sums up what the requests of the ``horizon`` seconds after T (all
    later ones when None) got instead. ``reqs``: the history's :func:`request_events`, when known."""
    reqs = request_events(history.events) if reqs is None else reqs
    dest = "a non-primary backend" if to is None else "/".join(to)
    times = []
    for op in applied_ops(history, fault):
        before = [e for e in reqs if scheduled_ns(e) < op.ts_ns and is_ok(e)]
        moved = sum(backend_of(e) not in (None, primary) for e in before)
        line = describe_serving(history, op, f"{moved} of {len(before)} ok request(s) before it off {primary}")
        after = [e for e in reqs if scheduled_ns(e) >= op.ts_ns]
        found = first_failover(reqs, op.ts_ns, primary=primary, to=to)
        spread = primary_before(reqs, op.ts_ns, primary)
        if spread is not None:
            times.append(OpTime(op, "unknown", note=spread, evidence=(line,)))
        elif not after:
            note = f"no request scheduled after the apply at {fmt_offset(history, op.ts_ns)}"
            times.append(OpTime(op, "unknown", note=note, evidence=(line,)))
        elif found is None:
            note = f"no ok request from {dest} after the apply at {fmt_offset(history, op.ts_ns)}"
            cut = op.ts_ns + round((horizon or 0.0) * 1e9)
            seen = after if horizon is None else [e for e in after if scheduled_ns(e) < cut]
            when = "after it" if horizon is None else f"in the {fmt_seconds(horizon)} after it"
            got = f"{len(seen)} request(s) {when}: {status_counts(seen)}; served by {backend_counts(seen)}"
            times.append(OpTime(op, "never", note=note, evidence=(line, got)))
        else:
            taken = seconds(scheduled_ns(found) - op.ts_ns)
            failed = sum(not is_ok(e) for e in after if scheduled_ns(e) < scheduled_ns(found))
            what = f"{describe_request(history, found)}: {fmt_seconds(taken)} later, {failed} failed request(s) before"
            times.append(OpTime(op, "ok", taken, found, evidence=(line, what)))
    return times


def failback_times(
    history: History,
    scenario: Scenario | None,
    fault: str,
    *,
    since: FailbackSince | None = None,
    primary: str = PRIMARY,
    confirm: int = 10,
    min_share: float = 0.9,
    reqs: Sequence[Event] | None = None,
) -> list[OpTime]:
    """Per applied op of ``fault``: the time from its :func:`failback_reference` R to the first request of
    :func:`first_failback` after R. ``unknown`` when R is missing, no request came after R, or traffic never
    left ``primary`` after the apply (there was nothing to fail back from). ``reqs`` as in failover_times."""
    reqs = request_events(history.events) if reqs is None else reqs
    times = []
    for span in fault_spans(history, scenario, fault):
        op = span.applied
        lines = [describe_serving(history, op)]
        found = failback_reference(history, span, since, primary)
        if found is None:
            note = f"no reference point ({since or 'end, else replica_start'}) after the apply at "
            times.append(OpTime(op, "unknown", note=note + fmt_offset(history, op.ts_ns), evidence=tuple(lines)))
            continue
        ref, how = found
        lines.append(f"reference {fmt_offset(history, ref)}: {how}")
        after = [e for e in reqs if scheduled_ns(e) >= ref]
        back = first_failback(reqs, ref, primary=primary, confirm=confirm, min_share=min_share)
        left = first_failover(reqs, op.ts_ns, primary=primary)
        if left is None or (back is not None and scheduled_ns(left) >= scheduled_ns(back)):
            note = f"traffic never left {primary} after the apply at {fmt_offset(history, op.ts_ns)}"
            times.append(OpTime(op, "unknown", note=note, evidence=tuple(lines)))
        elif not after:
            note = f"no request scheduled after the reference point {fmt_offset(history, ref)}"
            times.append(OpTime(op, "unknown", note=note, evidence=tuple(lines)))
        elif back is None:
            note = f"no run of {confirm} ok requests mostly on {primary} after {fmt_offset(history, ref)}"
            lines.append(f"after it: {status_counts(after)}; served by {backend_counts(after)}")
            times.append(OpTime(op, "never", note=note, evidence=tuple(lines)))
        else:
            taken = seconds(scheduled_ns(back) - ref)
            lines.append(f"{describe_request(history, back)}: back on {primary} after {fmt_seconds(taken)}")
            times.append(OpTime(op, "ok", taken, back, evidence=tuple(lines)))
    return times


# ---------------------------------------------------------------------------------------------------------
# reference-stack evidence


def early_failbacks(
    history: History, served: list[Event], primary: str, needed: float, slack: float
) -> tuple[list[str], list[str]]:
    """Failback hysteresis of ``primary``: for each ``serving.backend_up`` of it that follows a
    ``detect.backend_down`` and a ``serving.replica_start`` of it (both since the previous up), no ok request
    of ``served`` may have been sent to it (:func:`sent_ns`, ``slack`` inside both ends) between the down and
    replica_start + ``needed``. Returns (violations, evidence lines)."""
    downs = [e for e in events_of(history, BACKEND_DOWN) if names_backend(e, primary)]
    starts = [e for e in events_of(history, REPLICA_START) if names_backend(e, primary)]
    problems: list[str] = []
    lines: list[str] = []
    previous_up = -1
    for up in (e for e in events_of(history, BACKEND_UP) if names_backend(e, primary)):
        down = next((d for d in reversed(downs) if previous_up < d.ts_ns < up.ts_ns), None)
        start = next((s for s in reversed(starts) if previous_up < s.ts_ns < up.ts_ns), None)
        previous_up = up.ts_ns
        if down is None or start is None:
            continue
        earliest = start.ts_ns + round(needed * 1e9)
        lo, hi = down.ts_ns + round(slack * 1e9), earliest - round(slack * 1e9)
        early = [e for e in served if backend_of(e) == primary and lo <= sent_ns(e) < hi]
        lines.append(
            f"{describe_serving(history, start)}; up at {fmt_offset(history, up.ts_ns)}, "
            f"{fmt_seconds(seconds(up.ts_ns - start.ts_ns))} later (hysteresis {fmt_seconds(needed)})"
        )
        if early:
            problems.append(
                f"{len(early)} request(s) failed back to {primary} before the hysteresis ended at "
                f"{fmt_offset(history, earliest)}, first {describe_request(history, early[0])}"
            )
    if not lines:
        lines.append(f"hysteresis not checked: no backend_down/replica_start/backend_up cycle of {primary}")
    return problems, lines


def sent_ns(event: Event) -> int:
    """When a request really left the client: scheduled time plus its ``send_lag_s``."""
    lag = event.data.get("send_lag_s")
    extra = lag if isinstance(lag, (int, float)) and not isinstance(lag, bool) else 0
    return scheduled_ns(event) + round(extra * 1e9)


def is_wrong_answer_detection(event: Event, backend: str) -> bool:
    """A ``detect.wrong_answer``, or a ``detect.backend_down`` for reason ``correctness``, naming ``backend``."""
    if not names_backend(event, backend):
        return False
    return event.kind == DETECT_WRONG_ANSWER or (
        event.kind == BACKEND_DOWN and event.get_str("reason") == "correctness"
    )
