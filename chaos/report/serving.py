"""The serving report: what clients saw around each fault, as numbers (for run.json), a plot and one HTML page.

- :func:`serving_summary` is a pure function of the history: per-window request stats (the whole load, and
  before/during/after each applied fault), failover and failback times per applied op (the same logic as the
  ``failover_within`` / ``failback_within`` checks, with their defaults), and shed counts per priority.
- :func:`write_serving_report` writes ``serving-timeline.png`` and a self-contained ``serving.html`` (the PNG
  inlined as base64) into the run folder.

Times are seconds from the history's first event, the same origin as the ``+12.301s`` offsets in check
evidence, so a number in a table can be found on the plot and in the evidence alike.
"""

from __future__ import annotations

import base64
import bisect
import html
import math
import os
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from chaos.checks._evidence import origin_ns
from chaos.checks.base import CheckResult
from chaos.checks.serving.events import (
    FaultSpan,
    applied_ops,
    backend_of,
    events_of,
    fault_spans,
    is_shed,
    load_span,
    priority_of,
)
from chaos.checks.serving.measures import OpTime, failback_times, failover_times
from chaos.checks.serving.windows import Window, WindowKind, WindowParams, resolve_window
from chaos.event_kinds import FAULT_APPLIED
from chaos.event_kinds import SERVING_BACKEND_UP as BACKEND_UP
from chaos.history.timeline import Event, History
from chaos.load.summary import is_ok, latency_s, percentile, request_events, responded, scheduled_ns, status_of
from chaos.spec.serving import PRIMARY

if TYPE_CHECKING:
    from chaos.spec.scenario import Scenario

TIMELINE_PNG = "serving-timeline.png"
SERVING_HTML = "serving.html"
BIN_S = 0.5  # width of one plot bin; more than ~400 bins are widened to keep the plot readable
MAX_BINS = 400
_KINDS: tuple[WindowKind, ...] = ("before", "during", "after")
_OK_COLORS = {PRIMARY: "#2e7d32", "fallback": "#1565c0", "cache": "#f9a825"}
_ERROR_COLORS = ("#c62828", "#6a1b9a", "#ad1457", "#4e342e", "#e65100", "#37474f")


def _offset(ns: int, origin: int) -> float:
    return round((ns - origin) / 1e9, 6)


def _faults_in_order(history: History) -> list[str]:
    names: list[str] = []
    for e in events_of(history, FAULT_APPLIED):
        name = e.get_str("fault")
        if name is not None and name not in names:
            names.append(name)
    return names


class _Row(NamedTuple):
    """What the stats need of one request, read once (a long load has tens of thousands)."""

    ok: bool
    backend: str | None
    latency: float | None  # answered or timed out (at the timeout); else None, left out of percentiles
    degraded: bool | None  # answered and flagged either way
    status: str


def _row(event: Event) -> _Row:
    answered = responded(event)
    degraded = event.data.get("degraded")
    return _Row(
        is_ok(event),
        backend_of(event),
        latency_s(event) if answered or status_of(event) == "timeout" else None,
        degraded if answered and isinstance(degraded, bool) else None,
        str(status_of(event)),
    )


def _window_stats(name: str, window: Window, rows: Sequence[_Row], keys: Sequence[int], origin: int) -> dict[str, Any]:
    """Request stats of one window: counts, error rate, p50/p99 (timeouts at the timeout), shares."""
    chosen = [
        rows[k]
        for lo, hi in window.intervals
        for k in range(bisect.bisect_left(keys, lo), bisect.bisect_left(keys, hi))
    ]
    lat = [r.latency for r in chosen if r.latency is not None]
    served = [r for r in chosen if r.ok and r.backend is not None]
    flags = [r.degraded for r in chosen if r.degraded is not None]
    ok = sum(r.ok for r in chosen)
    return {
        "window": name,
        "intervals_s": [[_offset(a, origin), _offset(b, origin)] for a, b in window.intervals],
        "requests": len(chosen),
        "ok": ok,
        "error_rate": (len(chosen) - ok) / len(chosen) if chosen else None,
        "p50_s": percentile(lat, 50),
        "p99_s": percentile(lat, 99),
        "fallback_share": sum(r.backend != PRIMARY for r in served) / len(served) if served else None,
        "degraded_share": sum(flags) / len(flags) if flags else None,
        "statuses": dict(Counter(r.status for r in chosen).most_common()),
        "backends": dict(Counter(r.backend or "?" for r in chosen if r.ok).most_common()),
    }


