"""The ``clock`` fault's spec and refusals: a signed jump in the scenario's duration spellings; ``mlchaos validate``
refuses it, with the reason and the fix, where the shim is not built and on targets whose processes the harness
does not start here; the runner gives the shim to the job only when the scenario has a clock fault; the journal
state round-trips and the dead-man's command removes exactly the op's file."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError
from support import COMMAND, TORCHRUN
from typer.testing import CliRunner

from chaos.cli.commands import app
from chaos.cluster.local import LocalTransport
from chaos.events import ENV_CLOCK_DIR
from chaos.plugins.injector import Applied, FaultOp, InjectionContext, InjectionError
from chaos.run.fault_env import fault_env
from chaos.run.result import EXIT_INVALID
from chaos.spec.preflight import preflight
from chaos.spec.scenario import parse_scenario
from injectors.clock import shim
from injectors.clock.injector import ClockInjector, ClockParams, ClockState

CLOCK = "  - type: clock\n    params: {jump: +1h}\n    trigger: {after: 1s}\n    duration: 5s"
HTTP = TORCHRUN.replace(
    "  type: torchrun\n  module: chaos.reference.trainer\n  nproc_per_node: 2\n",
    "  type: http\n  url: http://127.0.0.1:9\n  ready_timeout: 5s\n",
)


@pytest.mark.parametrize(
    ("spelled", "seconds"), [("+1h", 3600.0), ("-10m", -600.0), ("- 1m30s", -90.0), (-5, -5.0), (2.5, 2.5)]
)
def test_a_jump_is_signed_seconds_in_any_duration_spelling(spelled: object, seconds: float) -> None:
    assert ClockParams.model_validate({"jump": spelled}).jump == seconds


@pytest.mark.parametrize(
    "params",
    [{"jump": 0}, {"jump": "+20000d"}, {"jump": "soon"}, {"jump": "1h", "rank": 0, "replica": "a"}, {}],
)
def test_a_zero_huge_unreadable_or_doubly_scoped_jump_is_refused(params: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        ClockParams.model_validate(params)


def _validate(tmp_path: Path, text: str) -> tuple[int, str]:
    path = tmp_path / "clock.yaml"
    path.write_text(text, encoding="utf-8")
    result = CliRunner().invoke(app, ["validate", str(path)])
    return result.exit_code, result.output


def test_validate_refuses_a_clock_fault_where_the_shim_is_not_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(shim.ENV_LIBRARY, str(tmp_path / "nowhere" / "clockshift.so"))
    code, output = _validate(tmp_path, COMMAND.replace("FAULTS", CLOCK))
    flat = " ".join(output.split())
    assert code == EXIT_INVALID, output
    assert "(clock) is not supported here: the clock shim is not built" in flat and "run `make setup`" in flat, flat


def test_validate_refuses_a_clock_fault_on_a_target_whose_processes_it_cannot_reach(tmp_path: Path) -> None:
    code, output = _validate(tmp_path, HTTP.replace("FAULTS", CLOCK))
    flat = " ".join(output.split())
    assert code == EXIT_INVALID and "acts through a library preloaded into the processes" in flat, flat
    spread = TORCHRUN.replace("nproc_per_node: 2", "nproc_per_node: 2\n  nodes: {group: all, count: 2}")
    [problem] = preflight(parse_scenario(spread.replace("FAULTS", CLOCK)))
    assert "runs processes on inventory hosts" in str(problem)
    assert preflight(parse_scenario(TORCHRUN.replace("FAULTS", CLOCK.replace("+1h}", "+1h, rank: 1}")))) == []


def test_the_job_gets_the_shim_only_from_a_scenario_with_a_clock_fault(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LD_PRELOAD", "/opt/users-own.so")
    env = fault_env(parse_scenario(COMMAND.replace("FAULTS", CLOCK)), tmp_path)
    assert env == {"LD_PRELOAD": f"/opt/users-own.so:{shim.library()}", ENV_CLOCK_DIR: str(tmp_path / "clock")}
    kill = "  - type: kill\n    params: {pid: 4242}\n    trigger: {after: 1s}"
    assert fault_env(parse_scenario(COMMAND.replace("FAULTS", kill)), tmp_path) == {}


def test_the_op_writes_one_file_of_its_scope_and_the_dead_man_removes_exactly_it(tmp_path: Path) -> None:
    injector = ClockInjector()
    op = FaultOp(op_id="jump#1", fault="jump", injector="clock", params=ClockParams(jump=-30, rank=1))
    with pytest.raises(InjectionError, match="not a run"):
        injector.prepare(InjectionContext(LocalTransport()), op)
    applied = injector.prepare(InjectionContext(LocalTransport(), run_dir=tmp_path), op)
    assert Applied.model_validate_json(applied.model_dump_json()) == applied
    state = ClockState.from_json(applied.state)
    assert state.scope == "rank-1" and state.jump_ns == -30 * 10**9 and not Path(state.file).exists()
    assert Path(state.file).parent == tmp_path / "clock" and applied.description == "wall clock of rank 1 -30s"
    assert injector.revert_command(applied) == ["rm", "-f", state.file, str(shim.temporary_of(Path(state.file)))]
