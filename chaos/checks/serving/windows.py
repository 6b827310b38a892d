"""Windows of a load run: which requests a windowed serving check judges.

Everything here is a pure function of events (a :class:`~chaos.history.timeline.History` works). Requests are
placed in time by their SCHEDULED send time (:func:`chaos.load.summary.scheduled_ns`), so a window holds the
requests the generator was asked to send in it, however late their answers came.

A **window** is a set of half-open ``[start, end)`` intervals on the harness clock:

- ``all``: the whole load, ``[load start, load end)``;
- ``before``: ``[load start, first fault.applied)``;
- ``during``: for every applied op of the fault, ``[applied, op end)``;
- ``after``: ``[latest op end, load end)``;

then ``settle`` is cut from the start of each interval and ``start``/``end`` (offsets from the load's start)
clip them. An op's end is :func:`~chaos.checks.serving.events.fault_spans`'s; an op with no known end leaves a
window that needs it unresolved.

The request fields and spans are in :mod:`chaos.checks.serving.events`, the request-level measures in
:mod:`chaos.checks.serving.measures`.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from pydantic import Field, model_validator

from chaos.checks._evidence import fmt_offset, fmt_seconds, missing_fault_reason
from chaos.checks.base import CheckParams
from chaos.checks.serving.events import describe_serving, fault_spans, load_span
from chaos.history.timeline import Event, History
from chaos.load.summary import scheduled_ns
from chaos.spec.units import Duration

if TYPE_CHECKING:
    from chaos.spec.scenario import Scenario

__all__ = ["Unresolved", "Window", "WindowKind", "WindowParams", "resolve_window"]

WindowKind = Literal["before", "during", "after", "all"]


class WindowParams(CheckParams):
    """Where a windowed serving check looks: relative to a fault, or at offsets from the load's start."""

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