def _fault_windows(
    history: History, scenario: Scenario | None, fault: str, load: tuple[int, int]
) -> list[tuple[WindowKind, Window]]:
    """The fault's before/during/after windows; ops without a heal or duration end at the primary's next
    ``serving.backend_up`` (the load's end when it never came), as with ``until: serving.backend_up``."""
    open_ended = any(span.end_ns is None for span in fault_spans(history, scenario, fault))
    until, backend = (BACKEND_UP, PRIMARY) if open_ended else (None, None)
    found = []
    for kind in _KINDS:
        params = WindowParams(fault=fault, window=kind, until=until, until_backend=backend)
        window = resolve_window(history, scenario, params, load=load)
        if isinstance(window, Window):
            found.append((kind, window))
    return found


def _time(t: OpTime) -> dict[str, Any]:
    return {"outcome": t.outcome, "seconds": t.seconds, "note": t.note}


def _shaded_spans(history: History, scenario: Scenario | None, fault: str, end_ns: int) -> list[tuple[int, int]]:
    """Each op's [apply, end) for the plot: heal or duration, else the primary's backend_up, else the load end."""
    found: list[tuple[int, int]] = []
    fallback: list[FaultSpan] = fault_spans(history, scenario, fault, until=BACKEND_UP, until_backend=PRIMARY)
    for span, other in zip(fault_spans(history, scenario, fault), fallback, strict=True):
        end = span.end_ns if span.end_ns is not None else other.end_ns
        found.append((span.applied.ts_ns, max(span.applied.ts_ns, end if end is not None else end_ns)))
    return found


def serving_summary(
    history: History, scenario: Scenario | None, results: Iterable[CheckResult]
) -> dict[str, Any] | None:
    """Numbers for run.json (JSON-able); None when the history holds no ``load.request`` event."""
    reqs = request_events(history.events)
    span = load_span(history.events)
    if not reqs or span is None:
        return None
    origin = origin_ns(history)
    rows = [_row(e) for e in reqs]
    keys = [scheduled_ns(e) for e in reqs]
    windows = [_window_stats("all", Window("the whole load", (span,), ()), rows, keys, origin)]
    faults = []
    for fault in _faults_in_order(history):
        for kind, window in _fault_windows(history, scenario, fault, span):
            windows.append({"fault": fault, **_window_stats(kind, window, rows, keys, origin)})
        over = failover_times(history, fault, reqs=reqs)
        back = failback_times(history, scenario, fault, reqs=reqs)
        ops = []
        for k, op in enumerate(applied_ops(history, fault)):
            entry: dict[str, Any] = {"applied_s": _offset(op.ts_ns, origin)}
            if k < len(over):
                entry["failover"] = _time(over[k])
            if k < len(back):
                entry["failback"] = _time(back[k])
            ops.append(entry)
        faults.append({"fault": fault, "ops": ops})
    priorities: dict[str, dict[str, int]] = {}
    for e, r in zip(reqs, rows, strict=True):
        counts = priorities.setdefault(priority_of(e) or "-", {"requests": 0, "ok": 0, "shed": 0, "errors": 0})
        shed = is_shed(e)
        counts["requests"] += 1
        counts["ok"] += r.ok
        counts["shed"] += shed
        counts["errors"] += not r.ok and not shed
    return {
        "format": "mlchaos.serving/1",
        "load": {"start_s": _offset(span[0], origin), "end_s": _offset(span[1], origin), "requests": len(reqs)},
        "windows": windows,
        "faults": faults,
        "priorities": dict(sorted(priorities.items())),
        "checks": [
            {"name": r.name, "check": r.check, "status": r.status, "measured": r.measured, "bound": r.bound}
            for r in results
        ],
    }


# ---------------------------------------------------------------------------------------------------------
# plot


def _category(event: Event) -> str:
    if is_ok(event):
        return backend_of(event) or "ok (backend ?)"
    return f"{status_of(event)}"


def _latency(event: Event) -> float:
    """Latency for the p99 line: answered or timed out (at the timeout), else NaN (left out)."""
    value = latency_s(event)
    return value if value is not None and (responded(event) or status_of(event) == "timeout") else math.nan


class BinnedRequests(NamedTuple):
    """Requests per bin of scheduled send time: rates stacked by category, and the p99 latency per bin."""

    edges: Any  # numpy array of bin edges, seconds since the origin
    width: float  # seconds per bin
    ok_names: list[str]  # categories of ok requests (backends), known backends first
    err_names: list[str]  # categories of failed requests (statuses)
    rates: list[Any]  # per category (ok_names then err_names): requests/s in each bin
    colors: list[str]  # per category
    p99: list[float]  # per bin (NaN where no request has a latency)


