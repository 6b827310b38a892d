"""The ladder panel of the run timeline: which rung of the fallback ladder served streamed traffic over time.

:func:`ladder_series` is the plot's data, a pure function of the events: when the history holds streamed
``load.request`` events, each served request's rung (big, small, cached ...) at its sent time, and the
gateway's ``serving.route`` changes when it recorded them; rungs are a :class:`~chaos.checks.serving.ladder.Ladder`
(a ``fallback_ladder`` check's, or guessed from the backends: the primary on top, the cache last).
:func:`draw_ladder` draws it as step lines, the top rung at the top. Times are seconds since ``origin``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from chaos.checks.serving.ladder import Ladder, request_points, route_points
from chaos.checks.serving.streams import is_stream
from chaos.history.timeline import Event, History
from chaos.load.summary import request_events

if TYPE_CHECKING:
    from matplotlib.axes import Axes

MAX_STEPS = 4000  # points of the request line; a longer load keeps every rung change and thins the rest


@dataclass(frozen=True)
class LadderSeries:
    """The rung over time: ``rungs`` top to bottom; per served request its send time and rung index (0: top);
    the gateway's route changes likewise (empty when it recorded none)."""

    rungs: tuple[str, ...]
    xs: list[float]
    ys: list[int]
    route_xs: list[float]
    route_ys: list[int]

    def steps(self) -> list[tuple[float, str]]:
        """(time, rung) where the requests' rung changes, the first request's included."""
        return [
            (x, self.rungs[y])
            for k, (x, y) in enumerate(zip(self.xs, self.ys, strict=True))
            if not k or y != self.ys[k - 1]
        ]


def ladder_series(events: Sequence[Event], origin: int, ladder: Ladder | None = None) -> LadderSeries | None:
    """The ladder's data (see the module docstring); None when no request is a stream or none was served by a
    rung of the ladder."""
    reqs = request_events(events)
    if not any(is_stream(e) for e in reqs):
        return None
    ladder = Ladder.guess(reqs) if ladder is None else ladder
    points = request_points(reqs, ladder)
    if not points:
        return None
    routes = route_points(History.from_events(events), ladder)
    xs = [(p.ts_ns - origin) / 1e9 for p in points]
    ys = [p.rung for p in points]
    return LadderSeries(
        ladder.names, *_thinned(xs, ys), [(p.ts_ns - origin) / 1e9 for p in routes], [p.rung for p in routes]
    )


def _thinned(xs: list[float], ys: list[int]) -> tuple[list[float], list[int]]:
    """At most about :data:`MAX_STEPS` points, keeping the first, the last and both ends of every change."""
    if len(xs) <= MAX_STEPS:
        return xs, ys
    stride = -(-len(xs) // MAX_STEPS)
    keep = [k for k in range(len(xs)) if not k % stride or k == len(xs) - 1 or ys[k] != ys[k - 1]]
    keep = sorted(set(keep) | {k - 1 for k in keep if k and ys[k] != ys[k - 1]})
    return [xs[k] for k in keep], [ys[k] for k in keep]


def draw_ladder(ax: Axes, series: LadderSeries) -> None:
    """The rung of each served request as a step line, the gateway's route (when recorded) dashed over it."""
    ax.step(series.xs, series.ys, where="post", color="#1565c0", linewidth=1.4, label="rung serving requests")
    ax.scatter(series.xs[-1:], series.ys[-1:], s=6, color="#1565c0")
    if series.route_xs:
        ax.step(
            series.route_xs,
            series.route_ys,
            where="post",
            color="#e65100",
            linewidth=1.0,
            linestyle="--",
            label="gateway route",
        )
    ax.set_yticks(range(len(series.rungs)), list(series.rungs), fontsize=8)
    ax.set_ylim(len(series.rungs) - 0.5, -0.5)  # the top rung at the top
    ax.set_ylabel("rung")
    ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
