"""The HTML run report: one self-contained ``report.html`` rebuilt from ``run.json`` alone.

:func:`render_html` turns a run document (``mlchaos.run/1``, see :func:`chaos.report.files.run_document`) into
one page with no external assets (inline CSS, the timeline PNG as a base64 data URI): the header (scenario,
verdict, how the run ended, seed, duration), the timeline (:func:`chaos.report.timeline.plot_run_timeline`),
the check table with evidence, the plan with what became of every op, operator commands and notes, how to
replay the run, the serving windows and failover/failback times when the run had load, and the events.
:func:`write_html_report` reads a run folder's ``run.json`` and writes ``report.html`` next to it (atomically).

Every string that came from the run (names, evidence, event data, errors) is escaped; the document is read
defensively (a field of the wrong type shows as ``-``, an event that does not validate is counted, not fatal)
so a report can be rebuilt from an old or partly written run.json. Times are seconds since the run's first
event, the origin of the ``+12.301s`` offsets in check evidence.
"""

from __future__ import annotations

import base64
import html
import json
import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

from pydantic import ValidationError

from chaos.checks.base import CheckResult
from chaos.event_kinds import (
    FAULT_APPLIED,
    FAULT_FAILED,
    FAULT_HEALED,
    FAULT_OVERLAP,
    LOAD_REQUEST,
    RUNNER_END,
    RUNNER_NOTE,
    RUNNER_OPERATOR,
    RUNNER_START,
)
from chaos.history.timeline import Event, History
from chaos.plan.build import PlannedOp
from chaos.report.restarts import RestartsRow, restarts_row_of_document
from chaos.report.timeline import POST_RUN, origin_of, plot_run_timeline

REPORT_HTML = "report.html"
RUN_JSON = "run.json"
MAX_EVENTS = 500
"""The events table lists at most this many events (``load.request`` are never listed, only counted)."""
DATA_CHARS = 300
"""Event data longer than this (as compact JSON) is cut, with an ellipsis."""
LINKED_FILES = (
    "run.json",
    "history.jsonl",
    "junit.xml",
    "serving.html",
    "serving-timeline.png",
    "target.log",
    "events.jsonl",
)
"""Files of the run folder the report links to (relative links) when they exist."""

