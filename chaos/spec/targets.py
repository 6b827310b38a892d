"""Typed ``target:`` blocks that are not the scenario model's own (the scenario's torchrun and command targets
live in :mod:`chaos.spec.scenario`; the reference serving stack's in :mod:`chaos.spec.serving`)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from chaos.spec.units import Duration, check_http_url


class HttpTarget(BaseModel):
    """A serving endpoint that is already running: the gateway of a user's own fleet."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    type: Literal["http"]
    url: str = Field(description="base URL of the endpoint, e.g. http://gateway.staging:8080")
    health: str | None = Field(
        default=None, description="path polled until it answers 2xx/3xx before the run starts (null: any answer)"
    )
    ready_timeout: Duration = Field(default=60.0, gt=0, description="give up when it is not ready by then")

    @field_validator("url")
    @classmethod
    def _url(cls, url: str) -> str:
        return check_http_url(url).rstrip("/")
