"""The first minutes of a new user: ``--version``, ``validate`` listing every problem at once with what would be
valid, ``--help`` readable in a pipe, ``make clean`` leaving nothing behind, ``chaos-plan.json`` documented."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from support import mlchaos
from typer.testing import CliRunner

import chaos
from chaos.cli.commands import app
from chaos.plan.agent_plan import InJobOp, InJobPlan
from chaos.spec.scenario import ScenarioError, parse_scenario

ROOT = Path(__file__).resolve().parents[2]

# Four mistakes in four places: a bad signal, a bad duration, a misspelt fault type (whose `type:` is not the
# first key of its mapping) and a check naming a fault that does not exist.
BAD = """\
name: t
target:
  type: command
  command: [sleep, "1"]
faults:
  - type: kill
    params: {pid: 1234, signal: SIGFOO}
    trigger: {after: soon}
  - name: second
    type: kil
    params: {pid: 1234}
    trigger: {after: 1s}
checks:
  - type: detected_within
    params: {fault: nope, within: 5s}
"""


def _problems(text: str) -> list[str]:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(text, "bad.yaml")
    return [str(p) for p in info.value.problems]


def test_version_prints_the_package_version_and_exits_0() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"mlchaos {chaos.__version__}"
    assert chaos.__version__ == "0.2.0"


def test_every_problem_of_a_file_is_reported_in_one_pass_in_file_order() -> None:
    problems = _problems(BAD)
    # The cross-check (an undefined fault) used to wait until every model error was fixed.
    assert [p.split(": ", 1)[0] for p in problems] == [
        "bad.yaml:7:25",
        "bad.yaml:8:15",
        "bad.yaml:10:5",
        "bad.yaml:15:14",
    ]
    assert "names fault 'nope', which is not defined" in problems[3]


def test_a_bad_value_says_what_would_be_valid_and_what_it_got() -> None:
    signal, duration = _problems(BAD)[:2]
    assert "faults.0.params.signal: expected one of SIGKILL, SIGTERM," in signal and "(got 'SIGFOO')" in signal
    assert "faults.0.trigger.after: expected a duration like 30s, 2m, 1.5h (got 'soon'" in duration
    [typo] = _problems(
        BAD.replace("signal: SIGFOO", "signal: SIGTREM")
        .replace("soon", "1s")
        .replace("nope", "kill-1")
        .replace("kil\n", "kill\n")
    )
    assert "(got 'SIGTREM')" in typo and "did you mean 'SIGTERM'?" in typo
    [literal] = _problems(
        BAD.replace("name: t\n", "name: t\ncluster: {transport: sshh}\n").split("faults:")[0]
        + "allow_no_checks: true\n"
    )
    assert literal.startswith("bad.yaml:2:11: cluster.transport: expected one of local, ssh (got 'sshh')")
    assert "did you mean 'ssh'?" in literal


def test_an_unknown_fault_type_points_at_its_type_key_and_suggests_names() -> None:
    unknown = _problems(BAD)[2]
    assert unknown.startswith("bad.yaml:10:5: faults.1: unknown type 'kil'"), unknown  # line 9 holds `name:`
    assert "did you mean 'kill'" in unknown
    [missing] = _problems(
        BAD.replace("    type: kil\n", "").split("checks:")[0].replace("SIGFOO", "SIGTERM").replace("soon", "1s")
        + "allow_no_checks: true\n"
    )
    assert "missing 'type'" in missing and re.search(r"set type to one of: .*\bkill\b", missing), missing


def test_cli_validate_lists_the_problems_of_every_file(tmp_path: Path) -> None:
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    first.write_text(BAD)
    second.write_text(BAD.replace("SIGFOO", "SIGTERM"))
    result = CliRunner().invoke(app, ["validate", str(first), str(second)])
    assert result.exit_code == 2
    assert result.output.count(f"{first}:") == 4 and result.output.count(f"{second}:") == 3, result.output
    assert "7 problem(s); nothing was run." in result.output


def test_help_in_a_pipe_is_not_cut_at_80_columns() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "TERMINAL_WIDTH")}
    proc = mlchaos("run", "--help", env=env)
    assert proc.returncode == 0, proc.stderr
    # The whole description of --nodes on the option's own line, not wrapped into a narrow column.
    [line] = [line for line in proc.stdout.splitlines() if "--nodes" in line]
    assert "run the scenario's torchrun job across inventory hosts: all, group:NAME[:COUNT] or host:NAME" in line
    assert max(len(line) for line in proc.stdout.splitlines()) > 80


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_clean_removes_everything_the_project_made(tmp_path: Path) -> None:
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    made = [
        ".venv/bin/python",
        ".mypy_cache/x",
        ".pytest_cache/x",
        ".ruff_cache/x",
        ".hypothesis/x",
        "build/x",
        "dist/x",
        "mlchaos.egg-info/PKG-INFO",
        "chaos/__pycache__/a.pyc",
        "chaos/run/__pycache__/b.pyc",
        "reports/.golden/0123-abcd.json",
        "reports/kill-rank-20261122-023556-c339/run.json",
        "reports/mlchaos-history.sqlite",
        "reports/sdc-coverage/coverage.json",
    ]
    kept = ["reports/.gitkeep", "chaos/run/golden.py", "README.md"]
    for name in made + kept:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    subprocess.run(["make", "-s", "clean"], cwd=tmp_path, check=True, capture_output=True, timeout=60)
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert left == sorted(["Makefile", *kept])


def test_the_docs_document_every_field_of_chaos_plan_json() -> None:
    readme = (ROOT / "docs" / "agent.md").read_text(encoding="utf-8")
    section = readme.split("The plan file (`chaos-plan.json`)", 1)[1].split("\n#", 1)[0]
    documented = set(re.findall(r"^\| `(?:ops\[\]\.)?(\w+)` \|", section, flags=re.M))
    fields = {f.name for f in dataclasses.fields(InJobPlan)} - {"ops"} | {f.name for f in dataclasses.fields(InJobOp)}
    assert documented == fields
    [example] = re.findall(r"```json\n(.*?)```", section, flags=re.S)
    plan = InJobPlan.from_json(example)
    assert plan.ops and plan.ops[0].op_id == f"{plan.ops[0].fault}#1"


def test_plan_refuses_what_run_would_refuse(tmp_path: Path) -> None:
    # Parses, but a command target has no ranks: `run` and `validate` refuse it, so `plan` shows no plan for it.
    file = tmp_path / "ranked.yaml"
    file.write_text(
        "name: t\ntarget: {type: command, command: [sleep, '5']}\n"
        "faults:\n  - {name: k, type: kill, params: {rank: 1}, trigger: {after: 1s}}\n"
        "checks: [{type: completes}]\n"
    )
    result = CliRunner().invoke(app, ["plan", str(file)])
    assert result.exit_code == 2, result.output
    assert "nothing was run" in result.output and "plan for" not in result.output
    fine = tmp_path / "fine.yaml"
    fine.write_text(file.read_text().replace("{rank: 1}", "{name: sleep}"))
    shown = CliRunner().invoke(app, ["plan", str(fine)])
    assert shown.exit_code == 0 and "plan for t" in shown.output, shown.output
