"""Windows of a load run and the request-level measures shared by the serving checks and the serving report.

Everything here is a pure function of events (a :class:`~chaos.history.timeline.History` works). Requests are the
``load.request`` events, placed in time by their SCHEDULED send time (:func:`chaos.load.summary.scheduled_ns`),
so a window holds the requests the generator was asked to send in it, however late their answers came.

A **window** is a set of half-open ``[start, end)`` intervals on the harness clock:

- ``all``: the whole load, ``[load start, load end)``;
- ``before``: ``[load start, first fault.applied)``;
- ``during``: for every applied op of the fault, ``[applied, op end)``;
- ``after``: ``[latest op end, load end)``;

then ``settle`` is cut from the start of each interval and ``start``/``end`` (offsets from the load's start)
clip them. An op ends (:func:`fault_spans`) at the first event matching ``until`` when that is set, else at
its ``fault.healed``, else ``duration_s`` after it applied (from the event, else the scenario fault's
``duration``); an op with none of these has no known end, and a window that needs it cannot be resolved.

Measures, per applied op as an :class:`OpTime`: :func:`failover_times` (apply -> first ok non-primary
answer) and :func:`failback_times` (reference point -> traffic back on the primary); over a request
sequence: :func:`backend_switches`; on the reference stack: :func:`early_failbacks` (failback hysteresis).
"""

from __future__ import annotations

import bisect
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from chaos.checks._evidence import fmt_offset, fmt_seconds, missing_fault_reason, ordered, seconds
from chaos.history.timeline import FAULT_APPLIED, FAULT_HEALED, Event, History
from chaos.load.summary import is_ok, request_events, run_bounds, scheduled_ns, status_of
from chaos.spec.load import LOAD_START
from chaos.spec.serving import PRIMARY, REPLICA_RANKS, ServingTarget
from chaos.spec.units import Duration

if TYPE_CHECKING:
    from chaos.spec.scenario import Scenario

WindowKind = Literal["before", "during", "after", "all"]
SHED_BACKEND = "gateway"  # the backend a shed (503 at the gateway) response names
REPLICA_START = "serving.replica_start"
BACKEND_UP = "serving.backend_up"
BACKEND_DOWN = "detect.backend_down"


class WindowParams(BaseModel):
    """Where a windowed serving check looks: relative to a fault, or at offsets from the load's start."""

    model_config = ConfigDict(extra="forbid")

    fault: str | None = Field(
        default=None, description="scenario fault the window is relative to (null: no fault; the whole load)"
    )
    window: WindowKind | None = Field(
        default=None,
        description="before | during | after | all, relative to the fault; default: during with a fault, else all",
    )
    until: str | None = Field(
        default=None,
        min_length=1,
        description="event-kind glob whose first match after each apply ends the fault (e.g. serving.backend_up); "
        "overrides heal and duration; never matched: the fault lasts to the load's end",
    )
    until_backend: str | None = Field(
        default=None, description="with until: count only events naming this backend (data.backend or replica)"
    )
    settle: Duration = Field(
        default=0.0, description="time cut from the start of each window interval (e.g. the failover transient)"
    )
    start: Duration | None = Field(default=None, description="clip the window to offsets >= this from the load start")
    end: Duration | None = Field(default=None, description="clip the window to offsets < this from the load start")

    @model_validator(mode="after")
    def _consistent(self) -> WindowParams:
        if self.fault is None and self.window not in (None, "all"):
            raise ValueError(f"window {self.window!r} is relative to a fault: name one with fault")
        if self.fault is None and self.until is not None:
            raise ValueError("until ends a fault: name one with fault")
        if self.until_backend is not None and self.until is None:
            raise ValueError("until_backend restricts until: set until too")
        if self.start is not None and self.end is not None and self.end <= self.start:
            raise ValueError(f"end ({self.end}s) must come after start ({self.start}s)")
        return self

    def kind(self) -> WindowKind:
        """The window kind with its default applied."""
        if self.window is not None:
            return self.window
        return "during" if self.fault is not None else "all"


# ---------------------------------------------------------------------------------------------------------
# finding events


def events_of(history: History, pattern: str) -> list[Event]:
    """:func:`chaos.checks._evidence.events_of` (matching events in content order), fast on a long load: only
    kinds that start with the glob's literal prefix are matched, so tens of thousands of ``load.request``
    events cost a string comparison each, not an fnmatch."""
    prefix = re.split(r"[*?\[]", pattern, maxsplit=1)[0]
    if prefix == pattern:
        return ordered(e for e in history.events if e.kind == pattern)
    return ordered(e for e in history.events if e.kind.startswith(prefix) and e.matches(pattern))


def applied_ops(history: History, fault: str) -> list[Event]:
    """Every ``fault.applied`` of ``fault``, in time order (as :func:`chaos.checks._evidence.applied_ops`)."""
    return [e for e in events_of(history, FAULT_APPLIED) if e.get_str("fault") == fault]


# ---------------------------------------------------------------------------------------------------------
# request fields


def backend_of(event: Event) -> str | None:
    """Who served a request (``data.backend``), or None when the response did not say."""
    return event.get_str("backend")


