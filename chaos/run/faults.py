"""Pieces of a run's fault handling that hold no run state: which ops the job's agent fires itself, where a
rank-aimed fault lands, which dead-man a fault gets, how one fault reaches many hosts at once, and the record
of a fault applied on one host until it heals.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from chaos.plan.agent_plan import InJobOp, write_plan
from chaos.plan.build import Plan, PlannedOp
from chaos.plugins import registry
from chaos.plugins.injector import Applied, InjectionContext, Injector, is_in_job
from chaos.safety import deadman, remote_deadman
from chaos.spec.scenario import FaultSpec


def in_job_plan(plan: Plan, run_dir: Path) -> tuple[list[PlannedOp], Path]:
    """Split off the ops the job's agent fires itself and write them to the plan file it reads."""
    in_job = [op for op in plan.ops if is_in_job(registry.injectors()[op.injector])]
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
            )
            for op in in_job
        ],
    )
    return in_job, path


def parallel(calls: list[Callable[[], None]]) -> None:
    """Run ``calls`` on up to 8 threads (inline when there is one); the first exception propagates."""
    if not calls:
        return
    if len(calls) == 1:
        calls[0]()
        return
    with ThreadPoolExecutor(max_workers=min(8, len(calls)), thread_name_prefix="mlchaos-fault") as pool:
        for future in [pool.submit(call) for call in calls]:
            future.result()


@dataclass
class ActiveFault:
    """A fault applied on one host, with what it takes to heal it there."""

    op: PlannedOp
    injector: Injector
    applied: Applied
    ctx: InjectionContext
    deadman_pid: int | None
    remote_marker: str | None
    heal_at: float | None = field(init=False)

    def __post_init__(self) -> None:
        self.heal_at = time.monotonic() + self.op.duration_s if self.op.duration_s is not None else None


def disarm(ctx: InjectionContext, deadman_pid: int | None, remote_marker: str | None) -> None:
    """Stand down a fault's dead-man: the local reverter process, the one on ``ctx``'s host, or neither."""
    if deadman_pid is not None:
        deadman.disarm(deadman_pid)
    if remote_marker is not None:
        remote_deadman.disarm(ctx.transport, remote_marker)


def reverts_on_harness(injector: object, applied: Applied) -> bool:
    """Whether an op's dead-man must run on this machine: the injector's ``revert_on_harness`` flag, or its
    ``revert_on_harness(applied)`` answer (e.g. a container's storage layer, mounted on the docker host)."""
    flag = getattr(injector, "revert_on_harness", False)
    return bool(flag(applied)) if callable(flag) else bool(flag)


def rank_of(fault: FaultSpec) -> int | None:
    """The training rank that decides a fault's host: ``hosts.rank``, or (no ``hosts``) a ``rank`` param."""
    if fault.hosts is not None:
        return fault.hosts.rank
    rank = getattr(fault.params, "rank", None)
    return rank if isinstance(rank, int) else None
