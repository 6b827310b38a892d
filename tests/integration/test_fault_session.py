"""The one fault lifecycle (chaos.run.lifecycle.FaultSession) on real processes: journal before the world changes,
a switch armed, the fault recorded, healed once; a failed apply healed at once and raised; an irreversible fault
journaled healed; what the journal still lists healed by heal_all."""

from __future__ import annotations

import os
import time

import pytest
from support import sleeper, wait_for

from chaos import event_kinds as kinds
from chaos.cluster.local import LocalTransport, process_state
from chaos.history.timeline import History
from chaos.plugins.injector import Applied, FaultOp, InjectionContext, InjectionError
from chaos.run.lifecycle import FaultSession
from chaos.safety.journal import Journal
from chaos.spec.scenario import SafetySpec
from injectors.process.faults import FreezeInjector, KillInjector

pytestmark = pytest.mark.usefixtures("isolated_state_dir")

SAFETY = SafetySpec(max_duration=60.0, heal_grace=5.0)


def _session(history: History) -> FaultSession:
    ctx = InjectionContext(LocalTransport(), history=history)
    return FaultSession(
        Journal.for_run(f"session-{os.getpid()}-{time.monotonic_ns()}"), SAFETY, lambda _: ctx, history=history
    )


def _op(injector: str, pid: int, op_id: str = "f#1", duration_s: float | None = 30.0) -> FaultOp:
    params = (FreezeInjector if injector == "freeze" else KillInjector).Params.model_validate({"pid": pid})
    return FaultOp(op_id=op_id, fault="f", injector=injector, params=params, duration_s=duration_s)


def _kinds(history: History) -> list[str]:
    return [event.kind for event in history.events if event.kind.startswith("fault.")]


def test_a_fault_is_journaled_armed_applied_recorded_and_healed_once() -> None:
    history = History()
    session = _session(history)
    with sleeper("session-freeze") as child:
        active = session.fire(FreezeInjector(), _op("freeze", child.pid))
        # SIGSTOP is delivered asynchronously: under load /proc can say R for a moment after kill() returned
        assert wait_for(lambda: process_state(child.pid) == "T", 5)
        assert active.switch is not None and active.switch.pid is not None  # armed before the apply
        assert [a.op_id for a in session.journal.unhealed()] == ["f#1"]
        assert session.active == [active]
        session.heal(active)
        assert wait_for(lambda: process_state(child.pid) not in ("T", None), 5)
        session.heal(active)  # a second heal changes nothing (a deadline and a heal-all can meet)
    assert session.journal.unhealed() == [] and session.journal.healed_by("f#1") == "harness"
    assert _kinds(history) == [kinds.FAULT_APPLIED, kinds.FAULT_HEALED]
    assert session.active == []
    session.close()


class HalfApplied(FreezeInjector):
    """Freezes, then fails: the session must heal the half it applied."""

    def apply(self, ctx: InjectionContext, applied: Applied) -> None:
        super().apply(ctx, applied)
        raise InjectionError("the second half failed")


def test_a_failed_apply_is_journaled_healed_recorded_and_raised() -> None:
    history = History()
    session = _session(history)
    with sleeper("session-half") as child:
        with pytest.raises(InjectionError, match="second half"):
            session.fire(HalfApplied(), _op("freeze", child.pid))
        assert process_state(child.pid) not in ("T", None), "the half that was applied is still in force"
    assert session.journal.unhealed() == [] and session.journal.healed_by("f#1") == "harness"
    assert _kinds(history) == [kinds.FAULT_FAILED] and session.active == []


def test_an_irreversible_fault_is_journaled_healed_at_once_and_never_active() -> None:
    history = History()
    session = _session(history)
    with sleeper("session-kill") as child:
        active = session.fire(KillInjector(), _op("kill", child.pid))
        assert wait_for(lambda: child.poll() is not None, 5)
        session.heal(active)  # nothing to heal: no error, no second record
    assert session.journal.healed_by("f#1") == "irreversible" and session.active == []
    assert _kinds(history) == [kinds.FAULT_APPLIED]


def test_heal_all_heals_the_active_faults_and_what_only_the_journal_lists() -> None:
    history = History()
    session = _session(history)
    with sleeper("session-a") as first, sleeper("session-b") as second:
        session.fire(FreezeInjector(), _op("freeze", first.pid, "a#1"))
        # A fault journaled and applied whose registration a signal cut off: only the journal knows it.
        injector, ctx = FreezeInjector(), session.contexts("local")
        applied = injector.prepare(ctx, _op("freeze", second.pid, "b#1"))
        session.journal.intent(applied)
        injector.apply(ctx, applied)
        session.journal.applied("b#1", applied.state)
        assert session.heal_all() == []
        for child in (first, second):
            assert wait_for(lambda c=child: process_state(c.pid) not in ("T", None), 5)
    assert session.journal.unhealed() == []
    assert [e.get_str("op") for e in history.events if e.kind == kinds.FAULT_HEALED] == ["a#1", "b#1"]
