"""The plan file between the runner and the in-job agent (env ``CHAOS_PLAN``): in-job fault ops as JSON.

Kept apart from :mod:`chaos.agent` so the harness can write plans without importing torch.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, JsonValue

ENV_PLAN = "CHAOS_PLAN"


class InJobOp(BaseModel):
    """One fault the agent fires: which injector with which params, at which step, on which rank; ``phase`` is
    set for a process fault the agent fires on its own process at that point of the step (``trigger.phase``)."""

    model_config = ConfigDict(frozen=True)

    op_id: str
    fault: str
    injector: str
    params: dict[str, JsonValue]
    at_step: int
    rank: int | None = None
    phase: str | None = None  # a process fault (kill, freeze) fired by the agent at this point of the step
    duration_s: float | None = None  # a fault's duration (a freeze fired at a phase is thawed after it)


class InJobPlan(BaseModel):
    """The run's seed (every corruption choice derives from it) and this job's in-job ops."""

    seed: int = 0
    ops: list[InJobOp] = []


def load_plan(path: str | None = None) -> InJobPlan:
    """The plan at ``path`` or named by ``CHAOS_PLAN``; an empty plan when neither is set."""
    where = path if path is not None else os.environ.get(ENV_PLAN)
    if not where:
        return InJobPlan()
    return InJobPlan.model_validate_json(Path(where).read_text(encoding="utf-8"))


def write_plan(path: Path, seed: int, ops: list[InJobOp]) -> None:
    """Write the plan file atomically (the job may start reading it at once)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(InJobPlan(seed=seed, ops=ops).model_dump(mode="json"), indent=1), encoding="utf-8")
    os.replace(tmp, path)
