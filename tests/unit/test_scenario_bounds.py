"""Inputs that could never make sense are refused at their line with the fix, with bounded work: a number
thousands of digits long (Python's int() refuses past 4,300 digits with a traceback), a trigger that would
expand to millions of firings or fire after the run has ended, a fault that outlasts the run, a heal grace that
would leave a dead harness's fault in place for days."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT

from chaos.spec.preflight import MAX_HEAL_GRACE_S, preflight
from chaos.spec.problems import MAX_NUMBER_CHARS
from chaos.spec.scenario import ScenarioError, parse_scenario

KILL_RANK = (ROOT / "scenarios" / "kill-rank.yaml").read_text()
FREEZE_RANK = (ROOT / "scenarios" / "freeze-rank.yaml").read_text()
TRIGGER = "trigger: {at_step: 25, rank: 1}"


def _refused(text: str) -> list[str]:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(text, "bad.yaml")
    return [str(problem) for problem in info.value.problems]


def _preflight(text: str) -> list[str]:
    return [str(problem) for problem in preflight(parse_scenario(text, "bad.yaml"))]


@pytest.mark.parametrize("literal", ["9" * 5000, "-" + "1" * 4301, "1" * 65, "1." + "5" * 5000])
def test_a_number_thousands_of_digits_long_is_refused_at_its_line(literal: str) -> None:
    [problem] = _refused(KILL_RANK.replace("seed: 1234", f"seed: {literal}"))
    assert problem.startswith("bad.yaml:7:7: a number") and f"at most {MAX_NUMBER_CHARS} characters" in problem


# Runs validate from a small parent that reports the child's peak RSS: a child forked from this test worker
# would start its ru_maxrss at the worker's own size (Linux carries it across fork and exec).
_MEASURED = """import resource, subprocess, sys
limit = int(sys.argv[1])
def limited():
    if limit:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
