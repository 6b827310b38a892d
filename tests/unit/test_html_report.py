"""The HTML run report and its timeline: hand-made training and serving run documents, hostile strings, and
documents that are partly missing or malformed. The report of a real kill-rank run is in
tests/e2e/test_e2e_report.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support import PNG_SIGNATURE, parsed, png_size, timeline_png

from chaos.history.timeline import Event, History
from chaos.report.html import REPORT_HTML, render_html, write_html_report
from chaos.report.serving import serving_summary
from chaos.report.timeline import fault_marks, plot_run_timeline

T0 = 1_700_000_000_000_000_000


def ev(t: float, kind: str, rank: int | None = None, source: str = "runner", **data: Any) -> Event:
    return Event(ts_ns=T0 + round(t * 1e9), kind=kind, rank=rank, source=source, data=data)


def training_events() -> list[Event]:
    events = [ev(0, "runner.start", scenario="kill-rank", seed=1234)]
    events += [ev(1.0 + r * 0.01, "target.start", rank=r, source="target", pid=100 + r, attempt=0) for r in (0, 1)]
    for step in range(1, 26):
        events += [ev(2 + step * 0.1, "target.step", rank=r, source="target", step=step, attempt=0) for r in (0, 1)]
    events += [ev(3.0, "target.checkpoint", rank=0, source="target", step=10, attempt=0)]
    events += [ev(4.0, "target.checkpoint", rank=0, source="target", step=20, attempt=0)]
    events += [
        ev(
            4.55,
            "fault.applied",
            fault="kill-rank1",
            op="kill-rank1#1",
            injector="kill",
            host="local",
            description="SIGKILL rank 1 (pid 101)",
            duration_s=None,
        )
    ]
    events += [ev(4.6, "detect.collective_error", rank=0, source="target", detector="gloo", message="reset", step=26)]
    events += [ev(5.0, "runner.note", text="rank 1 gone, watching", author="oncall")]
    events += [ev(6.0, "target.restart", rank=0, source="target", attempt=1)]
    events += [ev(7.0 + r * 0.01, "target.resume", rank=r, source="target", step=20, attempt=1) for r in (0, 1)]
    for step in range(21, 41):
        events += [
            ev(7 + (step - 20) * 0.1, "target.step", rank=r, source="target", step=step, attempt=1) for r in (0, 1)
        ]
    events += [ev(8.5, "runner.operator", command="heal_all", text="", author="oncall")]
    events += [ev(9.5, "target.exit", code=0), ev(9.6, "runner.end", reason="target exited (0)")]
    events += [ev(20.0, "runner.golden", digest="abc", cached=True), ev(20.1, "runner.verdict", verdict="fail")]
    return events


def check(name: str, status: str, evidence: list[str], **more: Any) -> dict[str, Any]:
    return {
        "check": name.split("[")[0],
        "name": name,
        "status": status,
        "measured": more.get("measured", 1.5),
        "bound": more.get("bound", "<= 30s"),
        "unit": "s",
        "reason": more.get("reason", ""),
        "evidence": evidence,
    }


def op(op_id: str, fault: str, **more: Any) -> dict[str, Any]:
    return {
        "op_id": op_id,
        "fault": fault,
        "injector": more.get("injector", "kill"),
        "trigger": more.get("trigger", "at_step"),
        "at_s": more.get("at_s"),
        "at_step": more.get("at_step", 25),
        "rank": 1,
        "event_kind": None,
        "event_nth": None,
        "duration_s": more.get("duration_s"),
        "params": more.get("params", {"rank": 1, "signal": "SIGKILL", "pid": None}),
    }


def document(events: list[Event], **updates: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "format": "mlchaos.run/1",
        "scenario": {
            "name": "kill-rank",
            "description": "SIGKILL rank 1 at step 25",
            "faults": [{"name": "kill-rank1", "hosts": None}, {"name": "never", "hosts": {"role": "worker"}}],
        },
        "seed": 1234,
        "plan": {
            "scenario": "kill-rank",
            "seed": 1234,
            "ops": [op("kill-rank1#1", "kill-rank1"), op("never#1", "never", trigger="after", at_s=99.0, at_step=None)],
        },
        "verdict": "fail",
        "exit_code": 1,
        "ended_by": "target exited (0)",
        "error": None,
        "golden_digest": "abc",
        "checks": [
            check("detected_within[kill-rank1]", "pass", ["fault.applied kill-rank1 (op kill-rank1#1) at +4.550s"]),
            check(
                "recovered_within[kill-rank1]",
                "fail",
                ["target.step rank 1 step 26 attempt 1 at +7.600s"],
                reason="too slow",
            ),
            check("exactly_once", "unknown", [], measured=None, bound=None, reason="no sample ids"),
        ],
        "replay": "mlchaos run scenarios/kill-rank.yaml --seed 1234",
        "harness": {"python": "3.11.7", "argv": ["mlchaos", "run", "scenarios/kill-rank.yaml"]},
        "events": [e.model_dump(mode="json") for e in events],
    }
    doc.update(updates)
    return doc


def test_training_document_renders_every_part() -> None:
    doc = document(training_events())
    page = parsed(render_html(doc))
    text = page.all_text
    png = timeline_png(page)
    assert png_size(png)[0] >= 1000
    for c in doc["checks"]:
        assert c["name"] in text
    assert "mlchaos run scenarios/kill-rank.yaml --seed 1234" in text and "1234" in text
    assert "FAIL" in text and "too slow" in text and "+4.550s" in text
    # the plan: every op, and what became of it
    assert "kill-rank1#1" in text and "never#1" in text and "never fired" in text
    assert "applied +4.550s on local: SIGKILL rank 1 (pid 101)" in text
    assert '{"role": "worker"}' in text  # a host selector, shown as given
    # operator commands and notes, and the events table (load.request never listed)
    assert "rank 1 gone, watching" in text and "heal_all" in text
    assert "details" in page.tags and "runner.golden" in text
    assert "Serving" not in text  # no load, no serving section


def test_serving_document_has_the_serving_panel_and_tables() -> None:
    events = [ev(0, "runner.start"), ev(0.5, "load.start", source="load")]
    for i in range(400):  # 100 req/s for 4 s; the primary is down from 1.5 s to 2.5 s
        t = 0.5 + i * 0.01
        down = 1.5 <= t < 2.5
        status: Any = "timeout" if down and i % 50 == 0 else 200
        events.append(
            ev(
                t + 0.01,
                "load.request",
                source="load",
                i=i,
                scheduled_ns=T0 + round(t * 1e9),
                latency_s=0.5 if status == "timeout" else 0.01,
                status=status,
                backend=None if status == "timeout" else ("fallback" if down else "primary"),
            )
        )
    events += [
        ev(
            1.5,
            "fault.applied",
            fault="stall-primary",
            op="stall-primary#1",
            injector="freeze",
            host="local",
            duration_s=1.0,
        )
    ]
    events += [ev(1.8, "detect.backend_down", backend="primary", source="target")]
    events += [ev(2.5, "fault.healed", fault="stall-primary", op="stall-primary#1", injector="freeze", host="local")]
    events += [ev(2.6, "serving.backend_up", backend="primary", source="target")]
    events += [ev(4.6, "load.end", source="load"), ev(4.7, "runner.end", reason="load finished")]
    summary = serving_summary(History.from_events(events), None, [])
    assert summary is not None
    doc = document(events, serving=json.loads(json.dumps(summary)), checks=[], plan={"ops": []})
    page = parsed(render_html(doc, files=["serving.html", "run.json"]))
    text = page.all_text
    assert "Serving" in text and "Failover and failback" in text and "Windows" in text
    assert "stall-primary" in text and "400 requests" in text
    assert "400 load.request events counted, not listed" in text
    assert '<a href="serving.html">' in render_html(doc, files=["serving.html"])
    serving_png = timeline_png(page)
    without_load = plot_run_timeline([e for e in events if e.kind != "load.request"])
    assert png_size(serving_png)[1] > png_size(without_load)[1]  # the serving panel is there


def test_hostile_strings_are_escaped() -> None:
    evil = "<script>alert('x')</script>"
    events = training_events() + [
        ev(4.56, "fault.applied", fault=evil, op=f"{evil}#1", injector="kill", description=evil),
        ev(4.7, f"detect.{evil}", rank=0, message=evil),
    ]
    doc = document(events, ended_by=evil, error=evil, replay=f"mlchaos run '{evil}' --seed 1")
    doc["scenario"]["name"] = evil
    doc["scenario"]["description"] = evil
    doc["checks"].append(check(f"detected_within[{evil}]", "fail", [evil], bound=evil, reason=evil))
    doc["plan"]["ops"].append(op(f"{evil}#1", evil, params={"x": evil}))
    doc["harness"]["argv"] = [evil]
    page_text = render_html(doc, files=[f"{evil}.log"])
    assert "<script" not in page_text.lower()
    assert "&lt;script&gt;" in page_text
    page = parsed(page_text)
    assert evil in page.all_text  # shown, as text
    timeline_png(page)


def test_partial_and_malformed_documents_still_render() -> None:
    page = parsed(render_html({"format": "mlchaos.run/1"}))
    assert "no checks ran" in page.all_text
    timeline_png(page)  # "no events recorded"
    doc = document(training_events(), checks=[{"name": "broken"}, "junk"], seed=None, plan="junk", verdict=None)
    doc["events"] += [{"kind": "no timestamp"}, 42]
    page = parsed(render_html(doc))
    assert "2 unreadable, skipped" in page.all_text and "broken" in page.all_text


def test_write_html_report_reads_run_json_and_writes_atomically(tmp_path: Path) -> None:
    (tmp_path / "run.json").write_text(json.dumps(document(training_events())), encoding="utf-8")
    (tmp_path / "junit.xml").write_text("<testsuite/>", encoding="utf-8")
    path = write_html_report(tmp_path, png=PNG_SIGNATURE + b"fake")
    assert path == tmp_path / REPORT_HTML
    assert sorted(p.name for p in tmp_path.iterdir()) == ["junit.xml", "report.html", "run.json"]
    page = path.read_text(encoding="utf-8")
    assert '<a href="junit.xml">' in page and '<a href="run.json">' in page and 'href="history.jsonl"' not in page
    with pytest.raises(FileNotFoundError):
        write_html_report(tmp_path / "missing")
    (tmp_path / "run.json").write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(ValueError, match="JSON object"):
        write_html_report(tmp_path)
    # the runner passes the document it just wrote, so nothing is read back
    held = tmp_path / "held"
    held.mkdir()
    page = write_html_report(held, document=document(training_events(), seed=987654)).read_text(encoding="utf-8")
    assert "987654" in page and 'href="run.json"' not in page


def test_fault_marks_pair_heals_by_op_and_fall_back_to_duration() -> None:
    events = [
        ev(0, "runner.start"),
        ev(1, "fault.applied", fault="part", op="part#1", host="a"),
        ev(1, "fault.applied", fault="part", op="part#1", host="b"),
        ev(3, "fault.healed", fault="part", op="part#1", host="b"),
        ev(4, "fault.healed", fault="part", op="part#1", host="a"),
        ev(5, "fault.applied", fault="slow", op="slow#1", duration_s=2.5),
        ev(6, "fault.applied", fault="kill", op="kill#1", duration_s=None),
    ]
    marks = [(m.fault, m.host, m.start_s, m.end_s, m.ended_by) for m in fault_marks(events, T0)]
    assert marks == [
        ("part", "a", 1.0, 4.0, "healed"),
        ("part", "b", 1.0, 3.0, "healed"),
        ("slow", None, 5.0, 7.5, "duration"),
        ("kill", None, 6.0, None, "one-shot"),
    ]


def test_long_runs_are_decimated_and_still_plot() -> None:
    events = [
        ev(k * 0.001, "target.step", rank=r, source="target", step=k, attempt=0) for k in range(20_000) for r in (0, 1)
    ]
    png = plot_run_timeline(events, title="long")
    assert png.startswith(PNG_SIGNATURE)


def test_fault_and_detection_storms_still_plot() -> None:
    # a Poisson storm: 500 windows of 5 faults and 2000 detections, labelled per fault name, counted in the legend
    events = []
    for k in range(500):
        events += [
            ev(k * 0.2, "fault.applied", fault=f"f{k % 5}", op=f"f#{k}"),
            ev(k * 0.2 + 0.05, "fault.healed", fault=f"f{k % 5}", op=f"f#{k}"),
        ]
        events += [ev(k * 0.2 + j * 1e-6, f"detect.kind{j}", rank=j) for j in range(4)]
    events += [ev(s * 0.02, "target.step", rank=0, source="target", step=s) for s in range(5000)]
    assert plot_run_timeline(events, title="storm").startswith(PNG_SIGNATURE)
