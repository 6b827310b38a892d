"""Pieces of a run's fault handling that hold no run state: which ops the job's agent fires itself, where a
rank-aimed fault lands, which dead-man a fault gets, how one fault reaches many hosts at once, and the record
of a fault applied on one host until it heals.

Every reversible fault gets a dead-man switch (:class:`DeadMan`). One with a ``duration`` fires at duration +
``safety.heal_grace``; one without fires at ``safety.max_duration`` + ``heal_grace`` and is re-armed (its
deadline pushed a whole window on) whenever half of the window is left, for as long as the harness lives and
the fault is active; so a SIGKILLed harness leaves a duration-less fault in place at most one window.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from chaos.plan.agent_plan import InJobOp, write_plan
from chaos.plan.build import Plan, PlannedOp
from chaos.plugins import registry
from chaos.plugins.injector import Applied, InjectionContext, Injector, is_in_job
from chaos.safety import deadman, remote_deadman
from chaos.spec.scenario import FaultSpec, SafetySpec


def in_job_plan(plan: Plan, run_dir: Path) -> tuple[list[PlannedOp], Path]:
    """Split off the ops the job's agent fires itself and write them to the plan file it reads: in-job faults,
    and process faults with a ``trigger.phase`` (the rank's agent signals its own process at that point)."""
    in_job = [op for op in plan.ops if is_in_job(registry.injectors()[op.injector]) or op.phase is not None]
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
                phase=op.phase,
                duration_s=op.duration_s,
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
class DeadMan:
    """One fault's armed dead-man switch: the local reverter process (``pid``) or the ``sh`` on the fault's host
    (generation ``generation`` of the op's marker), its monotonic deadline, and whether it is renewed.

    Build it with :meth:`arm`; :meth:`renew_if_due` pushes a renewable one on; :meth:`disarm` stands it down.
    """

    ctx: InjectionContext
    journal_path: Path
    op_key: str
    revert: list[str]
    window_s: float
    renewable: bool
    pid: int | None = None
    generation: int | None = None
    fires_at: float = field(default=0.0)
    next_try: float = field(default=0.0)  # after a failed renewal, not before this (no retry storm)

    @classmethod
    def arm(
        cls,
        ctx: InjectionContext,
        journal_path: Path,
        op_key: str,
        revert: list[str] | None,
        duration_s: float | None,
        safety: SafetySpec,
        *,
        local: bool,
    ) -> DeadMan | None:
        """Arm ``op_key``'s switch (on this machine when ``local``, else on ``ctx``'s host): at ``duration_s`` +
        heal_grace, or, without a duration, at max_duration + heal_grace and renewable. None when the fault has
        no revert command (nothing a switch could run). Raises what starting it raises (RuntimeError,
        TransportError): the caller has applied nothing yet."""
        if not revert:
            return None
        renewable = duration_s is None
        window = (safety.max_duration if duration_s is None else duration_s) + safety.heal_grace
        switch = cls(ctx, journal_path, op_key, list(revert), window, renewable)
        switch.fires_at = time.monotonic() + window
        if local:
            switch.pid = deadman.arm(journal_path, op_key, revert, window)  # journals itself
        else:
            switch.generation = 0 if renewable else None
            remote_deadman.arm(ctx.transport, op_key, revert, window, generation=switch.generation)
        return switch

    def renew_if_due(self, now: float) -> bool:
        """Push a renewable switch a whole window on once half of its window is left; True when it did.

        A local switch reads its new deadline from the journal; a remote one is replaced by its next generation.
        Raises what that raises (OSError, RuntimeError, TransportError); the old switch then stays armed.
        """
        if not self.renewable or self.fires_at - now > self.window_s / 2 or now < self.next_try:
            return False
        self.next_try = now + min(5.0, self.window_s / 10)
        if self.pid is not None:
            deadman.rearm(self.journal_path, self.op_key, self.pid, self.window_s)
        else:
            generation = self.generation or 0
            remote_deadman.rearm(self.ctx.transport, self.op_key, self.revert, self.window_s, generation)
            self.generation = generation + 1
        self.fires_at = now + self.window_s
        return True

    def disarm(self) -> None:
        """Stand the switch down: the local process, or every generation on the host."""
        disarm(self.ctx, self.pid, None if self.pid is not None else remote_deadman.marker(self.op_key))


@dataclass
class ActiveFault:
    """A fault applied on one host, with what it takes to heal it there."""

    op: PlannedOp
    injector: Injector
    applied: Applied
    ctx: InjectionContext
    switch: DeadMan | None
    heal_at: float | None = field(init=False)

    def __post_init__(self) -> None:
        self.heal_at = time.monotonic() + self.op.duration_s if self.op.duration_s is not None else None


def renew_switches(active: Sequence[ActiveFault], now: float, log: Callable[[str], None]) -> list[str]:
    """Renew every active fault's switch that is due (see :meth:`DeadMan.renew_if_due`); returns one line per
    switch that could not be renewed (it stays armed at its old deadline), also given to ``log``."""
    problems = []
    for fault in list(active):
        if fault.switch is None:
            continue
        try:
            fault.switch.renew_if_due(now)
        except Exception as exc:  # noqa: BLE001 - a failed renewal must not end the run; it is reported
            problems.append(f"{fault.applied.op_id}: dead-man not renewed: {type(exc).__name__}: {exc}")
            log(problems[-1])
    return problems


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
