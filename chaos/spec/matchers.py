"""What a target reads from its job's output: the scenario's regex ``matchers:`` and torch's failure
``signatures:`` (:mod:`chaos.history.torch_signatures`), both turned into events line by line."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from chaos.event_kinds import TARGET_STEP
from chaos.history.torch_signatures import NAMES, unknown_names

_STRICT = ConfigDict(extra="forbid", frozen=True)


class LogMatcherSpec(BaseModel):
    """A regex over the target's output; a match becomes an event of kind ``event`` (named groups -> data;
    a group named ``rank``, or else torch's ``[rankN]:`` line prefix, sets the event's rank)."""

    model_config = _STRICT
    pattern: str = Field(min_length=1)
    event: str = Field(pattern=r"^[a-z_]+(\.[a-z0-9_*]+)+$")

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, pattern: str) -> str:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"pattern is not a valid regex: {exc}") from None
        return pattern


def reports_steps(matchers: list[LogMatcherSpec]) -> bool:
    """Whether one of the scenario's matchers makes ``target.step`` events (then it is the job's step source)."""
    return any(m.event == TARGET_STEP for m in matchers)


def _known(choice: Literal["all", "none"] | list[str]) -> Literal["all", "none"] | list[str]:
    if isinstance(choice, list):
        wrong = unknown_names(choice)
        if wrong:
            raise ValueError(f"{', '.join(map(repr, wrong))} is not a signature: choose from {', '.join(NAMES)}")
    return choice


Signatures = Annotated[
    Literal["all", "none"] | list[str],
    AfterValidator(_known),
    Field(
        description="torch's failure signatures read from the job's output as detect.* events (gloo/NCCL "
        "timeouts, lost peers, out of memory, the traceback that ends a rank, torchrun's failure and restart "
        f"lines): all (default), none, or a list of names from {', '.join(NAMES)}"
    ),
]

OptimizerSteps = Annotated[
    bool,
    Field(
        description="report each rank's optimizer steps as target.step with no line in the script (a "
        "sitecustomize put first on the job's PYTHONPATH on this host; exact steps only, see "
        "chaos.injob.bootstrap); it stands down when the job reports its own (the agent, chaos.events) or a "
        "matcher reports target.step"
    ),
]
