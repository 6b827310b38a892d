"""What every in-job one-shot fault (``crash``, ``collective_fault``) owes the harness, one case a fault: it is
registered as an in-job, one-shot injector with its params model; in a 2-rank torchrun scenario it goes into the
job's plan file with its params (the harness applies nothing) and passes the preflight; ``trigger.phase`` on it is
refused with the fix (it fires where its own params say). Each fault's own params, refusals and firing are pinned in
its module (test_crash_fault.py, test_collective_fault.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from support import COLLECTIVE_FAULT, CRASH_FAULT, TORCHRUN

from chaos.plan.agent_plan import load_plan
from chaos.plan.build import make_plan
from chaos.plugins import registry
from chaos.plugins.injector import is_in_job, is_one_shot
from chaos.run.in_job import in_job_plan
from chaos.spec.preflight import preflight
from chaos.spec.scenario import parse_scenario
from injectors.collective import CollectiveFaultParams
from injectors.crash import CrashParams


@dataclass(frozen=True)
class Case:
    params_model: type[BaseModel]
    fault: str  # TORCHRUN's fault list: the fault on rank 1 at step 7
    planned_params: dict[str, Any]  # its params as the job's plan file holds them


CASES = {
    "crash": Case(CrashParams, CRASH_FAULT, {"kind": "segfault", "phase": "allreduce", "rank": 1}),
    "collective_fault": Case(CollectiveFaultParams, COLLECTIVE_FAULT, {"kind": "abort", "index": 1, "rank": 1}),
}


@pytest.mark.parametrize("injector", sorted(CASES))
def test_it_is_registered_as_an_in_job_one_shot_fault(injector: str) -> None:
    cls = registry.injectors()[injector]
    assert is_in_job(cls) and is_one_shot(cls) and cls.Params is CASES[injector].params_model


@pytest.mark.parametrize("injector", sorted(CASES))
def test_it_goes_into_the_jobs_plan_file_and_passes_the_preflight(injector: str, tmp_path: Path) -> None:
    scenario = parse_scenario(TORCHRUN.replace("FAULTS", CASES[injector].fault))
    assert [str(problem) for problem in preflight(scenario)] == []
    in_job, path = in_job_plan(make_plan(scenario), tmp_path, claims=True)
    assert [op.injector for op in in_job] == [injector]  # the agent's, not the harness's
    [op] = load_plan(str(path)).ops
    assert (op.at_step, op.rank, op.phase, op.claimable) == (7, 1, None, False)
    assert op.params == CASES[injector].planned_params


@pytest.mark.parametrize("injector", sorted(CASES))
def test_a_trigger_phase_on_it_is_refused_with_the_fix(injector: str) -> None:
    fault = CASES[injector].fault.replace("rank: 1}}", "rank: 1, phase: backward}}")
    [problem] = [str(problem) for problem in preflight(parse_scenario(TORCHRUN.replace("FAULTS", fault)))]
    assert "cannot fire at a trigger phase" in problem and "own params" in problem
