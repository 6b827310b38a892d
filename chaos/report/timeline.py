"""The run timeline: one PNG of what happened when, drawn from the events alone (for ``report.html``).

Panels share one x axis, seconds since the run's first event (the origin of the ``+12.301s`` offsets in check
evidence, so a time in the evidence can be found on the plot):

- **progress** (when there are ``target.step`` events): step against time, one colour per rank and one line
  per restart attempt, so a restart shows as a gap and a fresh line; checkpoints as ticks, resumes as circles;
- **serving** (when there are ``load.request`` events): requests/s by scheduled send time, stacked by the
  backend that answered (ok) and by error status, with the p99 latency per bin on a second axis;
- **ladder** (when requests are streamed): the rung of the fallback ladder that served each request over time
  as a step line, the gateway's route changes dashed (:mod:`chaos.report.ladder`);
- **events**: one row per event family (fault, detect, target, serving, load, runner), so a run with neither
  steps nor requests still shows its history.

On every panel: fault windows shaded from ``fault.applied`` to its ``fault.healed`` (or the op's duration);
one-shot faults (no heal, no duration: a kill) as solid lines; ``detect.*`` as dashed lines; restarts as
dotted lines, as are in-place rollbacks (``target.rollback``). Labels go on the top panel. Long runs are
decimated (at most :data:`MAX_POINTS` points per line, :data:`chaos.report.serving.MAX_BINS` bins) so a plot
takes well under a second. matplotlib is imported lazily (Agg, no display).
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from chaos.event_kinds import (
    FAULT_APPLIED,
    FAULT_FAILED,
    FAULT_HEALED,
    LOAD_REQUEST,
    RUNNER_GOLDEN,
    RUNNER_VERDICT,
    SERVING_STATS,
    TARGET_CHECKPOINT,
    TARGET_CHECKPOINT_REJECTED,
    TARGET_CHECKPOINT_RETRY,
    TARGET_RESTART,
    TARGET_RESTORE,
    TARGET_RESUME,
    TARGET_ROLE_RESTART,
    TARGET_STEP,
)
from chaos.event_kinds import TARGET_ROLLBACK as ROLLBACK
from chaos.history.timeline import Event
from chaos.load.summary import is_ok, request_events, scheduled_ns
from chaos.report.ladder import draw_ladder, ladder_series
from chaos.report.serving import bin_requests

if TYPE_CHECKING:
    from matplotlib.axes import Axes

POST_RUN = frozenset({RUNNER_GOLDEN, RUNNER_VERDICT})
"""Kinds recorded after the run itself (the golden run, the verdict): kept off the x range."""
MAX_POINTS = 2000
LABEL_CHARS = 60  # a label on the plot is cut to this many characters
MAX_LABELS = 25  # more label groups than this of one kind would overprint: see _overlays
_RAIL_SKIP = frozenset({TARGET_STEP, LOAD_REQUEST, SERVING_STATS})
_RAIL_ROWS = ("fault", "detect", "target", "serving", "load", "runner", "storage")
_FAULT_COLORS = ("#e53935", "#fb8c00", "#8e24aa", "#3949ab", "#00897b", "#6d4c41", "#d81b60", "#546e7a")
_RESTART_COLOR = "#6a1b9a"
_DETECT_COLOR = "#424242"


@dataclass(frozen=True)
class FaultMark:
    """One applied fault op on the timeline: ``end_s`` None means one-shot (no heal and no duration)."""

    fault: str
    op: str
    host: str | None
    start_s: float
    end_s: float | None
    ended_by: str  # "healed", "duration" or "one-shot"


def origin_of(events: Iterable[Event]) -> int:
    """The timeline's zero: the earliest event's ``ts_ns`` (0 when there are none)."""
    return min((e.ts_ns for e in events), default=0)


def _step_markers(ax: Axes, events: Sequence[Event], kind: str, origin: int, **style: Any) -> bool:
    """Scatter one marker per ``kind`` event that names a step, at (its time, its step); False when none."""
    marked = [e for e in events if e.kind == kind and e.get_int("step") is not None]
    if marked:
        xs = [_s(e.ts_ns, origin) for e in marked]
        ax.scatter(xs, [e.get_int("step") or 0 for e in marked], linewidths=1.2, **style)
    return bool(marked)


def _s(ts_ns: int, origin: int) -> float:
    return (ts_ns - origin) / 1e9


def fault_marks(events: Sequence[Event], origin: int) -> list[FaultMark]:
    """Every ``fault.applied`` with its end: the first later ``fault.healed`` of the same op and host (fields
    either event lacks do not rule a match out), else ``data.duration_s``, else one-shot."""
    heals = [e for e in events if e.kind == FAULT_HEALED]
    used: set[int] = set()
    marks = []
    for applied in sorted((e for e in events if e.kind == FAULT_APPLIED), key=lambda e: e.ts_ns):
        fault = applied.get_str("fault") or "?"
        op = applied.get_str("op") or fault
        host = applied.get_str("host")
        start = _s(applied.ts_ns, origin)
        heal = next(
            (k for k, h in enumerate(heals) if k not in used and h.ts_ns >= applied.ts_ns and _same_op(applied, h)),
            None,
        )
        duration = applied.data.get("duration_s")
        if heal is not None:
            used.add(heal)
            marks.append(FaultMark(fault, op, host, start, _s(heals[heal].ts_ns, origin), "healed"))
        elif isinstance(duration, (int, float)) and not isinstance(duration, bool) and duration > 0:
            marks.append(FaultMark(fault, op, host, start, start + float(duration), "duration"))
        else:
            marks.append(FaultMark(fault, op, host, start, None, "one-shot"))
    return marks


def _same_op(applied: Event, healed: Event) -> bool:
    for key in ("fault", "op", "host"):
        a, b = applied.data.get(key), healed.data.get(key)
        if a is not None and b is not None and a != b:
            return False
    return True


def _decimate(xs: Sequence[float], ys: Sequence[float], limit: int = MAX_POINTS) -> tuple[list[float], list[float]]:
    """At most ``limit`` points, evenly strided, always keeping the last one."""
    if len(xs) <= limit:
        return list(xs), list(ys)
    stride = math.ceil(len(xs) / limit)
    keep = list(range(0, len(xs), stride))
    if keep[-1] != len(xs) - 1:
        keep.append(len(xs) - 1)
    return [xs[k] for k in keep], [ys[k] for k in keep]


def _short(kind: str) -> str:
    return kind.split(".", 1)[1] if "." in kind else kind


def _detect_label(event: Event) -> str:
    """``hang r1`` (the event's rank); ``link r0-r1`` for a detection naming a pair (``ranks``, e.g. detect.link)."""
    pair = event.data.get("ranks")
    if event.rank is None and isinstance(pair, list) and len(pair) == 2:
        return f"{_short(event.kind)} r{pair[0]}-r{pair[1]}"
    return _short(event.kind) + ("" if event.rank is None else f" r{event.rank}")


def _clusters(xs: list[tuple[float, str]], gap: float) -> list[tuple[float, str]]:
    """Labels at nearly the same x merged into one (``"a, b"``) so they do not print over each other."""
    merged: list[tuple[float, list[str]]] = []
    for x, text in sorted(xs):
        if merged and x - merged[-1][0] < gap:
            if text not in merged[-1][1]:
                merged[-1][1].append(text)
        else:
            merged.append((x, [text]))
    return [(x, _cut(", ".join(texts))) for x, texts in merged]


def _cut(text: str, limit: int = LABEL_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def plot_run_timeline(events: Sequence[Event], *, title: str = "", width_in: float = 12.0, dpi: int = 100) -> bytes:
    """The timeline PNG (bytes) of ``events`` (any order). Panels as in the module docstring; a history with
    no events at all gives a small plot that says so."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    events = sorted(events, key=lambda e: e.ts_ns)
    origin = origin_of(events)
    steps = [e for e in events if e.kind == TARGET_STEP and e.get_int("step") is not None]
    reqs = request_events(events)
    rail = [e for e in events if e.kind not in _RAIL_SKIP and e.kind not in POST_RUN]
    rows = [r for r in _RAIL_ROWS if any(_row_of(e) == r for e in rail)]
    if any(_row_of(e) not in _RAIL_ROWS for e in rail):
        rows.append("other")

    panels: list[tuple[str, float]] = []
    if steps:
        panels.append(("progress", 3.6))
    if reqs:
        panels.append(("serving", 3.0))
    ladder = ladder_series(events, origin) if reqs else None
    if ladder is not None:
        panels.append(("ladder", 0.9 + 0.3 * len(ladder.rungs)))
    panels.append(("events", 0.45 + 0.32 * max(1, len(rows))))
    fig = Figure(figsize=(width_in, sum(h for _, h in panels) + 0.9), dpi=dpi)
    FigureCanvasAgg(fig)
    axes = fig.subplots(
        len(panels), 1, sharex=True, squeeze=False, gridspec_kw={"height_ratios": [h for _, h in panels]}
    )[:, 0]
    by_name: dict[str, Axes] = {name: ax for (name, _), ax in zip(panels, axes, strict=True)}

    xmax = max(
        [_s(e.ts_ns, origin) for e in events if e.kind not in POST_RUN]
        + [_s(scheduled_ns(e), origin) for e in reqs]
        + [0.0]
    )
    marks = fault_marks(events, origin)
    xmax = max([xmax] + [m.end_s for m in marks if m.end_s is not None])
    xmax = xmax if xmax > 0 else 1.0
    for ax in axes:
        ax.set_xlim(-0.01 * xmax, xmax * 1.02)
        ax.set_axisbelow(True)
        ax.grid(axis="x", color="#eeeeee", linewidth=0.6)

    if "progress" in by_name:
        _progress(by_name["progress"], events, steps, origin)
    if "serving" in by_name:
        _serving(by_name["serving"], reqs, origin)
    if ladder is not None:
        draw_ladder(by_name["ladder"], ladder)
    _rail(by_name["events"], rail, rows, origin)
    if not events:
        by_name["events"].text(
            0.5, 0.5, "no events recorded", ha="center", va="center", transform=by_name["events"].transAxes
        )

    _overlays(list(axes), events, marks, origin, xmax)
    axes[-1].set_xlabel("seconds since the run's first event")
    if title:
        fig.suptitle(title, fontsize=11, x=0.01, ha="left")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


def _row_of(event: Event) -> str:
    family = event.kind.split(".", 1)[0]
    return family if family in _RAIL_ROWS else "other"


def _progress(ax: Axes, events: Sequence[Event], steps: Sequence[Event], origin: int) -> None:
    """Step against time: per rank (colour) and attempt (a separate line), checkpoints and resumes on it."""
    from matplotlib.lines import Line2D

    lines: dict[tuple[int, int], tuple[list[float], list[float]]] = {}
    for e in steps:
        rank = e.rank if e.rank is not None else -1
        attempt = e.get_int("attempt") or 0
        xs, ys = lines.setdefault((rank, attempt), ([], []))
        xs.append(_s(e.ts_ns, origin))
        ys.append(float(e.get_int("step") or 0))
    ranks = sorted({rank for rank, _ in lines})
    color = {rank: f"C{k % 10}" for k, rank in enumerate(ranks)}
    # ranks in lockstep draw on top of each other: lower ranks get wider lines so every rank stays visible
    width = {rank: 1.2 + 2.4 * (len(ranks) - 1 - k) / max(1, len(ranks) - 1) for k, rank in enumerate(ranks)}
    for (rank, attempt), (xs, ys) in sorted(lines.items()):
        dx, dy = _decimate(xs, ys)
        style = "-" if attempt == 0 else (0, (4, 1.5))
        ax.plot(dx, dy, color=color[rank], linewidth=width[rank], linestyle=style, solid_capstyle="butt")
        ax.plot(dx[-1:], dy[-1:], marker="o", markersize=2.5, color=color[rank])
    handles: list[Any] = [
        Line2D([], [], color=color[r], linewidth=width[r], label="rank ?" if r < 0 else f"rank {r}") for r in ranks
    ]
    if any(attempt > 0 for _, attempt in lines):
        handles.append(Line2D([], [], color="#757575", linestyle=(0, (4, 1.5)), label="after a restart"))
    if _step_markers(ax, events, TARGET_CHECKPOINT, origin, marker="|", s=90, color="#212121", zorder=4):
        handles.append(Line2D([], [], color="#212121", marker="|", linestyle="", markersize=9, label="checkpoint"))
    if _step_markers(
        ax, events, TARGET_RESUME, origin, marker="o", s=28, facecolors="none", edgecolors=_RESTART_COLOR, zorder=5
    ):
        handles.append(
            Line2D([], [], color=_RESTART_COLOR, marker="o", markerfacecolor="none", linestyle="", label="resume")
        )
    # For chaos.checks.storage_recovery: failed save tries, and each rank's restore end (the straggler's is late).
    if _step_markers(ax, events, TARGET_CHECKPOINT_RETRY, origin, marker="x", s=30, color="#c62828", zorder=5):
        handles.append(Line2D([], [], color="#c62828", marker="x", linestyle="", label="save retried"))
    restores = [e for e in events if e.kind == TARGET_RESTORE and e.get_int("step") is not None]
    for e in restores:  # a bar per rank over its own reading time: duration_s up to the event
        took = e.data.get("duration_s")
        begin = _s(e.ts_ns, origin) - (float(took) if isinstance(took, int | float) else 0.0)
        ax.hlines(e.get_int("step") or 0, begin, _s(e.ts_ns, origin), colors=color.get(e.rank or 0, "C0"), linewidth=6)
    if restores:
        handles.append(Line2D([], [], color="#757575", linewidth=6, label="restore (each rank's read)"))
    # For chaos.checks.checkpoint: the checkpoint a rank rejected while choosing where to resume, drawn at
    # its step, so the fallback reads off the plot: rejected at 30, resume circle at 20.
    if _step_markers(ax, events, TARGET_CHECKPOINT_REJECTED, origin, marker="X", s=60, color="#e53935", zorder=6):
        handles.append(Line2D([], [], color="#e53935", marker="X", linestyle="", label="checkpoint rejected"))
    ax.set_ylabel("step")
    ax.set_ylim(bottom=0, top=max(max(ys) for _, ys in lines.values()) * 1.3 + 1)
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)


def _serving(ax: Axes, reqs: Sequence[Event], origin: int) -> None:
    """Requests/s stacked by backend (ok) and error status, p99 latency per bin on a twin axis."""
    import numpy as np

    binned = bin_requests(reqs, origin)
    edges, width, rates, colors = binned.edges, binned.width, binned.rates, binned.colors
    ok_names, err_names = binned.ok_names, binned.err_names
    names = [f"ok: {n}" for n in ok_names] + [f"error: {n}" for n in err_names]
    ax.stackplot(edges, *[np.append(r, r[-1:]) for r in rates], step="post", labels=names, colors=colors, alpha=0.8)
    ax.set_ylabel("requests / s")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.2)
    p99 = binned.p99
    twin = ax.twinx()
    twin.plot(edges[:-1] + width / 2, p99, color="black", linewidth=1.1, label="p99 latency")
    twin.set_ylabel("p99 latency (s)")
    twin.set_ylim(0, max(twin.get_ylim()[1], 1e-3) * 1.2)
    errors = sum(not is_ok(e) for e in reqs)
    handles, legend_names = ax.get_legend_handles_labels()
    more, more_names = twin.get_legend_handles_labels()
    ax.legend(
        handles + more,
        legend_names + more_names,
        loc="upper left",
        bbox_to_anchor=(1.06, 1.0),
        fontsize=8,
        frameon=False,
        title=f"{len(reqs)} requests, {errors / len(reqs):.2%} errors",
        title_fontsize=8,
    )


def _rail(ax: Axes, rail: Sequence[Event], rows: list[str], origin: int) -> None:
    """One row of ticks per event family; failed faults as crosses."""
    for k, row in enumerate(rows):
        xs = [_s(e.ts_ns, origin) for e in rail if _row_of(e) == row and e.kind != FAULT_FAILED]
        dx, _ = _decimate(xs, [0.0] * len(xs))
        ax.scatter(dx, [k] * len(dx), marker="|", s=60, color="#455a64", linewidths=1.0)
        failed = [_s(e.ts_ns, origin) for e in rail if e.kind == FAULT_FAILED and row == "fault"]
        if failed:
            ax.scatter(failed, [k] * len(failed), marker="x", s=30, color="#c62828", zorder=5)
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.set_ylim(-0.7, max(len(rows), 1) - 0.3)
    ax.invert_yaxis()
    ax.tick_params(axis="y", length=0)


def _overlays(axes: list[Axes], events: Sequence[Event], marks: Sequence[FaultMark], origin: int, xmax: float) -> None:
    """Fault windows, one-shot faults, detections and restarts on every panel; their labels on the top one.

    Each kind of mark is one collection per panel, so a fault or detection storm stays a few artists. Labels
    that would overprint are merged; with more than :data:`MAX_LABELS` of a kind, each fault is labelled once
    (``name ×N``) and detections and restarts are left to the legend, which counts them."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    top = axes[0]
    where = top.get_xaxis_transform()  # x in data, y in axes fraction
    gap = 0.012 * xmax
    colors: dict[str, str] = {}
    for m in marks:
        colors.setdefault(m.fault, _FAULT_COLORS[len(colors) % len(_FAULT_COLORS)])
    for fault, color in colors.items():
        mine = [m for m in marks if m.fault == fault]
        bars = [(m.start_s, max(m.end_s - m.start_s, xmax * 0.002)) for m in mine if m.end_s is not None]
        shots = [m.start_s for m in mine if m.end_s is None]
        for ax in axes:
            band = ax.get_xaxis_transform()
            if bars:
                ax.broken_barh(bars, (0, 1), transform=band, facecolors=color, alpha=0.13, zorder=0, linewidth=0)
            if shots:
                ax.vlines(shots, 0, 1, transform=band, colors=color, linewidth=1.8, alpha=0.9, zorder=3)
        if bars:
            top.broken_barh(bars, (0.94, 0.06), transform=where, facecolors=color, alpha=0.6, linewidth=0)
    fault_labels = _clusters([(m.start_s, m.fault) for m in marks], gap)
    if len(fault_labels) > MAX_LABELS:
        counts = {f: sum(m.fault == f for m in marks) for f in colors}
        firsts = {f: min(m.start_s for m in marks if m.fault == f) for f in colors}
        fault_labels = _clusters([(firsts[f], f if counts[f] == 1 else f"{f} ×{counts[f]}") for f in colors], gap)
    for x, text in fault_labels:
        top.text(x, 0.965, f" {text}", transform=where, va="center", fontsize=8, fontweight="bold", zorder=6)

    detections = [e for e in events if e.kind.startswith("detect.")]
    # An in-place rollback (target.rollback, every rank) is drawn like a restart: training went back to a step.
    restarts = _one_per_restart([e for e in events if e.kind in (TARGET_RESTART, TARGET_ROLE_RESTART, ROLLBACK)])
    for ax in axes:
        band = ax.get_xaxis_transform()
        if detections:
            xs = [_s(e.ts_ns, origin) for e in detections]
            ax.vlines(xs, 0, 1, transform=band, colors=_DETECT_COLOR, linestyles="--", linewidth=0.8, zorder=3)
        if restarts:
            xs = [_s(e.ts_ns, origin) for e in restarts]
            ax.vlines(xs, 0, 1, transform=band, colors=_RESTART_COLOR, linestyles=":", linewidth=1.3, zorder=3)
    detect_labels = _clusters([(_s(e.ts_ns, origin), _detect_label(e)) for e in detections], gap)
    restart_labels = _clusters([(_s(e.ts_ns, origin), _restart_label(e)) for e in restarts], gap)
    for labels, color, side in ((detect_labels, _DETECT_COLOR, "left"), (restart_labels, _RESTART_COLOR, "right")):
        if len(labels) > MAX_LABELS:
            continue
        for x, text in labels:
            top.text(
                x, 0.9, f" {text}", transform=where, rotation=90, va="top", ha=side, fontsize=7, color=color, zorder=6
            )

    handles: list[Any] = [
        Patch(color=colors[f], alpha=0.5, label=f"fault {f}")
        if any(m.end_s is not None for m in marks if m.fault == f)
        else Line2D([], [], color=colors[f], linewidth=1.8, label=f"fault {f} (one-shot)")
        for f in colors
    ]
    if detections:
        label = "detection" if len(detections) == 1 else f"detections ({len(detections)})"
        handles.append(Line2D([], [], color=_DETECT_COLOR, linestyle="--", linewidth=0.8, label=label))
    if restarts:
        label = "restart" if len(restarts) == 1 else f"restarts ({len(restarts)})"
        label = label.replace("restart", "restart/rollback") if any(e.kind == ROLLBACK for e in restarts) else label
        handles.append(Line2D([], [], color=_RESTART_COLOR, linestyle=":", linewidth=1.3, label=label))
    if handles:
        axes[-1].legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)


def _one_per_restart(events: list[Event]) -> list[Event]:
    """One ``target.restart`` per (host, attempt): the launcher's tree and the reference trainer's rank 0 may
    both report the same restart (the first report stands); other kinds pass unchanged."""
    seen: set[tuple[str, int]] = set()
    kept = []
    for event in events:
        number = event.get_int("attempt")
        if event.kind == ROLLBACK:  # one per rollback, not one per rank
            number = event.get_int("rollbacks")
            key = ("rollback", -1 if number is None else number)
            if key in seen:
                continue
            seen.add(key)
        elif event.kind == TARGET_RESTART and number is not None:
            key = (event.get_str("host") or "local", number)
            if key in seen:
                continue
            seen.add(key)
        kept.append(event)
    return kept


def _restart_label(event: Event) -> str:
    if event.kind == ROLLBACK:
        return f"rollback {event.get_int('from_step')}→{event.get_int('to_step')}"
    attempt = event.get_int("attempt")
    what = "restart" if event.kind == TARGET_RESTART else f"restart {event.get_str('replica') or ''}".strip()
    return what if attempt is None else f"{what} #{attempt}"