def priority_of(event: Event) -> str | None:
    return event.get_str("priority")


def names_backend(event: Event, name: str) -> bool:
    """True when a serving event is about backend ``name``: ``data.backend`` or ``data.replica`` equals it,
    or ``data.replica`` is the reference stack's replica rank of that name (0 primary, 1 fallback)."""
    if event.get_str("backend") == name or event.get_str("replica") == name:
        return True
    replica = event.get_int("replica")
    return replica is not None and REPLICA_RANKS.get(name) == replica


def is_shed(event: Event, statuses: Sequence[int] = (503,)) -> bool:
    """A request the gateway turned away: one of ``statuses`` (503 by default) or served by ``gateway``."""
    status = status_of(event)
    return (isinstance(status, int) and status in statuses) or backend_of(event) == SHED_BACKEND


def describe_request(history: History, event: Event) -> str:
    """``"request 17 (503 via gateway, free) sent at +12.301s"``: one evidence line for a request."""
    parts = [str(status_of(event))]
    backend = backend_of(event)
    if backend is not None:
        parts[0] += f" via {backend}"
    priority = priority_of(event)
    if priority is not None:
        parts.append(priority)
    index = event.get_int("i")
    name = "request" if index is None else f"request {index}"
    return f"{name} ({', '.join(parts)}) sent at {fmt_offset(history, scheduled_ns(event))}"


def describe_serving(history: History, event: Event, note: str = "") -> str:
    """One evidence line for a serving or fault event: kind, the backend/replica/fault it names, offset."""
    what = [
        str(v) for key in ("fault", "backend", "replica", "reason", "state") if (v := event.data.get(key)) is not None
    ]
    if event.data.get("op") is not None:
        what.append(f"(op {event.data['op']})")
    text = f"{event.kind} {' '.join(what)}".rstrip() + f" at {fmt_offset(history, event.ts_ns)}"
    return f"{text}; {note}" if note else text


def status_counts(reqs: Iterable[Event]) -> str:
    """``"200 x90, 503 x8, timeout x2"``: the outcomes of ``reqs``, most common first."""
    counts = Counter(str(status_of(e)) for e in reqs)
    return ", ".join(f"{status} x{n}" for status, n in counts.most_common()) or "none"


def backend_counts(reqs: Iterable[Event]) -> str:
    """``"primary x40, fallback x12"``: who served the ok requests of ``reqs`` (``?``: the answer did not say)."""
    counts = Counter(backend_of(e) or "?" for e in reqs if is_ok(e))
    return ", ".join(f"{name} x{n}" for name, n in counts.most_common()) or "none"


# ---------------------------------------------------------------------------------------------------------
# the load's span and the faults' spans


def load_span(events: Iterable[Event]) -> tuple[int, int] | None:
    """``[start_ns, end_ns)`` of the load: its ``load.start`` schedule when that is known and the run was not
    stopped early; else from the earliest ``load.start`` (or first send) to just after the last send. None
    when there is no ``load.request`` at all."""
    events = list(events)
    reqs = request_events(events)
    if not reqs:
        return None
    known = run_bounds(events)
    if known is not None:
        return known
    starts = [s for e in events if e.kind == LOAD_START and (s := e.get_int("start_ns")) is not None]
    first = scheduled_ns(reqs[0])
    return (min([first, *starts]), scheduled_ns(reqs[-1]) + 1)


@dataclass(frozen=True)
class FaultSpan:
    """One applied op of a fault and when it ended (``end_ns`` None: no known end)."""

    applied: Event
    end_ns: int | None
    ended_by: str  # for evidence: how the end was found, or why it was not


def _duration_of(event: Event, scenario: Scenario | None, fault: str) -> float | None:
    value = event.data.get("duration_s")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    for spec in getattr(scenario, "faults", None) or ():
        if getattr(spec, "name", None) == fault:
            duration = getattr(spec, "duration", None)
            return float(duration) if isinstance(duration, (int, float)) else None
    return None


def fault_spans(
    history: History,
    scenario: Scenario | None,
    fault: str,
    *,
    until: str | None = None,
    until_backend: str | None = None,
) -> list[FaultSpan]:
    """Every applied op of ``fault`` with its end (see the module docstring), in time order."""
    heals = [e for e in events_of(history, FAULT_HEALED) if e.get_str("fault") == fault]
    enders = events_of(history, until) if until is not None else []
    spans = []
    for op in applied_ops(history, fault):
        if until is not None:
            match = next(
                (
                    e
                    for e in enders
                    if e.ts_ns > op.ts_ns and (until_backend is None or names_backend(e, until_backend))
                ),
                None,
            )
            where = until + ("" if until_backend is None else f" of {until_backend}")
            spans.append(
                FaultSpan(op, None, f"no {where} after it")
                if match is None
                else FaultSpan(op, match.ts_ns, f"ended by {describe_serving(history, match)}")
            )
            continue
        heal = next((e for e in heals if e.ts_ns >= op.ts_ns and _same_op(op, e)), None)
        if heal is not None:
            spans.append(FaultSpan(op, heal.ts_ns, f"healed at {fmt_offset(history, heal.ts_ns)}"))
            continue
        duration = _duration_of(op, scenario, fault)
        if duration is not None:
            spans.append(
                FaultSpan(op, op.ts_ns + round(duration * 1e9), f"lasted its duration {fmt_seconds(duration)}")
            )
        else:
            spans.append(FaultSpan(op, None, "no fault.healed and no duration"))
    return spans


