"""From scenario to plan: every fault firing, ordered, with its trigger resolved.

The run's one seeded ``random.Random`` lives here. Time-based triggers (``after``, ``every``, ``poisson``) are
expanded to absolute offsets from the target's start; step and event triggers stay symbolic and fire when the
history shows them. The plan is written into the report, so a run can be replayed from its seed and plan.
"""

from __future__ import annotations

import random
from typing import Literal

from pydantic import BaseModel, ConfigDict, JsonValue

from chaos.plan.seeds import derive_rng
from chaos.plugins.injector import FaultOp
from chaos.spec.scenario import FaultSpec, Scenario


class PlannedOp(BaseModel):
    """One firing of one fault. Exactly one of ``at_s``, ``at_step``, ``event_kind`` says when."""

    model_config = ConfigDict(frozen=True)

    op_id: str
    fault: str
    injector: str
    trigger: Literal["after", "at_step", "on_event", "every", "poisson"]
    at_s: float | None = None
    at_step: int | None = None
    rank: int | None = None
    phase: str | None = None  # with at_step: the job's agent fires it at this point inside the step
    event_kind: str | None = None
    event_nth: int | None = None
    duration_s: float | None = None
    params: dict[str, JsonValue] = {}

    def describe(self) -> str:
        if self.at_s is not None:
            when = f"at +{self.at_s:.2f}s"
        elif self.at_step is not None:
            when = f"at step {self.at_step}" + (f" of rank {self.rank}" if self.rank is not None else "")
            when += f", in phase {self.phase}" if self.phase is not None else ""
        else:
            when = f"on event #{self.event_nth} {self.event_kind}" + (
                f" of rank {self.rank}" if self.rank is not None else ""
            )
        lasting = f" for {self.duration_s:g}s" if self.duration_s is not None else ""
        return f"{self.op_id}: {self.injector} {when}{lasting}"


class Plan(BaseModel):
    """The ordered fault ops of a run plus the seed that produced them."""

    model_config = ConfigDict(frozen=True)

    scenario: str
    seed: int
    ops: list[PlannedOp]

    def timed(self) -> list[PlannedOp]:
        return sorted((op for op in self.ops if op.at_s is not None), key=lambda op: op.at_s or 0.0)


def _ops_for(fault: FaultSpec, rng: random.Random) -> list[PlannedOp]:
    trigger = fault.trigger
    common = {
        "fault": fault.name,
        "injector": fault.type,
        "duration_s": fault.duration,
        "params": fault.params.model_dump(mode="json"),
    }
    if trigger.after is not None:
        return [PlannedOp(op_id=f"{fault.name}#1", trigger="after", at_s=trigger.after, **common)]
    if trigger.at_step is not None:
        rank = trigger.rank
        if trigger.phase is not None and rank is None:
            # A phase op is fired by the rank it hits: a process fault selects that rank in its params.
            selected = fault.params.model_dump().get("rank")
            rank = selected if isinstance(selected, int) else None
        return [
            PlannedOp(
                op_id=f"{fault.name}#1",
                trigger="at_step",
                at_step=trigger.at_step,
                rank=rank,
                phase=trigger.phase,
                **common,
            )
        ]
    if trigger.on_event is not None:
        event = trigger.on_event
        return [
            PlannedOp(
                op_id=f"{fault.name}#1",
                trigger="on_event",
                event_kind=event.kind,
                event_nth=event.nth,
                rank=event.rank,
                **common,
            )
        ]
    if trigger.every is not None:
        every = trigger.every
        first = every.interval if every.start is None else every.start
        return [
            PlannedOp(op_id=f"{fault.name}#{k + 1}", trigger="every", at_s=first + k * every.interval, **common)
            for k in range(every.count)
        ]
    if trigger.poisson is not None:
        poisson = trigger.poisson
        ops, at = [], poisson.start
        for k in range(poisson.count):
            at += rng.expovariate(1.0 / poisson.mtbf)
            ops.append(PlannedOp(op_id=f"{fault.name}#{k + 1}", trigger="poisson", at_s=round(at, 6), **common))
        return ops
    raise AssertionError(f"trigger of {fault.name} has no kind")


def make_plan(scenario: Scenario, seed: int | None = None) -> Plan:
    """Expand the scenario's triggers with ``random.Random(seed)`` (default: the scenario's seed)."""
    used_seed = scenario.seed if seed is None else seed
    rng = derive_rng(used_seed)
    ops = [op for fault in scenario.faults for op in _ops_for(fault, rng)]
    return Plan(scenario=scenario.name, seed=used_seed, ops=ops)


def fault_op(planned: PlannedOp, scenario: Scenario, placeholders: dict[str, str] | None = None) -> FaultOp:
    """The injector-facing op for ``planned``, with the typed params from the scenario.

    ``placeholders`` (e.g. ``{"run_dir": "/abs/reports/run-1"}``) are expanded in every string param, so a
    fault can name run-specific paths such as ``{run_dir}/checkpoints``; the params are re-validated after.
    """
    spec = scenario.fault(planned.fault)
    params = spec.params
    if placeholders:
        # exclude_unset: re-validation must see the same "which fields were given" as the scenario did.
        expanded = _expand(params.model_dump(mode="json", exclude_unset=True), placeholders)
        params = type(params).model_validate(expanded)
    return FaultOp(
        op_id=planned.op_id,
        fault=planned.fault,
        injector=planned.injector,
        params=params,
        duration_s=planned.duration_s,
    )


def _expand(value: JsonValue, placeholders: dict[str, str]) -> JsonValue:
    if isinstance(value, str):
        for key, replacement in placeholders.items():
            value = value.replace("{" + key + "}", replacement)
        return value
    if isinstance(value, list):
        return [_expand(item, placeholders) for item in value]
    if isinstance(value, dict):
        return {key: _expand(item, placeholders) for key, item in value.items()}
    return value
