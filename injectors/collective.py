"""The ``collective_fault`` fault, fired by the rank's own agent (:mod:`chaos.injob.collective_faults`): one
collective of one rank fails while the process lives on, or the rank's process groups are aborted under it.

The harness writes it into the agent's plan file and nothing else: it needs a job that attached the agent
(``chaos.agent.attach``) and an ``at_step`` trigger; the point is the step's ``index``-th collective the rank
calls through ``torch.distributed`` (a DDP job: attach with ``ddp=``, so the gradient all-reduce is one of them).
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from chaos.injob.fault_specs import CollectiveKind
from chaos.plugins.injector import InJobInjector


class CollectiveFaultParams(BaseModel):
    """Which rank's collective fails, how, and which of the step's (the agent reads these as
    ``CollectiveFaultSpec``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: CollectiveKind = Field(
        default="error",
        description="error: that one call raises torch.distributed.DistBackendError without running (its peers "
        "wait in it; a retry pairs with them); abort: the rank's process groups are aborted just before it "
        "(ProcessGroup.abort, and gloo's connections shut down), so it and its peers' fail for real",
    )
    index: int = Field(
        default=0, ge=0, description="which collective of the step, as the rank calls them (0: the step's first)"
    )
    rank: int | None = Field(
        default=None, ge=0, description="the rank whose collective fails (default: the trigger's rank, else 0)"
    )


class CollectiveFaultInjector(InJobInjector, name="collective_fault", params=CollectiveFaultParams):
    """one rank's collective fails at a step (DistBackendError, the process lives on) or its process groups are
    aborted (in-job; once per run)

    ``collective_fault``: the rank's agent reports ``fault.applied`` {step, index, collective, collective_kind,
    pid}, then fails that collective or aborts its process groups, once per run (a restart does not again)."""

    one_shot: ClassVar[bool] = True


INJECTORS = (CollectiveFaultInjector,)