def bin_requests(
    reqs: Sequence[Event], origin: int, lo: float | None = None, hi: float | None = None
) -> BinnedRequests:
    """Bin ``reqs`` (non-empty; by scheduled time, seconds since ``origin``) over ``[lo, hi]`` (default: from the
    first to just past the last request) in bins of at least BIN_S seconds and at most MAX_BINS bins; shared
    by serving.html's plot and report.html's timeline."""
    import numpy as np

    times = np.array([(scheduled_ns(e) - origin) / 1e9 for e in reqs])
    lo = float(times.min()) if lo is None else lo
    hi = float(times.max()) + 1e-3 if hi is None else hi
    width = max(BIN_S, (hi - lo) / MAX_BINS)
    edges = lo + width * np.arange(math.ceil((hi - lo) / width) + 1)
    cats = [_category(e) for e in reqs]
    ok_cats = {c for c, e in zip(cats, reqs, strict=True) if is_ok(e)}
    ok_names = sorted((c for c in ok_cats if c in _OK_COLORS), key=list(_OK_COLORS).index)
    ok_names += sorted(c for c in ok_cats if c not in _OK_COLORS)
    err_names = sorted(set(cats) - ok_cats)
    index = {name: k for k, name in enumerate(ok_names + err_names)}
    codes = np.array([index[c] for c in cats])
    rates = [np.histogram(times[codes == k], bins=edges)[0] / width for k in range(len(index))]
    colors = [_OK_COLORS.get(n, "#78909c") for n in ok_names] + [
        _ERROR_COLORS[k % len(_ERROR_COLORS)] for k in range(len(err_names))
    ]
    order = np.argsort(times, kind="stable")
    times, lat = times[order], np.array([_latency(e) for e in reqs])[order]
    bounds = np.searchsorted(times, edges)
    p99 = []
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        values = np.sort(lat[a:b][~np.isnan(lat[a:b])])
        p99.append(float(values[max(1, math.ceil(0.99 * len(values))) - 1]) if len(values) else math.nan)
    return BinnedRequests(edges, width, ok_names, err_names, rates, colors, p99)


