"""The check contract: a pure function of (history, params, scenario) -> CheckResult, and the table of checks.

The scenario argument is a :class:`chaos.spec.scenario.Scenario`; it is typed ``Any`` here because the contract
sits below the spec in the layering (the spec looks checks up to type their params). Check authors import
from :mod:`chaos.checks.base`, which re-exports all of this.

Rule: a check never passes vacuously. If its fault never fired or its evidence is missing it returns
``unknown`` with the reason, and ``unknown`` fails a run unless the scenario says otherwise.
"""

from __future__ import annotations

import functools
import inspect
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

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
P = TypeVar("P", bound=BaseModel)
TypedCheckFn = Callable[[History, P, Any], CheckResult]  # a check as written: it gets its own params model


@dataclass(frozen=True)
class CheckSpec:
    """A registered check: its YAML name, params model, evaluator (its ``unknown`` reasons ending with what to
    add, :func:`with_fix`), one-line summary, and ``to_add``: what a job or scenario adds to give it evidence."""

    name: str
    Params: type[BaseModel]
    evaluate: CheckFn
    summary: str
    needs_golden: bool = False
    to_add: str = ""


CHECKS: dict[str, CheckSpec] = {}

FAULT_FIX = (
    "`mlchaos plan FILE` shows when each op fires; check the fault's name here and its trigger (the run's "
    "fault.not_fired says why one never fired)"
)


def with_fix(result: CheckResult, to_add: str) -> CheckResult:
    """``result`` with an ``unknown`` reason ending in ``to fix: ...``: ``to_add`` for missing evidence, or how to
    find out why for a fault that never applied (unless the reason already says what would make it fire)."""
    if result.status != "unknown" or "to fix:" in result.reason or "it never fired:" in result.reason:
        return result
    fault_missing = "never applied" in result.reason or result.reason.startswith("no fault")
    fix = FAULT_FIX if fault_missing else to_add
    return result.model_copy(update={"reason": f"{result.reason}; to fix: {fix}"}) if fix else result


def raised(name: str, exc: BaseException) -> CheckResult:
    """The verdict of check ``name`` that raised ``exc`` while judging: ``unknown`` (which fails the run), the
    exception in its reason and the traceback as its evidence (the last 40 lines)."""
    lines = "".join(traceback.format_exception(exc)).rstrip().splitlines()
    return CheckResult(
        check=name,
        name=name,
        status="unknown",
        reason=f"the check raised {type(exc).__name__}: {str(exc)[:300]}; to fix: this is a bug in the check "
        "(its traceback is the evidence); report it with the run's history.jsonl",
        evidence=lines[-40:],
    )


def narrow(params: BaseModel, model: type[P]) -> P:
    """``params`` as ``model``; a TypeError (not an assert, which ``-O`` strips) when the runner mixed them up."""
    if not isinstance(params, model):
        raise TypeError(f"expected {model.__name__} params, got {type(params).__name__}")
    return params


def summary_of(fn: Callable[..., Any]) -> str:
    """The first paragraph of ``fn``'s docstring on one line ("" without a docstring)."""
    return " ".join(inspect.cleandoc(fn.__doc__ or "").split("\n\n", 1)[0].split())


def register_check(
    name: str, params: type[P], *, summary: str | None = None, needs_golden: bool = False, to_add: str = ""
) -> Callable[[TypedCheckFn[P]], TypedCheckFn[P]]:
    """Decorator registering a check under ``name``; a second check of the same name is an error. The check gets
    its params as ``params`` (a registered check handed another model is ``unknown``, :func:`narrow`).
    ``summary``: one line on what it asserts, by default the first paragraph of the check's docstring.
    ``to_add``: what gives the check its evidence, appended to its ``unknown`` reasons (:func:`with_fix`)."""

    def wrap(fn: TypedCheckFn[P]) -> TypedCheckFn[P]:
        if name in CHECKS:
            raise ValueError(f"check {name!r} registered twice ({CHECKS[name].evaluate.__module__})")
        said = summary if summary is not None else summary_of(fn)
        if not said:
            raise ValueError(f"check {name!r} has no summary: give it a docstring (its first line) or summary=")

        @functools.wraps(fn)
        def evaluate(history: History, given: BaseModel, scenario: Any) -> CheckResult:
            try:
                result = fn(history, narrow(given, params), scenario)
            except Exception as exc:  # a check's bug must not cost the run its reports, nor pass it
                return raised(name, exc)
            return with_fix(result, to_add)

        CHECKS[name] = CheckSpec(name, params, evaluate, said, needs_golden, to_add)
        return fn

    return wrap
