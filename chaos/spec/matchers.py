"""Log matchers a scenario declares on a target: a regex over the job's output whose matches become events."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

_STRICT = ConfigDict(extra="forbid", frozen=True)


class LogMatcherSpec(BaseModel):
    """A regex over the target's output; a match becomes an event of kind ``event`` (named groups -> data)."""

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