def _same_op(applied: Event, healed: Event) -> bool:
    # A heal belongs to an apply of the same op on the same host; fields either event lacks do not rule it out.
    for key in ("op", "host"):
        a, b = applied.data.get(key), healed.data.get(key)
        if a is not None and b is not None and a != b:
            return False
    return True


# ---------------------------------------------------------------------------------------------------------
# windows


@dataclass(frozen=True)
class Window:
    """Resolved window: disjoint sorted ``[start, end)`` intervals (possibly none) and how they were found."""

    text: str
    intervals: tuple[tuple[int, int], ...]
    evidence: tuple[str, ...]

    def select(self, reqs: Sequence[Event], keys: Sequence[int] | None = None) -> list[Event]:
        """The requests of ``reqs`` (sorted by scheduled time; ``keys``: their scheduled times, when known)
        scheduled inside the window."""
        keys = [scheduled_ns(e) for e in reqs] if keys is None else keys
        chosen: list[Event] = []
        for lo, hi in self.intervals:
            chosen.extend(reqs[bisect.bisect_left(keys, lo) : bisect.bisect_left(keys, hi)])
        return chosen


@dataclass(frozen=True)
class Unresolved:
    """A window that cannot be placed, and why (the check is ``unknown``)."""

    reason: str
    evidence: tuple[str, ...] = ()


def resolve_window(
    history: History, scenario: Scenario | None, p: WindowParams, *, load: tuple[int, int] | None = None
) -> Window | Unresolved:
    """The window ``p`` describes on this history (see the module docstring); ``load`` is the history's
    :func:`load_span` when the caller has it already."""
    span = load_span(history.events) if load is None else load
    if span is None:
        return Unresolved("no load.request events: the load generator recorded no requests")
    lo, hi = span
    kind = p.kind()
    evidence = [f"load {fmt_offset(history, lo)}..{fmt_offset(history, hi)}"]
    if p.fault is None:
        raw = [(lo, hi)]
        text = "the whole load"
    else:
        spans = fault_spans(history, scenario, p.fault, until=p.until, until_backend=p.until_backend)
        if not spans:
            return Unresolved(missing_fault_reason(history, p.fault))
        evidence += [describe_serving(history, s.applied, s.ended_by) for s in spans]
        text = f"{kind} {p.fault}"
        ends: list[int] = []
        if kind in ("during", "after"):
            for s in spans:
                if s.end_ns is not None:
                    ends.append(s.end_ns)
                elif p.until is not None:
                    ends.append(hi)  # the ending event never came: the fault lasted the whole load
                else:
                    return Unresolved(
                        f"fault {p.fault!r} applied at {fmt_offset(history, s.applied.ts_ns)} has no known end "
                        f"({s.ended_by}); set until (e.g. serving.backend_up) to end it at an event",
                        tuple(evidence),
                    )
        if kind == "before":
            raw = [(lo, spans[0].applied.ts_ns)]
        elif kind == "during":
            raw = [(s.applied.ts_ns, end) for s, end in zip(spans, ends, strict=True)]
        elif kind == "after":
            raw = [(max(ends), hi)]
        else:
            raw = [(lo, hi)]
    settle = round(p.settle * 1e9)
    clip_lo = lo if p.start is None else lo + round(p.start * 1e9)
    clip_hi = hi if p.end is None else lo + round(p.end * 1e9)
    intervals = _merge([(max(a + settle, clip_lo), min(b, clip_hi)) for a, b in raw])
    shown = ", ".join(f"{fmt_offset(history, a)}..{fmt_offset(history, b)}" for a, b in intervals) or "empty"
    extras = [f"settle {fmt_seconds(p.settle)}"] if p.settle else []
    if p.start is not None or p.end is not None:
        extras.append(f"offsets {fmt_seconds(p.start or 0.0)}..{'end' if p.end is None else fmt_seconds(p.end)}")
    text += f" ({shown}{'; ' if extras else ''}{'; '.join(extras)})"
    return Window(text, tuple(intervals), tuple(evidence))


def _merge(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for a, b in sorted(i for i in intervals if i[0] < i[1]):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


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
    runs shorter than ``min_run`` requests: at a transition, concurrent in-flight requests interleave the two
    backends for a moment, which is noise and not flapping."""
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
    for backend, members in runs:
        if len(members) < min_run:
            continue
        if not kept or kept[-1][0] != backend:
            kept.append((backend, members[0]))
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
    after T served by a backend other than ``primary`` (one of ``to`` when given), see :func:`first_failover`.
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
        if not after:
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
    return event.kind == "detect.wrong_answer" or (
        event.kind == BACKEND_DOWN and event.get_str("reason") == "correctness"
    )