def plot_timeline(path: Path, history: History, scenario: Scenario | None) -> Path | None:
    """Write the timeline PNG: requests per second by scheduled time, stacked by backend (ok) and status
    (errors), the p99 latency per bin on a second axis, fault windows shaded, ``detect.*`` events as lines."""
    reqs = request_events(history.events)
    span = load_span(history.events)
    if not reqs or span is None:
        return None
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    origin = origin_ns(history)
    lo, hi = _offset(span[0], origin), _offset(max(span[1], scheduled_ns(reqs[-1]) + 1), origin)
    binned = bin_requests(reqs, origin, lo, hi)
    edges, width, rates, colors = binned.edges, binned.width, binned.rates, binned.colors
    labels = binned.ok_names + binned.err_names

    fig = Figure(figsize=(12, 5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    # step="post" holds each value to the next x: repeat the last bin's value at the right edge
    ax.stackplot(edges, *[np.append(r, r[-1:]) for r in rates], step="post", labels=labels, colors=colors, alpha=0.85)
    ax.set_xlim(lo, hi)
    ax.set_xlabel("seconds since the run's first event (requests by scheduled send time)")
    ax.set_ylabel("requests / s")
    p99 = binned.p99
    ax2 = ax.twinx()
    ax2.plot(edges[:-1] + width / 2, p99, color="black", linewidth=1.2, label="p99 latency")
    ax2.set_ylabel("p99 latency (s)")
    top = ax.get_ylim()[1] * 1.25  # headroom above the stack for the fault and detection labels
    ax.set_ylim(0, top)
    ax2.set_ylim(0, ax2.get_ylim()[1] * 1.25)
    for k, fault in enumerate(_faults_in_order(history)):
        for a, b in _shaded_spans(history, scenario, fault, span[1]):
            x0, x1 = _offset(a, origin), _offset(b, origin)
            # over the stack (which would hide a background shade): a light veil, edges and a band on top
            ax.axvspan(x0, x1, color="#9e9e9e", alpha=0.18, zorder=3, linewidth=0)
            ax.axvspan(x0, x1, ymin=0.93, ymax=1.0, color=f"C{k}", alpha=0.6, zorder=3, linewidth=0)
            ax.text(x0, top * 0.965, f" {fault}", va="center", fontsize=8, zorder=4)
    for e in events_of(history, "detect.*"):
        x = _offset(e.ts_ns, origin)
        if lo <= x <= hi:
            ax.axvline(x, color="#424242", linestyle="--", linewidth=0.8)
            what = e.get_str("backend") or ""
            ax.text(x, top * 0.9, f" {e.kind.removeprefix('detect.')} {what}", rotation=90, va="top", fontsize=7)
    handles, names = ax.get_legend_handles_labels()
    more, more_names = ax2.get_legend_handles_labels()
    ax.legend(handles + more, names + more_names, loc="upper left", bbox_to_anchor=(1.06, 1), fontsize=8)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp")
    fig.savefig(tmp, format="png")
    os.replace(tmp, path)
    return path


# ---------------------------------------------------------------------------------------------------------
# html


def _num(value: object, unit: str = "", digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}{unit}"
    return f"{value}{unit}"


def _table(head: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    cells = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{cells}</tr></thead><tbody>{body}</tbody></table>"


def _transition(entry: dict[str, Any] | None) -> str:
    if entry is None:
        return "-"
    if entry["outcome"] == "ok":
        return _num(entry["seconds"], "s")
    return html.escape(f"{entry['outcome']}: {entry['note']}")


def serving_html(summary: dict[str, Any], results: Sequence[CheckResult], png: bytes | None, title: str) -> str:
    """The self-contained page: plot (inline base64 PNG), window table, transitions, priorities, checks."""
    esc = html.escape
    windows = _table(
        ["fault", "window", "interval (s)", "requests", "error rate", "p50", "p99", "fallback share", "degraded"],
        (
            [
                esc(w.get("fault") or "-"),
                esc(w["window"]),
                esc(", ".join(f"{a:.2f}..{b:.2f}" for a, b in w["intervals_s"]) or "empty"),
                str(w["requests"]),
                _num(w["error_rate"], digits=4),
                _num(w["p50_s"], "s"),
                _num(w["p99_s"], "s"),
                _num(w["fallback_share"], digits=3),
                _num(w["degraded_share"], digits=3),
            ]
            for w in summary["windows"]
        ),
    )
    transitions = _table(
        ["fault", "applied (s)", "failover", "failback"],
        (
            [esc(f["fault"]), _num(op["applied_s"]), _transition(op.get("failover")), _transition(op.get("failback"))]
            for f in summary["faults"]
            for op in f["ops"]
        ),
    )
    priorities = _table(
        ["priority", "requests", "ok", "shed", "other errors"],
        (
            [esc(name), str(r["requests"]), str(r["ok"]), str(r["shed"]), str(r["errors"])]
            for name, r in summary["priorities"].items()
        ),
    )
    checks = _table(
        ["check", "status", "measured", "bound", "reason", "evidence"],
        (
            [
                esc(r.name),
                f'<span class="{esc(r.status)}">{esc(r.status)}</span>',
                esc(r.measured_text()),
                esc(r.bound or "-"),
                esc(r.reason),
                "<ul>" + "".join(f"<li>{esc(line)}</li>" for line in r.evidence) + "</ul>",
            ]
            for r in results
        ),
    )
    image = (
        f'<img alt="serving timeline" src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">'
        if png is not None
        else "<p>no plot</p>"
    )
    style = (
        "body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse;margin-bottom:1.5em}"
        "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top;font-size:13px}"
        "img{max-width:100%}.pass{color:#2e7d32}.fail{color:#c62828}.unknown{color:#ef6c00}ul{margin:0;padding-left:1.2em}"
    )
    load = summary["load"]
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{esc(title)}</title><style>{style}</style></head>"
        f"<body><h1>{esc(title)}</h1><p>{load['requests']} requests, load {load['start_s']:.2f}s..{load['end_s']:.2f}s "
        "(seconds since the run's first event; requests placed by scheduled send time)</p>"
        f"{image}<h2>Windows</h2>{windows}<h2>Failover and failback</h2>{transitions}"
        f"<h2>Priorities</h2>{priorities}<h2>Checks</h2>{checks}</body></html>\n"
    )


def write_serving_report(
    run_dir: Path,
    history: History,
    scenario: Scenario | None,
    results: Sequence[CheckResult],
    *,
    summary: dict[str, Any] | None = None,
) -> list[Path]:
    """Write ``serving-timeline.png`` and ``serving.html`` into ``run_dir``; the paths written (none when the
    history holds no ``load.request`` event). ``summary``: :func:`serving_summary`'s result, when the caller
    has it already (run.json carries it too)."""
    summary = serving_summary(history, scenario, results) if summary is None else summary
    if summary is None:
        return []
    png_path = plot_timeline(run_dir / TIMELINE_PNG, history, scenario)
    png = png_path.read_bytes() if png_path is not None else None
    title = f"serving report: {getattr(scenario, 'name', None) or run_dir.name}"
    page = run_dir / SERVING_HTML
    tmp = page.with_name(f".{page.name}.tmp")
    tmp.write_text(serving_html(summary, results, png, title), encoding="utf-8")
    os.replace(tmp, page)
    return [p for p in (png_path, page) if p is not None]
