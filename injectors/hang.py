"""Hang faults fired by the rank's own agent (:mod:`chaos.injob.hang_faults`): ``spin`` and ``skip_collective``.

With the harness-side ``freeze`` (SIGSTOP, also at a trigger phase) they make the three hangs a hang detector
must tell apart (:mod:`chaos.detect.hang_watch`): a stopped rank, a rank stuck in a Python loop, and a rank that
skipped one collective. Both need a job that attached the agent (``chaos.agent.attach``) and an ``at_step``
trigger; ``spin`` needs a ``duration``.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from chaos.event_kinds import TensorPhase
from chaos.plugins.injector import InJobInjector


class SpinParams(BaseModel):
    """Which rank spins, and where in the step."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    rank: int | None = Field(
        default=None, ge=0, description="the rank that spins (default: the trigger's rank, else 0)"
    )
    phase: TensorPhase = Field(
        default="forward",
        description="where in the step: forward (begin_step), backward (after_backward), "
        "optimizer_step (allow_optimizer_step)",
    )


class SkipCollectiveParams(BaseModel):
    """Which rank skips which collective of the trigger's step."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    rank: int | None = Field(
        default=None, ge=0, description="the rank that skips (default: the trigger's rank, else 0)"
    )
    index: int = Field(default=0, ge=0, description="which collective of the step (0: the step's first)")


class SpinInjector(InJobInjector, name="spin", params=SpinParams):
    """one rank stuck in a Python loop for the duration (in-job; heals by itself)

    ``spin``: the rank loops in Python (GIL held, CPU busy) for the fault's duration, then goes on."""

    needs_duration: ClassVar[bool] = True


class SkipCollectiveInjector(InJobInjector, name="skip_collective", params=SkipCollectiveParams):
    """one rank skips one collective (in-job; its peers wait in it: restart to heal)

    ``skip_collective``: the rank's collective at (step, index) returns without running."""


INJECTORS = (SpinInjector, SkipCollectiveInjector)
