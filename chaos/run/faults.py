"""Pieces of a run's fault handling that hold no run state: which ops the job's agent fires itself, where a
rank-aimed fault lands, which dead-man a fault gets, how one fault reaches many hosts at once, and the record
of a fault applied on one host until it heals.

Every reversible fault gets a dead-man switch (:class:`DeadMan`). One with a ``duration`` fires at duration +
``safety.heal_grace``; one without fires at ``safety.max_duration`` + ``heal_grace``; and none later than the
run's deadline (the moment the harness ends the run: its fault clock's start + ``max_duration``) +
``heal_grace``, so whatever happens to the harness, no fault outlives the run by more than the grace. A switch
without that deadline (the pytest plugin's) and without a duration is re-armed (its deadline pushed a whole
window on) whenever half of the window is left, for as long as the harness lives and the fault is active.

Fan-out: one fault's hosts are all issued at once (:func:`parallel`, a thread per host up to
:data:`MAX_PARALLEL`), and on a remote host an injector with a one-command apply and heal (:class:`OneCommand`)
costs one round trip per action: the switch is armed and the fault applied by ONE command (the switch first;
the fault only once the switch runs), and heal and cancelling the switch are one command too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

from chaos.cluster.base import TransportError
from chaos.plan.agent_plan import InJobOp, write_plan
from chaos.plan.build import Plan, PlannedOp
from chaos.plugins import registry
from chaos.plugins.injector import Applied, InjectionContext, Injector, is_in_job
from chaos.safety import deadman, remote_deadman
from chaos.safety.remote_deadman import HostCommand
from chaos.spec.scenario import FaultSpec, SafetySpec, Scenario


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


MAX_PARALLEL = 256  # threads for one fan-out: every host's call is issued before any is waited on, up to this


def parallel(calls: list[Callable[[], None]]) -> None:
    """Run ``calls`` at once, a thread each (up to :data:`MAX_PARALLEL`; inline when there is one): the calls
    wait on remote hosts, not on this machine's cores, so the pool grows with the hosts. Every call runs to
    its end; the first exception then propagates."""
    if not calls:
        return
    if len(calls) == 1:
        calls[0]()
        return
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(calls)), thread_name_prefix="mlchaos-fault") as pool:
        for future in [pool.submit(call) for call in calls]:
            future.result()


@runtime_checkable
class OneCommand(Protocol):
    """Optional injector capability: its apply and its heal, each as ONE command on the fault's host (None when
    it cannot say so; the runner then calls ``apply``/``heal``, as it does when the command fails, so a failing
    command must change nothing)."""

    def apply_command(self, applied: Applied) -> HostCommand | None: ...

    def heal_command(self, applied: Applied) -> HostCommand | None: ...


def one_command(injector: object, applied: Applied, action: Literal["apply", "heal"]) -> HostCommand | None:
    """``injector``'s one command for ``action`` on ``applied``, or None."""
    if not isinstance(injector, OneCommand):
        return None
    return injector.apply_command(applied) if action == "apply" else injector.heal_command(applied)


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
    remote_pid: int | None = None  # the switch's pid on the host, when it reported one (cancelled by pid)
    applied_with_arm: bool = False  # the ``then`` command given to :meth:`arm` ran and succeeded

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
        then: HostCommand | None = None,
        ends_at: float = float("inf"),
    ) -> DeadMan | None:
        """Arm ``op_key``'s switch (on this machine when ``local``, else on ``ctx``'s host): at ``duration_s`` +
        heal_grace, or, without a duration, at max_duration + heal_grace and renewable; never later than
        ``ends_at`` (the run's deadline, monotonic) + heal_grace: a switch that reaches it fires there and is not
        renewed. None when the fault has no revert command (nothing a switch could run). Raises what starting it
        raises (RuntimeError, TransportError): the caller has applied nothing yet.

        ``then`` (the fault's :class:`OneCommand` apply) rides along on a remote host: one command arms the switch
        and, only once it runs, applies the fault. ``applied_with_arm`` says whether it did; when not (no
        ``then``, a local switch, or a command that failed and so changed nothing) the caller applies."""
        if not revert:
            return None
        renewable = duration_s is None
        window = (safety.max_duration if duration_s is None else duration_s) + safety.heal_grace
        by_deadline = ends_at + safety.heal_grace - time.monotonic()  # the run ends by then, harness alive or not
        if window >= by_deadline:
            window, renewable = max(by_deadline, 1.0), False
        switch = cls(ctx, journal_path, op_key, list(revert), window, renewable)
        switch.fires_at = time.monotonic() + window
        if local:
            switch.pid = deadman.arm(journal_path, op_key, revert, window)  # journals itself
            return switch
        switch.generation = 0 if renewable else None
        if then is None or not then.fits():
            _, switch.remote_pid = remote_deadman.start(
                ctx.transport, op_key, revert, window, generation=switch.generation
            )
            return switch
        argv = remote_deadman.armed_argv(op_key, revert, window, then, switch.generation)
        done = ctx.transport.run(argv, timeout=30.0)
        switch.remote_pid = remote_deadman.pid_of(done.stdout)
        if switch.remote_pid is None:  # the script stopped before the command (ARMED_FAILED)
            raise TransportError(f"dead-man switch not started on {ctx.transport.host}: {done.stderr.strip()[:300]}")
        switch.applied_with_arm = done.ok
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
            self.remote_pid = None  # a renewed switch is cancelled by its marker (every generation)
        self.fires_at = now + self.window_s
        return True

    def disarm(self) -> None:
        """Stand the switch down: the local process, or every generation on the host."""
        disarm(self.ctx, self.pid, None if self.pid is not None else remote_deadman.marker(self.op_key))

    def heal_and_disarm(self, then: HostCommand | None) -> bool:
        """Heal with ``then`` (the fault's :class:`OneCommand` heal) and cancel the remote switch, in ONE command;
        True when both happened. False, with the switch still armed, when that is not possible here (a local or
        renewed switch, no pid, no ``then``) or the command failed (it changed nothing): then the caller heals
        and disarms the usual way."""
        if then is None or not then.fits() or self.pid is not None or self.remote_pid is None or self.generation:
            return False
        mark = remote_deadman.marker(self.op_key, self.generation)
        try:
            return self.ctx.transport.run(remote_deadman.disarmed_argv(mark, self.remote_pid, then), timeout=30.0).ok
        except TransportError:
            return False


def heal_and_disarm(injector: Injector, ctx: InjectionContext, applied: Applied, switch: DeadMan | None) -> None:
    """Heal one fault on one host and stand its switch down: one round trip where the injector and the switch
    allow (:meth:`DeadMan.heal_and_disarm`), else the injector's ``heal`` then :meth:`DeadMan.disarm` (which runs
    even when the heal raises, as it always has)."""
    if switch is not None and switch.heal_and_disarm(one_command(injector, applied, "heal")):
        return
    try:
        injector.heal(ctx, applied)
    finally:
        if switch is not None:
            switch.disarm()


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
