"""Scenario loading: typed models, file:line:column errors with a fix, registry-built schema."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT

from chaos.spec.scenario import ScenarioError, json_schema, load_scenario, parse_scenario

GOOD = """\
name: t
seed: 7
target:
  type: command
  command: [python, -c, "print(1)"]
faults:
  - type: kill
    params: {pid: 1234}
    trigger: {after: 2s}
checks:
  - type: completes
"""


def test_good_scenario_is_typed_and_named() -> None:
    scenario = parse_scenario(GOOD, "good.yaml")
    assert scenario.seed == 7
    assert scenario.faults[0].name == "kill-1"
    assert scenario.faults[0].trigger.after == 2.0
    assert type(scenario.faults[0].params).__name__.endswith("Params")
    assert scenario.checks[0].name == "completes"


def _problems(text: str) -> list[str]:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(text, "bad.yaml")
    return [str(p) for p in info.value.problems]


def test_misspelt_top_level_key_names_line_and_suggestion() -> None:
    [problem] = _problems(GOOD.replace("seed: 7", "sede: 7"))
    assert problem.startswith("bad.yaml:2:1: unknown key 'sede'")
    assert "did you mean 'seed'" in problem


def test_misspelt_param_inside_a_fault_points_at_the_key() -> None:
    [problem] = _problems(GOOD.replace("{pid: 1234}", "{pid: 1234, sgnal: SIGTERM}"))
    assert problem.startswith("bad.yaml:8:25: unknown key 'sgnal'")
    assert "did you mean 'signal'" in problem


def test_unknown_fault_type_suggests_the_nearest() -> None:
    [problem] = _problems(GOOD.replace("type: kill", "type: kil"))
    assert "bad.yaml:7:" in problem and "unknown type 'kil'" in problem and "did you mean 'kill'" in problem


def test_bad_duration_and_trigger_are_explained() -> None:
    [problem] = _problems(GOOD.replace("{after: 2s}", "{after: soon}"))
    assert "bad.yaml:9:" in problem and "not a duration" in problem
    [problem] = _problems(GOOD.replace("{after: 2s}", "{after: 2s, at_step: 4}"))
    assert "exactly one of" in problem


def test_check_naming_an_undefined_fault_is_refused() -> None:
    text = GOOD + "  - type: detected_within\n    params: {fault: kill-2, within: 5s}\n"
    [problem] = _problems(text)
    assert "bad.yaml:13:" in problem and "'kill-2'" in problem and "did you mean 'kill-1'" in problem


def test_yaml_syntax_error_has_position() -> None:
    [problem] = _problems("name: x\ntarget: [unclosed\n")
    assert problem.startswith("bad.yaml:") and "YAML syntax" in problem


def test_duplicate_key_is_an_error() -> None:
    [problem] = _problems(GOOD.replace("seed: 7", "seed: 7\nseed: 8"))
    assert "duplicate key 'seed'" in problem and problem.startswith("bad.yaml:3:1")


def test_numbers_in_argv_become_strings() -> None:
    scenario = parse_scenario(GOOD.replace('[python, -c, "print(1)"]', "[sleep, 1]"))
    assert scenario.target.command == ["sleep", "1"]  # type: ignore[union-attr]


def test_schema_contains_every_registered_injector_and_check() -> None:
    text = str(json_schema())
    for name in ("Fault_kill", "Fault_freeze", "Fault_slow", "Check_detected_within", "Check_matches_golden"):
        assert name in text


@pytest.mark.parametrize("path", sorted((ROOT / "scenarios").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_scenarios_validate(path: Path) -> None:
    load_scenario(path)


def test_cli_validate_misspelt_key_exits_2_and_starts_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    bad = tmp_path / "bad.yaml"
    bad.write_text(GOOD.replace('[python, -c, "print(1)"]', f"[touch, {marker}]").replace("checks:", "chekcs:"))
    for verb in ("validate", "run"):
        extra = ["--report-dir", str(tmp_path)] if verb == "run" else []
        proc = subprocess.run(
            [sys.executable, "-m", "chaos.cli.commands", verb, str(bad), *extra],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=60,
        )
        assert proc.returncode == 2, proc.stderr
        assert f"{bad}:10:1: unknown key 'chekcs'" in proc.stderr
        assert "did you mean 'checks'" in proc.stderr
    assert not marker.exists()
