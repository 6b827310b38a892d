"""The scenario front door refuses what could only give a false pass: non-finite durations, a
scenario with no checks; and the JSON Schema `mlchaos schema` prints accepts the scenarios that ship."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support import ROOT

from chaos.spec.scenario import ScenarioError, json_schema, load_scenario, parse_scenario
from chaos.spec.units import parse_duration

BASE = """\
name: t
target: {type: command, command: [sleep, "1"]}
"""
CHECKED = BASE + "checks: [{type: completes}]\n"
FINITE = "a duration must be a finite number of seconds, like 30s, 2m"


def _problems(text: str) -> list[str]:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(text, "bad.yaml")
    return [str(problem) for problem in info.value.problems]


# --- 1. non-finite durations -------------------------------------------------------------------------------
# Defect pinned: parse_duration took NaN and infinity (YAML .nan/.inf, the strings "nan"/"inf", 1e999), so
# `no_progress_timeout: nan` validated and a watch that compares with NaN never fires.


@pytest.mark.parametrize("value", [".nan", ".inf", ".NaN", "nan", "inf", "'nan'", "'inf'", "'infinity'", "1.0e999"])
def test_a_non_finite_duration_is_refused_at_its_line(value: str) -> None:
    problems = _problems(CHECKED + f"safety:\n  no_progress_timeout: {value}\n")
    assert len(problems) == 1, problems
    assert problems[0].startswith("bad.yaml:5:")
    assert "safety.no_progress_timeout" in problems[0] and FINITE in problems[0]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), "nan", "inf", "Infinity", "1e999"])
def test_parse_duration_refuses_non_finite(value: object) -> None:
    with pytest.raises(ValueError, match="finite number of seconds"):
        parse_duration(value)


def test_non_finite_is_refused_on_every_duration_field() -> None:
    text = CHECKED.replace("checks:", "faults:\n  - {type: kill, params: {pid: 1234}, trigger: {after: .inf}}\nchecks:")
    problems = _problems(text)
    assert len(problems) == 1 and "faults.0.trigger.after" in problems[0] and FINITE in problems[0], problems


def test_null_zero_and_ordinary_durations_still_pass() -> None:
    # null switches the progress watch off; 0 is a valid heal grace; the usual forms are unchanged.
    scenario = parse_scenario(CHECKED + "safety: {no_progress_timeout: null, heal_grace: 0, max_duration: 1m30s}\n")
    assert scenario.safety.no_progress_timeout is None
    assert scenario.safety.heal_grace == 0.0 and scenario.safety.max_duration == 90.0
    assert parse_duration("500ms") == 0.5 and parse_duration(2) == 2.0 and parse_duration("1.5") == 1.5


def test_cli_validate_reports_a_non_finite_duration_with_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "nan.yaml"
    path.write_text(CHECKED + "safety: {no_progress_timeout: .nan}\n", encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "chaos.cli.commands", "validate", str(path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"{path}:4:" in result.stdout + result.stderr and FINITE in result.stdout + result.stderr


# --- 2. a scenario with no checks --------------------------------------------------------------------------
# Defect pinned: a scenario without checks validated and ran, and a run with nothing to judge it passes.


def test_a_scenario_without_a_checks_key_is_refused_at_the_file_start() -> None:
    problems = _problems(BASE)
    assert len(problems) == 1 and problems[0].startswith("bad.yaml:1:1: checks: "), problems
    assert "a scenario with no checks can only pass" in problems[0] and "allow_no_checks: true" in problems[0]


def test_an_empty_checks_list_is_refused_at_the_checks_key() -> None:
    problems = _problems(BASE + "checks: []\n")
    assert len(problems) == 1 and problems[0].startswith("bad.yaml:3:1: checks: "), problems
    assert "can only pass" in problems[0]


def test_no_checks_is_accepted_only_when_asked_for() -> None:
    for text in (BASE + "allow_no_checks: true\nchecks: []\n", BASE + "checks: []\nallow_no_checks: true\n"):
        scenario = parse_scenario(text)
        assert scenario.checks == [] and scenario.allow_no_checks
    assert "can only pass" in _problems(BASE + "allow_no_checks: false\nchecks: []\n")[0]
    assert not parse_scenario(CHECKED).allow_no_checks  # the default: checks are required


def test_allow_no_checks_is_documented_in_the_schema() -> None:
    field = json_schema()["properties"]["allow_no_checks"]
    assert field["type"] == "boolean" and field["default"] is False and "can only pass" in field["description"]


# --- 3. the JSON Schema accepts the shipped scenarios ------------------------------------------------------
# Defect pinned: `mlchaos schema` typed durations as numbers ("30s" was wrong), argv items as strings
# (`args: [--steps, 60]` was wrong) and floats as numbers only (`factor: 1.0e7` is a string in YAML 1.1).


@pytest.mark.parametrize("path", sorted((ROOT / "scenarios").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_scenario_validates_against_the_json_schema(path: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    load_scenario(path)  # the model takes it, so the schema must too
    validator = jsonschema.Draft202012Validator(json_schema())
    errors = [
        f"{list(e.absolute_path)}: {e.message[:120]}" for e in validator.iter_errors(yaml.safe_load(path.read_text()))
    ]
    assert errors == []


def test_the_json_schema_still_refuses_what_the_model_refuses() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft202012Validator(json_schema())
    good = yaml.safe_load(CHECKED + "safety: {max_duration: 1m30s, no_progress_timeout: 90}\n")
    assert validator.is_valid(good)
    for bad_duration in ("soon", "10 parsecs", "-5s", -5, True):
        bad = dict(good, safety={"max_duration": bad_duration})
        assert not validator.is_valid(bad), bad_duration
    assert not validator.is_valid(dict(good, target={"type": "command", "command": [["nested"]]}))


@pytest.mark.parametrize("fault", ["grad_corrupt", "bitflip"])
def test_a_bit_index_no_tensor_has_is_refused_at_validate(fault: str) -> None:
    params = "{bit: 99}" if fault == "grad_corrupt" else "{tensor: fc1.weight, bit: 99}"
    text = (
        "name: t\ntarget: {type: torchrun, module: chaos.reference.trainer, nproc_per_node: 2}\n"
        f"faults:\n  - {{name: f, type: {fault}, params: {params}, trigger: {{at_step: 3, rank: 1}}}}\n"
        "checks: [{type: completes}]\n"
    )
    with pytest.raises(
        ScenarioError, match=r"t.yaml:4:\d+: faults.0.params.bit: Input should be less than or equal to 63"
    ):
        parse_scenario(text, "t.yaml")
