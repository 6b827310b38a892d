"""The serving report on a hand-made history: the summary's numbers, and the PNG and HTML it writes."""

from __future__ import annotations

import base64
import json
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from test_serving_checks import GOOD, KILL, kill_events, load, overload, scenario

from chaos.checks.base import CHECKS, CheckResult
from chaos.history.timeline import History
from chaos.report.serving import SERVING_HTML, TIMELINE_PNG, serving_summary, write_serving_report


def results_for(history: History, scn: Any) -> list[CheckResult]:
    wanted: list[tuple[str, dict[str, Any]]] = [
        ("error_rate", {"fault": KILL, "until": "serving.backend_up", "max": 0.01}),
        ("failover_within", {"fault": KILL}),
        ("failback_within", {"fault": KILL, "since": "backend_up", "within": "1s"}),
        ("no_flapping", {}),
    ]
    return [CHECKS[name].evaluate(history, CHECKS[name].Params.model_validate(p), scn) for name, p in wanted]


def window(summary: dict[str, Any], fault: str | None, name: str) -> dict[str, Any]:
    return next(w for w in summary["windows"] if w.get("fault") == fault and w["window"] == name)


def test_summary_numbers_on_a_kill_with_failover() -> None:
    history = History.from_events(GOOD)
    scn = scenario()
    summary = serving_summary(history, scn, results_for(history, scn))
    assert summary is not None
    json.dumps(summary)  # JSON-able, for run.json
    whole = window(summary, None, "all")
    assert whole["requests"] == 1000 and whole["error_rate"] == pytest.approx(1 / 1000)
    assert whole["p50_s"] == pytest.approx(0.01) and whole["p99_s"] == pytest.approx(0.01)
    before, during, after = (window(summary, KILL, k) for k in ("before", "during", "after"))
    assert before["requests"] == 250 and before["fallback_share"] == 0.0
    # a kill has no heal: the report ends it at the primary's backend_up (9.5 s)
    assert during["intervals_s"] == [[5.0, 9.5]] and during["requests"] == 225
    assert during["fallback_share"] == 1.0 and during["error_rate"] == pytest.approx(1 / 225)
    assert during["p99_s"] == pytest.approx(0.01) and during["statuses"] == {"200": 224, "timeout": 1}
    assert after["requests"] == 525 and after["fallback_share"] == pytest.approx(5 / 525)
    assert whole["degraded_share"] == 0.0
    (fault,) = summary["faults"]
    (op,) = fault["ops"]
    assert op["applied_s"] == 5.0
    assert op["failover"]["outcome"] == "ok" and op["failover"]["seconds"] == pytest.approx(0.02)
    assert op["failback"]["outcome"] == "ok" and op["failback"]["seconds"] == pytest.approx(2.6)  # from replica_start
    assert summary["priorities"] == {"-": {"requests": 1000, "ok": 999, "shed": 0, "errors": 1}}
    assert [c["status"] for c in summary["checks"]] == ["pass", "pass", "pass", "pass"]


def test_summary_counts_shedding_per_priority() -> None:
    summary = serving_summary(History.from_events(overload()), scenario(faults=()), [])
    assert summary is not None and summary["faults"] == []
    assert summary["priorities"]["premium"]["shed"] == 0
    assert summary["priorities"]["free"]["shed"] == 125  # odd requests in 10..15 s
    assert summary["priorities"]["free"]["errors"] == 0


def test_no_requests_no_report(tmp_path: Path) -> None:
    history = History.from_events(kill_events())
    assert serving_summary(history, scenario(), []) is None
    assert write_serving_report(tmp_path, history, scenario(), []) == []
    assert list(tmp_path.iterdir()) == []


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.cells: list[str] = []
        self._in_td = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "img":
            self.images.append(dict(attrs).get("src") or "")
        self._in_td = tag == "td" or self._in_td

    def handle_endtag(self, tag: str) -> None:
        if tag == "td":
            self._in_td = False

    def handle_data(self, data: str) -> None:
        if self._in_td:
            self.cells.append(data)


def test_report_files_are_written_and_self_contained(tmp_path: Path) -> None:
    events = load(
        lambda t: (503, "gateway") if 5 <= t < 5.3 else ((200, "fallback") if 5 <= t < 9.6 else (200, "primary"))
    )
    history = History.from_events(events + kill_events())
    scn = scenario()
    results = results_for(history, scn)
    written = write_serving_report(tmp_path, history, scn, results)
    assert written == [tmp_path / TIMELINE_PNG, tmp_path / SERVING_HTML]
    png = (tmp_path / TIMELINE_PNG).read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    page = _Page()
    page.feed((tmp_path / SERVING_HTML).read_text(encoding="utf-8"))
    (src,) = page.images
    assert src.startswith("data:image/png;base64,") and base64.b64decode(src.split(",", 1)[1]) == png
    text = " ".join(page.cells)
    for result in results:
        assert result.name in page.cells and result.reason in text
    assert "failover_within[kill-primary]" in page.cells and "fail" in page.cells  # error_rate fails here
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp files left behind
