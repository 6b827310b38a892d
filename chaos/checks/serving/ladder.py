"""The fallback ladder over time: which rung served each request, where the gateway's route moved, and the
signals that may justify a move. Shared by ``fallback_ladder`` and the run timeline's ladder panel.

Everything here is a pure function of events. A :class:`Ladder` orders rungs top (best) to bottom and maps
backends to them. A request's rung is the rung of the backend it was routed to and answered from
(:func:`~chaos.checks.serving.streams.served_by`), placed at its sent time (scheduled + send lag); a
``serving.route`` event's rung is that of the backend it names, at its own time. A signal spec is an event-kind
glob, optionally ``:STATE`` (``data.state`` must equal it, e.g. ``serving.breaker:open``); the spec
``load.request:failed`` is a request on the rung that failed its user (cut, error, timeout, not ok) or was
resumed off it, at the time it ended (a stream resumed elsewhere: when its longest gap, the cut, began). Every
signal names a backend of its rung.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pydantic import Field

from chaos.checks.base import CheckParams
from chaos.checks.serving import streams as st
from chaos.checks.serving.events import backend_of, describe_serving, events_of, names_backend
from chaos.checks.serving.measures import sent_ns
from chaos.event_kinds import LOAD_REQUEST, SERVING_ROUTE
from chaos.history.timeline import Event, History
from chaos.spec.serving import CACHE, PRIMARY

FAILED_REQUEST = f"{LOAD_REQUEST}:failed"
DEFAULT_DOWN_ON = ("detect.backend_down", "serving.breaker:open", FAILED_REQUEST)
DEFAULT_UP_ON = ("serving.backend_up", "serving.breaker:closed")
SIGNAL_SPEC = re.compile(r"^[a-z0-9_.*?\[\]]+(:[a-z0-9_]+)?$")


class Rung(CheckParams):
    """One backend of the ladder and the rung it stands on."""

    backend: str = Field(min_length=1, description="a backend name as requests and gateway events give it")
    rung: str = Field(min_length=1, description="the rung it serves (e.g. big, small, cached)")


@dataclass(frozen=True)
class Ladder:
    """Rung names top (index 0, the best) to bottom, and each backend's rung index."""

    names: tuple[str, ...]
    rung_of: dict[str, int]

    @staticmethod
    def of(rungs: Sequence[Rung]) -> Ladder:
        """The ladder ``rungs`` lists top to bottom (a rung named again keeps its first place)."""
        names: list[str] = []
        for r in rungs:
            if r.rung not in names:
                names.append(r.rung)
        return Ladder(tuple(names), {r.backend: names.index(r.rung) for r in rungs})

    @staticmethod
    def guess(reqs: Iterable[Event]) -> Ladder:
        """A ladder of the backends that served ``reqs``, one rung each, for a plot that is told none: the
        primary on top, then in the order they first served, degraded answers and the cache last."""
        order: list[str] = []
        degraded: set[str] = set()
        for e in reqs:
            backend = st.served_by(e)
            if backend is None:
                continue
            if backend not in order:
                order.append(backend)
            if e.data.get("degraded") is True:
                degraded.add(backend)
        order.sort(key=lambda b: (b != PRIMARY, b in degraded or b == CACHE))
        return Ladder(tuple(order), {b: k for k, b in enumerate(order)})

    def backends(self, rung: int) -> list[str]:
        return sorted(b for b, k in self.rung_of.items() if k == rung)


@dataclass(frozen=True)
class RungPoint:
    """Traffic on rung ``rung`` at ``ts_ns``, as ``event`` (a request or a ``serving.route``) shows."""

    ts_ns: int
    rung: int
    event: Event


def request_points(reqs: Iterable[Event], ladder: Ladder) -> list[RungPoint]:
    """Each request served by a backend of ``ladder``, at its sent time, in time order."""
    points = [
        RungPoint(sent_ns(e), ladder.rung_of[backend], e)
        for e in reqs
        if (backend := st.served_by(e)) is not None and backend in ladder.rung_of
    ]
    return sorted(points, key=lambda p: p.ts_ns)


def route_points(history: History, ladder: Ladder) -> list[RungPoint]:
    """Each ``serving.route`` naming a backend of ``ladder``, in time order (routes to ``none`` left out)."""
    return [
        RungPoint(e.ts_ns, ladder.rung_of[backend], e)
        for e in events_of(history, SERVING_ROUTE)
        if (backend := backend_of(e)) is not None and backend in ladder.rung_of
    ]


def smoothed(points: Sequence[RungPoint], min_run: int) -> list[RungPoint]:
    """The first point of each run of one rung, after dropping runs shorter than ``min_run`` as transition noise
    (in-flight requests interleave two rungs for a moment) unless more than ``min_run`` short runs come in a
    row: traffic going back and forth, whose every run is kept."""
    runs: list[list[RungPoint]] = []
    for point in points:
        if runs and runs[-1][0].rung == point.rung:
            runs[-1].append(point)
        else:
            runs.append([point])
    kept: list[RungPoint] = []
    burst: list[list[RungPoint]] = []
    for members in [*runs, []]:  # the empty sentinel closes the last burst
        if 0 < len(members) < min_run:
            burst.append(members)
            continue
        for run in [*(burst if len(burst) > min_run else []), members]:
            if run and (not kept or kept[-1].rung != run[0].rung):
                kept.append(run[0])
        burst = []
    if not kept and points:  # nothing but short runs: the load was too short to tell noise, keep it all
        kept = [run[0] for run in runs]
    return kept


@dataclass(frozen=True)
class Move:
    """Traffic moved from rung ``before`` to rung ``after`` at ``at``."""

    at: RungPoint
    before: int

    @property
    def after(self) -> int:
        return self.at.rung

    @property
    def down(self) -> bool:
        return self.at.rung > self.before


def moves(timeline: Sequence[RungPoint]) -> list[Move]:
    """Where the rung changes along ``timeline`` (points in time order)."""
    return [Move(b, a.rung) for a, b in zip(timeline, timeline[1:], strict=False) if a.rung != b.rung]


@dataclass(frozen=True)
class Signal:
    """A signal about rung ``rung`` at ``ts_ns``, and its evidence line."""

    ts_ns: int
    rung: int
    text: str


def signals(history: History, ladder: Ladder, specs: Sequence[str], reqs: Sequence[Event]) -> list[list[Signal]]:
    """Per rung, the signals ``specs`` select that name one of its backends, in time order (see the module
    docstring for the specs)."""
    found: list[list[Signal]] = [[] for _ in ladder.names]
    for spec in specs:
        kind, _, state = spec.partition(":")
        if spec == FAILED_REQUEST:
            for e in reqs:
                backend = _first_backend(e)
                if backend in ladder.rung_of and (st.failed(e) or st.resumed(e)):
                    text = f"{st.describe_stream(history, e)} failed on {backend}"
                    found[ladder.rung_of[backend]].append(Signal(st.failure_ns(e), ladder.rung_of[backend], text))
            continue
        for e in events_of(history, kind):
            if state and e.get_str("state") != state:
                continue
            for backend, rung in ladder.rung_of.items():
                if names_backend(e, backend):
                    found[rung].append(Signal(e.ts_ns, rung, describe_serving(history, e)))
                    break
    for mine in found:
        mine.sort(key=lambda s: s.ts_ns)
    return found


def _first_backend(event: Event) -> str | None:
    """The backend a request started on, whether or not it answered."""
    route = st.backends_of(event)
    return route[0] if route else backend_of(event)
