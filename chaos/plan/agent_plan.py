"""The plan file between the runner and the in-job agent (env ``CHAOS_PLAN``): in-job fault ops as JSON.

Kept apart from :mod:`chaos.agent` so the harness can write plans without importing torch, and written with the
standard library only (dataclasses, json) so the agent reads it in a training process that has torch and
nothing else. The harness validated every op's params before writing them; reading checks the file's shape
(types of the op fields, no unknown field) and says what is wrong.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Union

ENV_PLAN = "CHAOS_PLAN"

JsonValue = Union[None, bool, int, float, str, list["JsonValue"], dict[str, "JsonValue"]]  # noqa: UP007
"""A JSON value (pydantic's ``JsonValue`` without pydantic)."""


class PlanFileError(ValueError):
    """The plan file is not a plan this agent can read."""


@dataclass(frozen=True)
class InJobOp:
    """One fault the agent fires: which injector with which params, at which step, on which rank; ``phase`` is
    set for a process fault the agent fires on its own process at that point of the step (``trigger.phase``).
    ``claimable``: a process fault with a plain ``at_step`` trigger, which the harness fires when the job reports
    the step unless the rank's agent claims it (``fault.claimed``) and fires it at the start of that step."""

    op_id: str
    fault: str
    injector: str
    params: dict[str, JsonValue]
    at_step: int
    rank: int | None = None
    phase: str | None = None  # a process fault (kill, freeze) fired by the agent at this point of the step
    duration_s: float | None = None  # a fault's duration (a freeze fired at a phase is thawed after it)
    claimable: bool = False  # the harness fires it unless this rank's agent claims it (see the class doc)

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> InJobOp:
        """An op from its JSON object; :class:`PlanFileError` naming the field that is missing or wrong."""
        _no_unknown(cls, data, "op")
        op = dict(data)
        for name, kinds in _OP_TYPES.items():
            if name not in op:
                if name in _OP_REQUIRED:
                    raise PlanFileError(f"plan op {data.get('op_id', '?')!r}: {name} is missing")
                continue
            value = op[name]
            if name == "duration_s" and isinstance(value, int) and not isinstance(value, bool):
                op[name] = value = float(value)
            if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
                raise PlanFileError(f"plan op {data.get('op_id', '?')!r}: {name} is {value!r}, not {_names(kinds)}")
        return cls(**op)  # type: ignore[arg-type]


@dataclass(frozen=True)
class InJobPlan:
    """The run's seed (every corruption choice derives from it), this job's in-job ops, and ``digest_every``:
    report the training state's digest after every k-th committed step (0: only at exit), so replicas can be
    compared step by step (``replicas_agree``'s ``every``)."""

    seed: int = 0
    ops: list[InJobOp] = field(default_factory=list)
    digest_every: int = 0

    @classmethod
    def from_json(cls, text: str) -> InJobPlan:
        """The plan in ``text``; :class:`PlanFileError` when it is not one."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PlanFileError(f"the plan file is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise PlanFileError("the plan file holds no JSON object")
        _no_unknown(cls, data, "plan")
        seed, ops, every = data.get("seed", 0), data.get("ops", []), data.get("digest_every", 0)
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in (seed, every)) or not isinstance(ops, list):
            raise PlanFileError("the plan's seed and digest_every must be integers and its ops a list")
        if not all(isinstance(op, dict) for op in ops):
            raise PlanFileError("every plan op must be a JSON object")
        return cls(seed=seed, ops=[InJobOp.from_dict(op) for op in ops], digest_every=every)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=1)


_OP_TYPES: dict[str, tuple[type, ...]] = {
    "op_id": (str,),
    "fault": (str,),
    "injector": (str,),
    "params": (dict,),
    "at_step": (int,),
    "rank": (int, type(None)),
    "phase": (str, type(None)),
    "duration_s": (float, type(None)),
    "claimable": (bool,),
}
_OP_REQUIRED = ("op_id", "fault", "injector", "params", "at_step")


def _names(kinds: tuple[type, ...]) -> str:
    return " or ".join("null" if kind is type(None) else kind.__name__ for kind in kinds)


def _no_unknown(cls: type, data: Mapping[str, object], what: str) -> None:
    unknown = sorted(set(data) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
        raise PlanFileError(f"plan {what} has unknown field(s) {', '.join(unknown)}: written by another mlchaos?")


def load_plan(path: str | None = None) -> InJobPlan:
    """The plan at ``path`` or named by ``CHAOS_PLAN``; an empty plan when neither is set."""
    where = path if path is not None else os.environ.get(ENV_PLAN)
    if not where:
        return InJobPlan()
    return InJobPlan.from_json(Path(where).read_text(encoding="utf-8"))


def write_plan(path: Path, seed: int, ops: list[InJobOp], digest_every: int = 0) -> None:
    """Write the plan file atomically (the job may start reading it at once)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(InJobPlan(seed=seed, ops=ops, digest_every=digest_every).to_json(), encoding="utf-8")
    os.replace(tmp, path)
