"""Which of a plan's ops the job's own agent fires, and the plan file it reads them from."""

from __future__ import annotations

from pathlib import Path

from chaos.plan.agent_plan import InJobOp, write_plan
from chaos.plan.build import Plan, PlannedOp
from chaos.plugins import registry
from chaos.plugins.injector import is_in_job
from chaos.spec.scenario import Scenario


def in_job_plan(plan: Plan, run_dir: Path, *, claims: bool, digest_every: int = 0) -> tuple[list[PlannedOp], Path]:
    """Split off the ops the job's agent fires itself and write them to the plan file it reads: in-job faults,
    and process faults with a ``trigger.phase`` (the rank's agent signals its own process at that point). With
    ``claims`` (a torchrun target: one agent per rank), :func:`claimable` ops are written too, marked so, and
    stay the harness's: it fires them at the step unless the rank's agent claims them first. ``digest_every``:
    see :func:`digest_interval`."""
    in_job = [op for op in plan.ops if is_in_job(registry.injectors()[op.injector]) or op.phase is not None]
    offered = [op for op in plan.ops if claims and claimable(op)]
    path = run_dir / "chaos-plan.json"
    write_plan(
        path,
        plan.seed,
        [
            InJobOp(
                op_id=op.op_id,
                fault=op.fault,
                injector=op.injector,
                params=op.params,
                at_step=op.at_step if op.at_step is not None else -1,
                rank=op.rank,
                phase=op.phase or ("forward" if op in offered else None),
                duration_s=op.duration_s,
                claimable=op in offered,
            )
            for op in [*in_job, *offered]
        ],
        digest_every,
    )
    return in_job, path


def digest_interval(scenario: Scenario) -> int:
    """The plan file's ``digest_every``: the smallest ``every`` of the scenario's ``replicas_agree`` checks (a
    digest after every k-th committed step), 0 when none asks."""
    asked = [getattr(check.params, "every", 0) for check in scenario.checks if check.type == "replicas_agree"]
    return min((k for k in asked if isinstance(k, int) and k > 0), default=0)


def claimable(op: PlannedOp) -> bool:
    """Whether the rank's agent may fire ``op`` at the start of its step instead of the harness's poll: a kill
    with a plain ``at_step`` trigger, aimed at one rank (``params.rank``) whose own steps trigger it (no other
    trigger rank). The agent signals its own process, so the fault lands in the named step, not a poll interval
    after the job reported it. (Not a freeze: a rank frozen by its own agent that its launcher then kills leaves
    no heal in the history, where the harness's freeze records its heal at the deadline.)"""
    rank = op.params.get("rank")
    return (
        op.injector == "kill"
        and op.at_step is not None
        and op.phase is None
        and isinstance(rank, int)
        and op.rank in (None, rank)
    )
