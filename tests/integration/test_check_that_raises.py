"""A check with a bug: a real run whose check raises ends ``unknown`` (which fails it) with the traceback as the
check's evidence, and every report is still written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import scenario_yaml, ticker

from chaos.plugins import check as check_module
from chaos.plugins import registry
from chaos.run.orchestrator import RunOptions, execute
from chaos.run.result import EXIT_FAIL
from chaos.spec.scenario import parse_scenario


def test_a_check_that_raises_is_unknown_with_its_traceback_and_the_reports_are_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = registry.checks()  # (first: it imports the built-in check modules, which register into CHECKS)
    monkeypatch.setattr(check_module, "CHECKS", {})  # register into a scratch table, not the real one

    @check_module.register_check("completes", real["completes"].Params, summary="a check with a bug")
    def broken(history: object, params: object, scenario: object) -> check_module.CheckResult:
        raise ZeroDivisionError("the check divided by a count of zero")

    monkeypatch.setattr(registry, "checks", lambda: {**real, "completes": check_module.CHECKS["completes"]})
    text = scenario_yaml("raising-check", 1, ticker(5), checks=[{"type": "completes"}], safety={"max_duration": "60s"})
    result = execute(parse_scenario(text), RunOptions(report_root=tmp_path))

    assert result.exit_code == EXIT_FAIL, (result.error, result.ended_by)
    (judged,) = [r for r in result.results if r.check == "completes"]
    assert judged.status == "unknown"
    assert "ZeroDivisionError: the check divided by a count of zero" in judged.reason
    assert any("in broken" in line for line in judged.evidence), judged.evidence
    for name in ("run.json", "junit.xml", "report.html", "history.jsonl"):
        assert (result.run_dir / name).is_file(), name
    written = json.loads((result.run_dir / "run.json").read_text())
    assert [c["status"] for c in written["checks"] if c["check"] == "completes"] == ["unknown"]
