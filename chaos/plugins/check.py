"""The check contract: a pure function of (history, params, scenario) -> CheckResult, and the table of checks.

The scenario argument is a :class:`chaos.spec.scenario.Scenario`; it is typed ``Any`` here because the contract
sits below the spec in the layering (the spec looks checks up to type their params). Check authors import
from :mod:`chaos.checks.base`, which re-exports all of this.

Rule: a check never passes vacuously. If its fault never fired or its evidence is missing it returns
``unknown`` with the reason, and ``unknown`` fails a run unless the scenario says otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from chaos.history.timeline import History

Status = Literal["pass", "fail", "unknown"]


class CheckParams(BaseModel):
    """Base of every check's params model: unknown keys are errors (a misspelt bound must not pass silently)."""

    model_config = ConfigDict(extra="forbid")


class CheckResult(BaseModel):
    """Verdict with the measured value, the bound it was held to, and the evidence behind it."""

    model_config = ConfigDict(frozen=True)

    check: str
    name: str
    status: Status
    measured: float | str | None = None
    bound: str | None = None
    unit: str = ""
    reason: str = ""
    evidence: list[str] = []

    def measured_text(self) -> str:
        if self.measured is None:
            return "-"
        if isinstance(self.measured, float):
            if self.measured.is_integer() and self.unit != "s":
                return f"{int(self.measured)}{self.unit}"
            return f"{self.measured:.3f}{self.unit}"
        return f"{self.measured}{self.unit}"


CheckFn = Callable[[History, Any, Any], CheckResult]  # (history, params model, Scenario)


@dataclass(frozen=True)
class CheckSpec:
    """A registered check: its YAML name, params model, evaluator and one-line summary."""

    name: str
    Params: type[BaseModel]
    evaluate: CheckFn
    summary: str
    needs_golden: bool = False


CHECKS: dict[str, CheckSpec] = {}


def register_check(
    name: str, params: type[BaseModel], *, summary: str, needs_golden: bool = False
) -> Callable[[CheckFn], CheckFn]:
    """Decorator registering a check under ``name``; a second check of the same name is an error."""

    def wrap(fn: CheckFn) -> CheckFn:
        if name in CHECKS:
            raise ValueError(f"check {name!r} registered twice ({CHECKS[name].evaluate.__module__})")
        CHECKS[name] = CheckSpec(name, params, fn, summary, needs_golden)
        return fn

    return wrap
