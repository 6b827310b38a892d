"""One fault's dead-man switch: a detached reverter armed before the fault is applied, that undoes the fault
when nothing stands it down in time (the harness died, hung or lost its host).

Every reversible fault gets one (:class:`DeadMan`). One with a ``duration`` fires at duration + ``heal_grace``;
one without fires at ``max_duration`` + ``heal_grace`` and is renewable; none fires later than the run's
deadline + ``heal_grace``. On a remote host an injector with a one-command apply and heal (:class:`OneCommand`)
costs one round trip per action. The reasoning is in docs/design/deadman.md.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

from chaos.cluster.base import TransportError
from chaos.plugins.injector import Applied, InjectionContext
from chaos.safety import deadman, remote_deadman
from chaos.safety.remote_deadman import HostCommand
from chaos.spec.scenario import SafetySpec


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
