"""Write a run's machine-readable reports: ``run.json`` and ``junit.xml`` (``history.jsonl`` is live)."""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING
from xml.etree import ElementTree as ET

from chaos.checks.base import CheckResult
from chaos.report.html import write_html_report
from chaos.report.restarts import restarts_row_of
from chaos.report.serving import serving_summary, write_serving_report

if TYPE_CHECKING:
    from chaos.run.result import RunResult


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def replay_command(result: RunResult) -> str:
    """The command that re-runs this scenario with the same seed (and so the same plan)."""
    source = result.extra.get("scenario_file")
    where = shlex.quote(str(source)) if source else f"<{result.scenario.name}.yaml>"
    return f"mlchaos run {where} --seed {result.plan.seed}"


def run_document(result: RunResult) -> dict[str, object]:
    """Everything about a run in one JSON-able dict: scenario, seed, plan, events, checks with evidence."""
    return {
        "format": "mlchaos.run/1",
        "scenario": result.scenario.model_dump(mode="json"),
        "seed": result.plan.seed,
        "plan": result.plan.model_dump(mode="json"),
        "verdict": result.verdict,
        "exit_code": result.exit_code,
        "ended_by": result.ended_by,
        "error": result.error,
        "golden_digest": result.golden_digest,
        "checks": [r.model_dump(mode="json") for r in result.results],
        "restarts": row.to_json() if (row := restarts_row_of(result)) is not None else None,  # torchrun runs
        "replay": replay_command(result),
        "harness": {"python": sys.version.split()[0], "argv": sys.argv},
        "events": [e.model_dump(mode="json") for e in result.history.events],
    }


def junit_xml(result: RunResult) -> str:
    """One testsuite per run, one testcase per check, measured value and bound as properties."""
    results = list(result.results)
    suite = ET.Element(
        "testsuite",
        name=f"mlchaos.{result.scenario.name}",
        tests=str(max(len(results), 1)),
        failures=str(sum(r.status == "fail" for r in results)),
        errors="1" if result.verdict == "error" else "0",
        skipped="0",
    )
    if result.verdict == "error":
        case = ET.SubElement(suite, "testcase", classname=result.scenario.name, name="harness")
        ET.SubElement(case, "error", message=result.error or result.ended_by)
    for check in results:
        case = ET.SubElement(suite, "testcase", classname=result.scenario.name, name=check.name)
        props = ET.SubElement(case, "properties")
        _prop(props, "status", check.status)
        _prop(props, "measured", check.measured_text())
        _prop(props, "bound", check.bound or "")
        if check.status == "fail" or (check.status == "unknown" and not result.scenario.allow_unknown):
            ET.SubElement(case, "failure", message=_failure_message(check)).text = "\n".join(check.evidence)
    ET.indent(suite)
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"


def _prop(parent: ET.Element, name: str, value: str) -> None:
    ET.SubElement(parent, "property", name=name, value=value)


def _failure_message(check: CheckResult) -> str:
    bound = f" (bound {check.bound})" if check.bound else ""
    return f"{check.status}: measured {check.measured_text()}{bound}. {check.reason}".strip()


def write_reports(result: RunResult) -> None:
    """``run.json`` and ``junit.xml``; for a run with serving load also ``serving.html`` and its timeline PNG
    (and the window table, failover and failback times under ``serving`` in run.json); last ``report.html``,
    the whole run on one page (it links the files above)."""
    document = run_document(result)
    serving = serving_summary(result.history, result.scenario, result.results)
    if serving is not None:
        document["serving"] = serving
    _atomic_write(result.run_dir / "run.json", json.dumps(document, indent=1) + "\n")
    _atomic_write(result.run_dir / "junit.xml", junit_xml(result))
    if serving is not None:
        write_serving_report(result.run_dir, result.history, result.scenario, list(result.results), summary=serving)
    write_html_report(result.run_dir, document=document)