done = subprocess.run(sys.argv[2:], capture_output=True, text=True, preexec_fn=limited)
sys.stdout.write(done.stdout + done.stderr)
sys.stdout.write(f"\\nPEAK_KB {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}\\n")
sys.exit(done.returncode)
"""


def _validate(path: Path, limit_bytes: int | None = None) -> tuple[int, str, float]:
    """``mlchaos validate PATH``: its exit code, its output, and its own peak memory in MB."""
    validate = [sys.executable, "-m", "chaos.cli.commands", "validate", str(path)]
    command = [sys.executable, "-c", _MEASURED, str(limit_bytes or 0), *validate]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    out, _, peak = done.stdout.rpartition("\nPEAK_KB ")
    return done.returncode, out + done.stderr, int(peak) / 1024


def test_the_cli_says_so_without_a_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "huge.yaml"
    bad.write_text(KILL_RANK.replace("seed: 1234", "seed: " + "9" * 100_000))
    code, out, peak_mb = _validate(bad)
    assert code == 2, out
    assert f"{bad}:7:7: a number 100000 characters long" in out and "Traceback" not in out, out
    assert peak_mb < 200, peak_mb


@pytest.mark.parametrize("kind", ["every: {interval: 1ms, count: 100000000}", "poisson: {mtbf: 1s, count: 100000000}"])
def test_a_trigger_of_millions_of_firings_is_refused_before_it_is_expanded(kind: str) -> None:
    [problem] = _refused(KILL_RANK.replace(TRIGGER, f"trigger: {{{kind}}}"))
    assert "count" in problem and "less than or equal to 10000" in problem, problem


def test_an_every_trigger_firing_after_the_run_is_refused_with_the_count_that_fits() -> None:
    [problem] = _preflight(KILL_RANK.replace(TRIGGER, "trigger: {every: {interval: 1s, count: 500, start: 30s}}"))
    assert problem.startswith("bad.yaml:19:") and "the last at +529s, after the run's end" in problem
    assert "fire at most 151 times" in problem  # +30 s, then every second up to the 180 s max_duration
    assert _preflight(KILL_RANK.replace(TRIGGER, "trigger: {every: {interval: 1s, count: 151, start: 30s}}")) == []


def test_a_fault_longer_than_the_run_and_a_heal_grace_of_days_are_refused() -> None:
    text = FREEZE_RANK.replace("duration: 20s", "duration: 1h")
    text = (
        text.replace("heal_grace: 5s", "heal_grace: 1000h") if "heal_grace" in text else text + "  heal_grace: 1000h\n"
    )
    problems = _preflight(text)
    assert len(problems) == 2, problems
    assert "lasts 3600s, longer than the whole run" in problems[0] and "fix: shorten the duration" in problems[0]
    assert "heal_grace 3600000s" in problems[1] and f"use at most {MAX_HEAL_GRACE_S:g}s" in problems[1]


def test_the_shipped_scenarios_fit_their_runs() -> None:
    for path in sorted((ROOT / "scenarios").glob("*.yaml")):
        assert _preflight(path.read_text()) == [], path


def _bomb(levels: int) -> str:
    """YAML anchors, each a list of nine aliases of the one before: a few hundred bytes, 9**levels leaves."""
    lines = ["x-bomb:", "  - &b0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"  - &b{i} [{', '.join([f'*b{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


BOMBED = [
    ("faults.0.duration", FREEZE_RANK.replace("duration: 20s", "duration: *b8")),
    ("safety.max_duration", FREEZE_RANK.replace("max_duration: 180s", "max_duration: *b8")),
    ("faults.0.params.rank", FREEZE_RANK.replace("params: {rank: 1}", "params: {rank: *b8}")),
    ("faults.0.trigger.at_step", FREEZE_RANK.replace("at_step: 20,", "at_step: *b8,")),
    ("name", FREEZE_RANK.replace("name: freeze-rank\n", "name: *b8\n")),
]


@pytest.mark.parametrize(("field", "text"), BOMBED, ids=[field for field, _ in BOMBED])
def test_an_alias_bomb_in_a_field_is_refused_at_its_line_with_a_short_quote(
    field: str, text: str, tmp_path: Path
) -> None:
    assert "*b8" in text, field
    bad = tmp_path / "bomb.yaml"
    bad.write_text(_bomb(9) + text)  # 9**9 (387 million) leaves if anything walked or printed the whole value

    code, out, peak_mb = _validate(bad, limit_bytes=2 << 30)
    assert code == 2 and "Traceback" not in out, out[-3000:]
    assert f"{field}:" in out and len(out) < 4000, out[-3000:]
    assert peak_mb < 200, peak_mb


def test_a_script_or_module_that_does_not_exist_here_is_refused_at_its_line(tmp_path: Path) -> None:
    from chaos.cli.preflight import check_files

    missing = tmp_path / "typo.yaml"
    missing.write_text(KILL_RANK.replace("module: chaos.reference.trainer", "script: tests/jobs/trian.py"))
    no_module = tmp_path / "module.yaml"
    no_module.write_text(KILL_RANK.replace("chaos.reference.trainer", "trainr.main"))
    roles = tmp_path / "roles.yaml"
    roles.write_text(
        (ROOT / "scenarios" / "torchft-replica-killed.yaml").read_text().replace("torchft_train.py", "torchft_trian.py")
    )
    placeholder = tmp_path / "placeholder.yaml"  # its path is known only at run time: left to the run
    placeholder.write_text(KILL_RANK.replace("module: chaos.reference.trainer", "script: '{scenario_dir}/x.py'"))
    checked = check_files([missing, no_module, roles, placeholder])
    found = [str(problem) for problem in checked.problems]
    assert len(found) == 3, found
    assert found[0].startswith(f"{missing}:") and "script 'tests/jobs/trian.py' does not exist" in found[0]
    assert "fix: give the script's path" in found[0]
    assert "module 'trainr.main': no package 'trainr'" in found[1]
    assert "script 'tests/jobs/torchft_trian.py' does not exist" in found[2]
    assert [file for file, _ in checked.scenarios] == [placeholder]


def test_a_file_too_big_to_parse_in_bounded_time_is_refused_before_parsing(tmp_path: Path) -> None:
    from chaos.spec.problems import MAX_YAML_CHARS

    entry = "  - {name: fNUM, type: freeze, params: {name: sleep}, trigger: {after: 1s}, duration: 1s}\n"
    count = MAX_YAML_CHARS // len(entry) + 10
    text = KILL_RANK.split("faults:")[0] + "faults:\n" + "".join(entry.replace("NUM", str(i)) for i in range(count))
    [problem] = _refused(text)
    assert problem.startswith("bad.yaml:1:1: the file is") and "more than the 262,144 a scenario may have" in problem
    assert "repeat a fault with an every or poisson trigger" in problem
    # Below the bound, validation stays linear: 2,000 faults parse and validate (the bound is ~2,800 such lines).
    parse_scenario(
        KILL_RANK.split("faults:")[0]
        + "faults:\n"
        + "".join(entry.replace("NUM", str(i)) for i in range(2000))
        + "checks: [{type: completes}]\n",
        "ok.yaml",
    )
