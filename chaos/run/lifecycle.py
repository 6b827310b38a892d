"""One fault lifecycle for every way in: journal -> dead-man switch -> apply -> record -> heal, and renewal.

The runner (which game days drive too) and the pytest ``chaos_inject`` fixture fire faults through a
:class:`FaultSession`. Its contract: a fault's intent is journaled (fsync) and its switch armed BEFORE the world
changes; a fault that fails to apply is journaled ``failed``, whatever part of it was applied is healed, and the
exception propagates; an irreversible fault is journaled healed at once; a heal stands the switch down and
journals who healed. With a history, ``fault.applied`` / ``fault.healed`` / ``fault.failed`` are recorded.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from chaos import event_kinds as kinds
from chaos.cluster.base import TransportError
from chaos.cluster.hosts import LOCAL
from chaos.history.timeline import History, now_ns
from chaos.plugins import registry
from chaos.plugins.injector import Applied, FaultOp, InjectionContext, InjectionError, Injector
from chaos.run.switch import DeadMan, disarm, one_command, reverts_on_harness
from chaos.safety import remote_deadman
from chaos.safety.journal import Journal
from chaos.spec.scenario import SafetySpec

# What a fault's prepare or apply raises when it cannot happen here and now: the run goes on without it.
FAULT_FAILURES: tuple[type[BaseException], ...] = (InjectionError, ValueError, OSError, TransportError)


@dataclass
class ActiveFault:
    """A fault applied on one host, with what it takes to heal it there. ``op`` is the op as asked (its
    ``op_id`` the plan's); ``applied.op_id`` is the journal's (``<op>@<host>`` off this machine)."""

    op: FaultOp
    injector: Injector
    applied: Applied
    ctx: InjectionContext
    switch: DeadMan | None
    heal_at: float | None = field(init=False)

    def __post_init__(self) -> None:
        self.heal_at = time.monotonic() + self.op.duration_s if self.op.duration_s is not None else None


def heal_and_disarm(injector: Injector, ctx: InjectionContext, applied: Applied, switch: DeadMan | None) -> None:
    """Heal one fault on one host and stand its switch down: one round trip where the injector and the switch
    allow (:meth:`DeadMan.heal_and_disarm`), else the injector's ``heal`` then :meth:`DeadMan.disarm` (which runs
    even when the heal raises)."""
    if switch is not None and switch.heal_and_disarm(one_command(injector, applied, "heal")):
        return
    try:
        injector.heal(ctx, applied)
    finally:
        if switch is not None:
            switch.disarm()


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


def quiet(_: object) -> None:
    """A listener that says nothing (the default log)."""


@dataclass(eq=False)
class FaultSession:
    """The faults one harness process applies, from intent to heal.

    ``journal``: where intents, applies and heals go (``mlchaos cleanup`` and the switches read it). ``safety``:
    ``heal_grace`` and ``max_duration`` size the switches. ``contexts(host)``: the injection context for a host
    (the journal's leftovers are healed through it). ``ends_at``: the run's deadline (monotonic; set it when the
    fault clock starts): every switch fires by then + ``heal_grace``. Thread-safe: hosts fire and heal in threads.
    """

    journal: Journal
    safety: SafetySpec
    contexts: Callable[[str], InjectionContext]
    _: KW_ONLY
    history: History | None = None
    log: Callable[[str], None] = quiet
    ends_at: float = field(init=False, default=float("inf"))
    _active: list[ActiveFault] = field(init=False, default_factory=list)
    # the active list; a renewal and a heal of the same fault never overlap
    _lock: threading.RLock = field(init=False, default_factory=threading.RLock)
    _renewer: threading.Thread | None = field(init=False, default=None)
    _stop_renewing: threading.Event = field(init=False, default_factory=threading.Event)

    @property
    def active(self) -> list[ActiveFault]:
        """The faults applied and not yet healed, oldest first (a copy)."""
        with self._lock:
            return list(self._active)

    def fire(
        self,
        injector: Injector,
        op: FaultOp,
        *,
        host: str = LOCAL,
        journal_id: str | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> ActiveFault:
        """Prepare, journal, arm, apply and record ``op`` on ``host``; the fault is then active until :meth:`heal`,
        unless it is irreversible (a signal: journaled healed at once, never active; healing it does nothing). ``journal_id`` names it in the journal
        (default: its op id); ``details`` go into its ``fault.applied`` event. Raises what preparing, arming or
        applying raised, after journaling and healing whatever part was applied (and recording ``fault.failed``).
        """
        ctx = self.contexts(host)
        journal_id = journal_id or op.op_id
        try:
            applied = injector.prepare(ctx, op.model_copy(update={"op_id": journal_id})).model_copy(
                update={"host": host}
            )
        except FAULT_FAILURES as exc:
            self._failed(op, host, exc, f"fault {journal_id} could not be prepared: {exc}")
            raise
        self.journal.intent(applied)  # a crash from here on leaves a healable record
        local = host == LOCAL or reverts_on_harness(injector, applied)
        switch: DeadMan | None = None
        sent_ns = now_ns()
        try:
            switch = DeadMan.arm(
                ctx,
                self.journal.path,
                journal_id,
                injector.revert_command(applied),
                op.duration_s,
                self.safety,
                local=local,
                then=one_command(injector, applied, "apply"),  # remote: armed and applied in one round trip
                ends_at=self.ends_at,
            )
            # The fault's time: BEFORE the signal or rule goes out (what checks split before/after at); when the
            # host applied it with its switch in one round trip, when is not known here: that round trip's end.
            sent_ns = now_ns()
            if switch is None or not switch.applied_with_arm:
                injector.apply(ctx, applied)
        except BaseException as exc:
            self.journal.failed(journal_id, str(exc))
            try:
                heal_and_disarm(injector, ctx, applied, switch)  # raises: the journal keeps it, the switch armed
                self.journal.healed(journal_id, "harness")
            finally:
                if isinstance(exc, FAULT_FAILURES):
                    self._failed(op, host, exc, f"fault {journal_id} failed: {exc}")
            raise
        self.journal.applied(journal_id, applied.state)
        if self.history is not None:
            self.history.record(
                kinds.FAULT_APPLIED,
                ts_ns=sent_ns,
                fault=op.fault,
                op=op.op_id,
                injector=op.injector,
                host=host,
                description=applied.description,
                duration_s=op.duration_s,
                apply_s=round((now_ns() - sent_ns) / 1e9, 4),
                **(details or {}),
            )
        where = "" if host == LOCAL else f" on {host}"
        self.log(f"fault applied{where}: {applied.description or op.op_id}")
        active = ActiveFault(op, injector, applied, ctx, switch)
        if not applied.reversible:
            self.journal.healed(journal_id, "irreversible")
            return active
        with self._lock:
            self._active.append(active)
        return active

    def heal(self, active: ActiveFault) -> None:
        """Heal one active fault and stand its switch down, then journal and record the heal. When healing raises,
        the fault is no longer active here but stays unhealed in the journal (its switch armed): :meth:`heal_all`
        and ``mlchaos cleanup`` retry it."""
        with self._lock:
            if active not in self._active:
                return  # healed already (a deadline and an operator's heal-all can meet), or irreversible
            self._active.remove(active)
        heal_and_disarm(active.injector, active.ctx, active.applied, active.switch)
        self.journal.healed(active.applied.op_id, "harness")
        if self.history is not None:
            self.history.record(
                kinds.FAULT_HEALED,
                fault=active.op.fault,
                op=active.op.op_id,
                injector=active.op.injector,
                host=active.applied.host,
            )
        self.log(f"fault healed: {active.applied.op_id}")

    def due(self, now: float) -> list[ActiveFault]:
        """The active faults whose duration is over at ``now`` (monotonic)."""
        return [a for a in self.active if a.heal_at is not None and a.heal_at <= now]

    def renew(self, now: float) -> list[str]:
        """Push on every renewable switch that is due (:func:`renew_switches`); returns one line per switch that
        could not be renewed (it stays armed at its old deadline), also logged and recorded."""
        with self._lock:
            problems = renew_switches(self._active, now, self.log)
        if self.history is not None:
            for problem in problems:
                self.history.record(kinds.RUNNER_DEADMAN_NOT_RENEWED, detail=problem)
        return problems

    def keep_renewed(self, every_s: float = 1.0) -> None:
        """Renew due switches from a daemon thread every ``every_s`` until :meth:`close` (for a harness with no
        loop of its own, such as the pytest fixture): the switches then fire only once this process is gone."""
        with self._lock:
            if self._renewer is not None:
                return
            self._renewer = threading.Thread(
                target=self._renew_loop, args=(every_s,), name="mlchaos-renew", daemon=True
            )
            self._renewer.start()

    def _renew_loop(self, every_s: float) -> None:
        while not self._stop_renewing.wait(every_s):
            self.renew(time.monotonic())

    def heal_all(self) -> list[str]:
        """Heal every active fault, newest first, then whatever the journal still lists as unhealed (a signal can
        land between an apply and its registration as active); returns errors, never stops early."""
        errors = []
        for active in reversed(self.active):
            try:
                self.heal(active)
            except Exception as exc:  # one failed heal must not stop the others
                errors.append(f"{active.op.op_id}: {exc}")
        for applied in self.journal.unhealed():
            try:
                ctx = self.contexts(applied.host)
                registry.injector(applied.injector).heal(ctx, applied)
                marker = None if applied.host == LOCAL else remote_deadman.marker(applied.op_id)
                disarm(ctx, self.journal.deadman_pid(applied.op_id), marker)
                self.journal.healed(applied.op_id, "harness")
                if self.history is not None:
                    self.history.record(
                        kinds.FAULT_HEALED, fault=applied.fault, op=applied.op_id, injector=applied.injector
                    )
            except Exception as exc:
                errors.append(f"{applied.op_id}: {exc}")
        return errors

    def close(self) -> None:
        """Stop renewing (the faults' switches stay armed: heal first, or let them fire)."""
        self._stop_renewing.set()
        if self._renewer is not None:
            self._renewer.join(timeout=5)

    def _failed(self, op: FaultOp, host: str, exc: BaseException, line: str) -> None:
        if self.history is not None:
            self.history.record(
                kinds.FAULT_FAILED, fault=op.fault, op=op.op_id, injector=op.injector, host=host, error=str(exc)
            )
        self.log(line)
