"""The events serving checks judge, found and described: load requests, serving events and faults' spans.

Everything here is a pure function of events (a :class:`~chaos.history.timeline.History` works). Requests are the
``load.request`` events, placed in time by their SCHEDULED send time (:func:`chaos.load.summary.scheduled_ns`).
An applied op of a fault ends (:func:`fault_spans`) at the first event matching ``until`` when that is set, else
at its ``fault.healed``, else ``duration_s`` after it applied (from the event, else the scenario fault's
``duration``); an op with none of these has no known end.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from chaos.checks._evidence import fmt_offset, fmt_seconds, ordered
from chaos.event_kinds import FAULT_APPLIED, FAULT_HEALED, LOAD_START
from chaos.history.timeline import Event, History
from chaos.load.summary import is_ok, request_events, run_bounds, scheduled_ns, status_of
from chaos.spec.serving import REPLICA_RANKS

if TYPE_CHECKING:
    from chaos.spec.scenario import Scenario

SHED_BACKEND = "gateway"  # the backend a shed (503 at the gateway) response names

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
