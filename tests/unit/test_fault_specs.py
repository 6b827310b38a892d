"""The agent's pydantic-free view of the in-job faults' params (``chaos.injob.fault_specs``) stays the harness's:
the same fields with the same defaults as the injector models, the same values for what the harness validated
(the phase that follows ``where`` included), and the plan file reads back what the harness wrote."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from chaos.injob.fault_specs import BitFlipSpec, CollectiveFaultSpec, CrashSpec, GradCorruptSpec
from chaos.plan.agent_plan import InJobOp, InJobPlan, PlanFileError, load_plan, write_plan
from injectors.collective import CollectiveFaultParams
from injectors.crash import CrashParams
from injectors.gradient import GradCorruptParams
from injectors.tensor import BitFlipParams

PAIRS: list[tuple[type[BaseModel], Any]] = [
    (BitFlipParams, BitFlipSpec),
    (GradCorruptParams, GradCorruptSpec),
    (CrashParams, CrashSpec),
    (CollectiveFaultParams, CollectiveFaultSpec),
]


@pytest.mark.parametrize(("model", "spec"), PAIRS, ids=["bitflip", "grad_corrupt", "crash", "collective_fault"])
def test_the_same_fields_with_the_same_defaults(model: type[BaseModel], spec: Any) -> None:
    fields = {f.name: f.default for f in dataclasses.fields(spec)}
    assert set(fields) == set(model.model_fields)
    for name, info in model.model_fields.items():
        if name != "phase":  # BitFlipParams' phase default follows where (a validator): checked below
            assert fields[name] == info.default, name


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"where": "gradients"},
        {"where": "optimizer_state", "state": "exp_avg", "bit": 3, "persistence": "latent"},
        {"where": "activations", "layer": "0", "kind": "nan"},
        {"where": "weights", "persistence": "stuck", "steps": 3, "bit": "exponent", "count": 2},
    ],
)
def test_validated_bitflip_params_read_back_as_the_same_values(params: dict[str, Any]) -> None:
    validated = BitFlipParams.model_validate(params)
    assert dataclasses.asdict(BitFlipSpec.from_params(validated.model_dump(mode="json"))) == validated.model_dump()
    # A hand-written plan op (no phase) gets the phase the harness would have given it.
    assert BitFlipSpec.from_params(params).phase == validated.phase


def test_validated_grad_corrupt_params_read_back_as_the_same_values() -> None:
    validated = GradCorruptParams.model_validate({"site": "post_reduce", "replica": "group.1", "bit": 4})
    assert dataclasses.asdict(GradCorruptSpec.from_params(validated.model_dump(mode="json"))) == validated.model_dump()


def test_an_unknown_field_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match=r"bitflip params: unknown field\(s\) wher \(known: "):
        BitFlipSpec.from_params({"wher": "weights"})


def test_the_plan_file_reads_back_what_was_written_and_a_wrong_one_is_named(tmp_path: Path) -> None:
    op = InJobOp(
        op_id="f#1",
        fault="f",
        injector="freeze",
        params={"rank": 0},
        at_step=3,
        rank=0,
        phase="forward",
        duration_s=2.0,
    )
    path = tmp_path / "chaos-plan.json"
    write_plan(path, 7, [op])
    assert load_plan(str(path)) == InJobPlan(seed=7, ops=[op])
    with pytest.raises(PlanFileError, match=r"plan op 'x': at_step is 'three', not int"):
        InJobPlan.from_json(
            '{"seed": 1, "ops": [{"op_id": "x", "fault": "f", "injector": "kill", "params": {}, "at_step": "three"}]}'
        )
    with pytest.raises(PlanFileError, match=r"unknown field\(s\) colour"):
        InJobPlan.from_json('{"seed": 1, "colour": "red"}')
    write_plan(path, 7, [op], digest_every=5)
    assert load_plan(str(path)) == InJobPlan(seed=7, ops=[op], digest_every=5)
    with pytest.raises(PlanFileError, match=r"seed and digest_every must be integers"):
        InJobPlan.from_json('{"seed": 1, "digest_every": "5"}')
