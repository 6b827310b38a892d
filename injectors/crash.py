"""The ``crash`` fault, fired by the rank's own agent (:mod:`chaos.injob.crash_faults`): one rank dies at a
point inside a training step the way real code dies, by a Python exception, a segfault or an abort.

The harness writes it into the agent's plan file and nothing else: it needs a job that attached the agent
(``chaos.agent.attach``) and an ``at_step`` trigger; the phase is the fault's own param (``trigger.phase`` is
for ``kill``/``freeze``). ``allreduce`` needs the DDP-wrapped model in the attach line (``ddp=``).
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from chaos.event_kinds import TriggerPhase
from chaos.injob.fault_specs import CrashKind
from chaos.plugins.injector import InJobInjector


class CrashParams(BaseModel):
    """Which rank crashes, how, and where in the step (the agent reads these as ``CrashSpec``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: CrashKind = Field(
        default="exception",
        description="exception: InjectedFault (a RuntimeError) raised in the training thread (uncaught: exit 1); "
        "segfault: a read through a NULL pointer (SIGSEGV, -11); abort: os.abort() (SIGABRT, -6)",
    )
    phase: TriggerPhase = Field(
        default="forward",
        description="where in the step: forward (the step begins), allreduce (inside DDP's gradient all-reduce, "
        "needs ddp= in attach), backward (after it), optimizer_step (before optimizer.step())",
    )
    rank: int | None = Field(
        default=None, ge=0, description="the rank that crashes (default: the trigger's rank, else 0)"
    )


class CrashInjector(InJobInjector, name="crash", params=CrashParams):
    """one rank crashes at a step and phase: Python exception, SIGSEGV or SIGABRT (in-job; once per run)

    ``crash``: the rank's agent reports ``fault.applied`` {step, phase, crash_kind, pid}, then raises, segfaults or
    aborts, once per run (a torchrun restart recomputing the step does not crash again)."""

    one_shot: ClassVar[bool] = True


INJECTORS = (CrashInjector,)