_OPERATOR_KINDS = (RUNNER_OPERATOR, RUNNER_NOTE)
_STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:1.5em auto;max-width:1300px;padding:0 1em;color:#212121}
h1{margin-bottom:.2em}h2{margin-top:1.6em;border-bottom:1px solid #e0e0e0;padding-bottom:.2em}
.muted{color:#757575}.small{font-size:12px}
table{border-collapse:collapse;margin:.5em 0 1em}
td,th{border:1px solid #d0d0d0;padding:3px 8px;text-align:left;vertical-align:top;font-size:13px}
th{background:#f5f5f5}table.kv th{width:9em}
img{max-width:100%;border:1px solid #e0e0e0}
pre,code{font-family:ui-monospace,"DejaVu Sans Mono",monospace;font-size:12.5px}
pre{background:#f5f5f5;padding:.6em .8em;overflow-x:auto;white-space:pre-wrap;word-break:break-all}
ul{margin:0;padding-left:1.2em}
.pass{color:#2e7d32;font-weight:bold}.fail{color:#c62828;font-weight:bold}
.unknown{color:#ef6c00;font-weight:bold}.error{color:#6a1b9a;font-weight:bold}
.verdict{display:inline-block;padding:.15em .7em;border-radius:4px;color:#fff;font-weight:bold;letter-spacing:.05em}
.verdict.pass{background:#2e7d32}.verdict.fail{background:#c62828}
.verdict.error{background:#6a1b9a}.verdict.unknown{background:#ef6c00}
tr.bad td{background:#fff3f3}
details summary{cursor:pointer;font-weight:bold;margin:.4em 0}
"""


def esc(value: object) -> str:
    """Any value as escaped HTML text (quotes too, so it is safe inside attributes)."""
    return html.escape(str(value), quote=True)


# ---------------------------------------------------------------------------------------------------------
# reading the document defensively


def _map(doc: Mapping[str, object], key: str) -> Mapping[str, object]:
    value = doc.get(key)
    return value if isinstance(value, dict) else {}


def _list(doc: Mapping[str, object], key: str) -> list[object]:
    value = doc.get(key)
    return value if isinstance(value, list) else []


def _text(doc: Mapping[str, object], key: str, default: str = "-") -> str:
    value = doc.get(key)
    return default if value is None or value == "" else str(value)


def _events(document: Mapping[str, object]) -> tuple[list[Event], int]:
    """The document's events (time order) and how many did not validate (skipped, counted)."""
    events, bad = [], 0
    for raw in _list(document, "events"):
        try:
            events.append(Event.model_validate(raw))
        except ValidationError:
            bad += 1
    events.sort(key=lambda e: e.ts_ns)
    return events, bad


def _checks(document: Mapping[str, object]) -> list[CheckResult]:
    found = []
    for raw in _list(document, "checks"):
        try:
            found.append(CheckResult.model_validate(raw))
        except ValidationError:
            name = raw.get("name") if isinstance(raw, dict) else None
            found.append(
                CheckResult(check="?", name=str(name or "?"), status="unknown", reason="unreadable in run.json")
            )
    return found


def _ops(document: Mapping[str, object]) -> list[PlannedOp]:
    found = []
    for raw in _list(_map(document, "plan"), "ops"):
        try:
            found.append(PlannedOp.model_validate(raw))
        except ValidationError:
            continue
    return found


# ---------------------------------------------------------------------------------------------------------
# small builders


def _table(head: Sequence[str], rows: Iterable[Sequence[str]], *, row_class: Sequence[str] | None = None) -> str:
    """A table; ``head`` is plain text (escaped here), cells are HTML already escaped by the caller."""
    cells = "".join(f"<th>{esc(h)}</th>" for h in head)
    body = []
    for k, row in enumerate(rows):
        cls = row_class[k] if row_class is not None and k < len(row_class) and row_class[k] else ""
        attr = f' class="{esc(cls)}"' if cls else ""
        body.append(f"<tr{attr}>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>")
    return f"<table><thead><tr>{cells}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _kv(rows: Iterable[tuple[str, str]]) -> str:
    """A two-column key/value table; keys plain text, values HTML."""
    body = "".join(f"<tr><th>{esc(k)}</th><td>{v}</td></tr>" for k, v in rows)
    return f'<table class="kv"><tbody>{body}</tbody></table>'


def _offset(ts_ns: int, origin: int) -> str:
    return f"+{(ts_ns - origin) / 1e9:.3f}s"


def _status(status: str) -> str:
    return f'<span class="{esc(status)}">{esc(status)}</span>'


def _num(value: object, unit: str = "", digits: int = 3) -> str:
    if isinstance(value, bool) or value is None:
        return "-" if value is None else esc(value)
    if isinstance(value, float):
        return esc(f"{value:.{digits}f}{unit}")
    return esc(f"{value}{unit}")


def _compact(value: object, limit: int = DATA_CHARS) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


# ---------------------------------------------------------------------------------------------------------
# sections


def _duration(events: Sequence[Event]) -> float | None:
    """runner.start → runner.end when both were recorded, else first → last event of the run itself."""
    start = next((e.ts_ns for e in events if e.kind == RUNNER_START), None)
    end = next((e.ts_ns for e in reversed(events) if e.kind == RUNNER_END), None)
    run = [e.ts_ns for e in events if e.kind not in POST_RUN]
    if start is None and run:
        start = run[0]
    if end is None and run:
        end = run[-1]
    return None if start is None or end is None else (end - start) / 1e9


def _header(document: Mapping[str, object], events: Sequence[Event], checks: Sequence[CheckResult], bad: int) -> str:
    scenario = _map(document, "scenario")
    name = _text(scenario, "name", "run")
    verdict = _text(document, "verdict", "unknown")
    counts = Counter(c.status for c in checks)
    duration = _duration(events)
    started = datetime.fromtimestamp(events[0].ts_ns / 1e9, tz=UTC).isoformat(timespec="seconds") if events else "-"
    error = document.get("error")
    rows = [
        (
            "verdict",
            f'<span class="verdict {esc(verdict)}">{esc(verdict.upper())}</span> '
            f'<span class="muted">exit code {esc(_text(document, "exit_code"))}</span>',
        ),
        ("checks", ", ".join(f"{counts.get(s, 0)} {_status(s)}" for s in ("pass", "fail", "unknown"))),
        ("ended by", esc(_text(document, "ended_by"))),
        *([("error", f'<span class="fail">{esc(error)}</span>')] if error else []),
        ("seed", f"<code>{esc(_text(document, 'seed'))}</code>"),
        ("started", esc(started)),
        ("duration", "-" if duration is None else esc(f"{duration:.1f}s (runner.start to runner.end)")),
        ("golden digest", f"<code>{esc(_text(document, 'golden_digest'))}</code>"),
        ("events", esc(f"{len(events)}" + (f" ({bad} unreadable, skipped)" if bad else ""))),
    ]
    description = scenario.get("description")
    return (
        f"<h1>mlchaos run: {esc(name)}</h1>"
        + (f'<p class="muted">{esc(description)}</p>' if description else "")
        + _kv(rows)
    )


def _timeline(events: Sequence[Event], png: bytes | None, name: str) -> str:
    if png is None:
        try:
            png = plot_run_timeline(events, title=name)
        except Exception as exc:  # noqa: BLE001 - a report without its plot beats no report
            return f'<p class="error">the timeline could not be drawn: {esc(type(exc).__name__)}: {esc(exc)}</p>'
    data = base64.b64encode(png).decode("ascii")
    return (
        f'<img id="timeline" alt="run timeline: step progress, faults, detections, restarts" '
        f'src="data:image/png;base64,{data}">'
        '<p class="muted small">x: seconds since the run\'s first event (the +N.NNNs of the evidence). Shaded: a fault '
        "from applied to healed (or its duration); solid line: a one-shot fault (kill); dashed: a detection; "
        "dotted: a restart. Per-rank lines are split by restart attempt.</p>"
    )


def _checks_section(checks: Sequence[CheckResult], restarts: RestartsRow | None = None) -> str:
    """The verdict table; a torchrun run's ``restarts`` (used, budget, causes) as its last, informative row."""
    if not checks and restarts is None:
        return "<p>no checks ran (a run that ended before judging, or a scenario without checks)</p>"
    rows = [
        [
            f"<code>{esc(c.name)}</code>",
            _status(c.status),
            esc(c.measured_text()),
            esc(c.bound or "-"),
            esc(c.reason or "-"),
            "<ul>" + "".join(f"<li>{esc(line)}</li>" for line in c.evidence) + "</ul>" if c.evidence else "-",
        ]
        for c in checks
    ]
    classes = ["" if c.status == "pass" else "bad" for c in checks]
    if restarts is not None:
        name, status, measured, bound, why = restarts.cells()
        rows.append([f"<code>{esc(name)}</code>", esc(status), esc(measured), esc(bound), esc(why), "-"])
        classes.append("")
    return _table(["check", "status", "measured", "bound", "reason", "evidence"], rows, row_class=classes)


def _when(op: PlannedOp) -> str:
    rank = f" of rank {op.rank}" if op.rank is not None else ""
    if op.at_s is not None:
        return f"+{op.at_s:.2f}s after the fault clock starts"
    if op.at_step is not None:
        return f"step {op.at_step}{rank}"
    if op.event_kind is not None:
        return f"event #{op.event_nth or 1} {op.event_kind}{rank}"
    return "-"


def _hosts(document: Mapping[str, object]) -> dict[str, str]:
    """Fault name → its ``hosts`` selector as text (absent: the harness's own host)."""
    found: dict[str, str] = {}
    for raw in _list(_map(document, "scenario"), "faults"):
        if isinstance(raw, dict) and isinstance(raw.get("name"), str):
            hosts = raw.get("hosts")
            found[raw["name"]] = "local" if hosts is None else _compact(hosts, 120)
    return found


_VERBS = {FAULT_APPLIED: "applied", FAULT_HEALED: "healed", FAULT_FAILED: "failed", FAULT_OVERLAP: "overlap"}


def _fate(mine: Sequence[Event], origin: int) -> str:
    """What happened to a planned op (its fault.* events): applied (where, when), healed, failed, or never fired."""
    if not mine:
        return '<span class="muted">never fired</span>'
    lines = []
    for e in mine:
        verb = _VERBS[e.kind]
        host = e.get_str("host")
        why = e.get_str("error") or e.get_str("message") if e.kind == FAULT_FAILED else e.get_str("description")
        text = f"{verb} {_offset(e.ts_ns, origin)}" + (f" on {host}" if host else "") + (f": {why}" if why else "")
        lines.append(f'<li class="fail">{esc(text)}</li>' if e.kind == FAULT_FAILED else f"<li>{esc(text)}</li>")
    return "<ul>" + "".join(lines) + "</ul>"


def _plan_section(document: Mapping[str, object], events: Sequence[Event], origin: int) -> str:
    ops = _ops(document)
    seed = esc(_text(document, "seed"))
    if not ops:
        return f"<p>seed <code>{seed}</code>; the plan has no fault ops</p>"
    hosts = _hosts(document)
    by_op: dict[str, list[Event]] = {}
    for e in events:
        op_id = e.get_str("op") if e.kind in _VERBS else None
        if op_id is not None:
            by_op.setdefault(op_id, []).append(e)
    rows = [
        [
            f"<code>{esc(op.op_id)}</code>",
            esc(op.fault),
            esc(op.injector),
            esc(op.trigger) + "<br>" + esc(_when(op)),
            "-" if op.duration_s is None else esc(f"{op.duration_s:g}s"),
            esc(hosts.get(op.fault, "local")),
            f"<code>{esc(_compact({k: v for k, v in op.params.items() if v is not None}))}</code>",
            _fate(by_op.get(op.op_id, []), origin),
        ]
        for op in ops
    ]
    return f"<p>{len(ops)} op(s), expanded from the scenario's triggers with seed <code>{seed}</code>.</p>" + _table(
        ["op", "fault", "injector", "trigger / at", "duration", "hosts", "params", "what happened"], rows
    )


def _operator_section(events: Sequence[Event], origin: int) -> str:
    orders = [e for e in events if e.kind in _OPERATOR_KINDS]
    if not orders:
        return ""
    rows = [
        [
            esc(_offset(e.ts_ns, origin)),
            esc("note" if e.kind == RUNNER_NOTE else e.get_str("command") or "?"),
            esc(e.get_str("author") or "-"),
            esc(e.get_str("text") or ""),
        ]
        for e in orders
    ]
    return "<h2>Operator commands and notes</h2>" + _table(["at", "command", "author", "text"], rows)


def _replay_section(document: Mapping[str, object]) -> str:
    replay = _text(document, "replay", "")
    seed = esc(_text(document, "seed"))
    command = f"<pre>{esc(replay)}</pre>" if replay else "<p>no replay command recorded</p>"
    return (
        "<h2>Replay</h2>"
        + command
        + f"<p>The seed <code>{seed}</code> fixes the plan: the same scenario file and seed give the same fault ops "
        f"(<code>mlchaos plan FILE --seed {seed}</code> prints them without running anything). Step and event "
        "triggers fire at the same step or event; timings of the job itself may differ from run to run.</p>"
    )


def _serving_section(document: Mapping[str, object], files: Sequence[str]) -> str:
    serving = _map(document, "serving")
    if not serving:
        return ""
    link = ' (also <a href="serving.html">serving.html</a>)' if "serving.html" in files else ""
    load = _map(serving, "load")
    windows = [w for w in _list(serving, "windows") if isinstance(w, dict)]
    window_rows = [
        [
            esc(w.get("fault") or "-"),
            esc(w.get("window", "-")),
            esc(
                ", ".join(
                    f"{a:.2f}..{b:.2f}"
                    for a, b in (p for p in w.get("intervals_s") or [] if isinstance(p, list) and len(p) == 2)
                )
                or "empty"
            ),
            _num(w.get("requests")),
            _num(w.get("error_rate"), digits=4),
            _num(w.get("p50_s"), "s"),
            _num(w.get("p99_s"), "s"),
            _num(w.get("fallback_share")),
            _num(w.get("degraded_share")),
        ]
        for w in windows
    ]
    transitions = [
        [
            esc(f.get("fault", "?")),
            _num(op.get("applied_s")),
            _transition(op.get("failover")),
            _transition(op.get("failback")),
        ]
        for f in _list(serving, "faults")
        if isinstance(f, dict)
        for op in f.get("ops") or []
        if isinstance(op, dict)
    ]
    priorities = [
        [esc(name), *(_num(counts.get(k)) for k in ("requests", "ok", "shed", "errors"))]
        for name, counts in _map(serving, "priorities").items()
        if isinstance(counts, dict)
    ]
    return (
        f"<h2>Serving{link}</h2>"
        + f"<p>{_num(load.get('requests'))} requests, load {_num(load.get('start_s'), 's', 2)}"
        f" to {_num(load.get('end_s'), 's', 2)}; requests placed by scheduled send time.</p>"
        + "<h3>Windows</h3>"
        + _table(
            ["fault", "window", "interval (s)", "requests", "error rate", "p50", "p99", "fallback share", "degraded"],
            window_rows,
        )
        + (
            "<h3>Failover and failback</h3>" + _table(["fault", "applied (s)", "failover", "failback"], transitions)
            if transitions
            else ""
        )
        + (
            "<h3>Priorities</h3>" + _table(["priority", "requests", "ok", "shed", "other errors"], priorities)
            if priorities
            else ""
        )
    )


def _transition(entry: object) -> str:
    if not isinstance(entry, dict):
        return "-"
    if entry.get("outcome") == "ok":
        return _num(entry.get("seconds"), "s")
    return esc(f"{entry.get('outcome')}: {entry.get('note')}")


def _events_section(events: Sequence[Event], origin: int) -> str:
    counts = Counter(e.kind for e in events)
    listed = [e for e in events if e.kind != LOAD_REQUEST]
    shown = listed[:MAX_EVENTS]
    rows = [
        [
            esc(_offset(e.ts_ns, origin)),
            f"<code>{esc(e.kind)}</code>",
            "-" if e.rank is None else esc(e.rank),
            esc(e.source),
            f"<code>{esc(_compact(e.data))}</code>" if e.data else "",
        ]
        for e in shown
    ]
    more = f"; the first {len(shown)} of {len(listed)} listed" if len(shown) < len(listed) else ""
    requests = f"; {counts[LOAD_REQUEST]} load.request events counted, not listed" if counts[LOAD_REQUEST] else ""
    kinds = _table(["kind", "count"], ([f"<code>{esc(k)}</code>", esc(n)] for k, n in sorted(counts.items())))
    return (
        f"<h2>Events</h2><p>{len(events)} events{esc(more)}{esc(requests)}; every event is in run.json and history.jsonl.</p>"
        + f"<details><summary>counts by kind</summary>{kinds}</details>"
        + f"<details><summary>events ({len(shown)})</summary>"
        + _table(["at", "kind", "rank", "source", "data"], rows)
        + "</details>"
    )


def _footer(document: Mapping[str, object], files: Sequence[str]) -> str:
    harness = _map(document, "harness")
    argv = harness.get("argv")
    links = " · ".join(f'<a href="{esc(name)}">{esc(name)}</a>' for name in files)
    return (
        "<h2>Files and harness</h2>"
        + (f"<p>in this run folder: {links}</p>" if links else "")
        + _kv(
            [
                ("format", esc(_text(document, "format"))),
                ("python", esc(_text(harness, "python"))),
                ("argv", f"<code>{esc(' '.join(str(a) for a in argv) if isinstance(argv, list) else '-')}</code>"),
            ]
        )
    )


def render_html(run_document: Mapping[str, object], *, png: bytes | None = None, files: Sequence[str] = ()) -> str:
    """The whole page for one run document (``run.json`` parsed). ``png``: the timeline when the caller drew it
    already (else it is drawn here from the events); ``files``: names of sibling files in the run folder to link
    (relative links; the page itself embeds everything it shows)."""
    events, bad = _events(run_document)
    checks = _checks(run_document)
    origin = origin_of(events)
    name = _text(_map(run_document, "scenario"), "name", "run")
    body = (
        _header(run_document, events, checks, bad)
        + "<h2>Timeline</h2>"
        + _timeline(events, png, name)
        + "<h2>Checks</h2>"
        + _checks_section(checks, restarts_row_of_document(run_document, History.from_events(events)))
        + "<h2>Plan</h2>"
        + _plan_section(run_document, events, origin)
        + _operator_section(events, origin)
        + _replay_section(run_document)
        + _serving_section(run_document, files)
        + _events_section(events, origin)
        + _footer(run_document, files)
    )
    title = f"mlchaos {name}: {_text(run_document, 'verdict', 'unknown')}"
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{_STYLE}</style></head>\n<body>{body}</body></html>\n"
    )


def write_html_report(run_dir: Path, *, document: Mapping[str, object] | None = None, png: bytes | None = None) -> Path:
    """Write ``run_dir/report.html`` (atomically: a reader never sees half a page) and return its path.

    ``document``: the run document when the caller holds it (the runner, right after writing run.json); else it
    is read from ``run_dir/run.json``: FileNotFoundError when there is none, ValueError when it is not a JSON
    object. Files of :data:`LINKED_FILES` present in ``run_dir`` are linked, so write this one last."""
    if document is None:
        loaded = json.loads((run_dir / RUN_JSON).read_text(encoding="utf-8"))
        if not isinstance(loaded, dict):
            raise ValueError(f"{run_dir / RUN_JSON}: expected a JSON object, got {type(loaded).__name__}")
        document = loaded
    files = [name for name in LINKED_FILES if (run_dir / name).is_file()]
    page = run_dir / REPORT_HTML
    tmp = page.with_name(f".{page.name}.tmp")
    tmp.write_text(render_html(document, png=png, files=files), encoding="utf-8")
    os.replace(tmp, page)
    return page
