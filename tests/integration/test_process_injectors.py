"""kill / freeze / slow against real child processes (no OS mocks); every test ends what it started."""

from __future__ import annotations

import os
import signal
import time
import uuid

import pytest
from pydantic import BaseModel, ValidationError
from support import PseudoRemote, sampled_states, sleeper, wait_for

from chaos.cluster.local import LocalTransport, process_state
from chaos.plugins import registry
from chaos.plugins.injector import Applied, FaultOp, InjectionContext, InjectionError, Unsupported
from injectors.process import dutycycle
from injectors.process.faults import (
    FreezeInjector,
    FreezeParams,
    KillInjector,
    KillParams,
    SlowInjector,
    SlowParams,
)

pytestmark = pytest.mark.usefixtures("isolated_state_dir")  # each test journals into a state dir of its own


def running(pid: int) -> bool:
    return process_state(pid) not in (None, "T", "Z")


def op(injector: str, params: BaseModel, duration_s: float | None = None) -> FaultOp:
    return FaultOp(
        op_id=f"op-{uuid.uuid4().hex[:8]}", fault="f", injector=injector, params=params, duration_s=duration_s
    )


class Ranks:
    """A target that reports ranks, as torchrun does (plain data, no OS behaviour faked)."""

    def __init__(self, pids: dict[int, int]) -> None:
        self._pids = pids

    def pids_for_rank(self, rank: int) -> list[int]:
        return [self._pids[rank]] if rank in self._pids else []

    def ranks(self) -> list[int]:
        return sorted(self._pids)


CTX = InjectionContext(LocalTransport())


def test_registry_finds_all_three() -> None:
    assert {"kill", "freeze", "slow"} <= set(registry.injectors())
    for name in ("kill", "freeze", "slow"):
        assert registry.injectors()[name].summary


# -- kill -------------------------------------------------------------------------------------------------------


def test_kill_by_pid() -> None:
    with sleeper() as child:
        injector = KillInjector()
        injector.check(CTX, KillParams(pid=child.pid))
        record = injector.prepare(CTX, op("kill", KillParams(pid=child.pid)))
        assert record.reversible is False and injector.revert_command(record) is None
        assert record.description == f"SIGKILL pid {child.pid}"
        injector.apply(CTX, record)
        assert child.wait(timeout=15) == -signal.SIGKILL
        injector.heal(CTX, record)  # nothing to undo, and it must not fail


def test_kill_by_name_regex_with_another_signal() -> None:
    marker = f"victim-{uuid.uuid4().hex}"
    with sleeper(marker) as child, sleeper("bystander") as bystander:
        record = KillInjector().prepare(CTX, op("kill", KillParams(name=f"victim-{marker[7:]}$", signal="TERM")))
        assert record.state["pids"] == [child.pid]
        assert record.state["signal"] == "SIGTERM"
        KillInjector().apply(CTX, record)
        assert child.wait(timeout=15) == -signal.SIGTERM
        assert running(bystander.pid)


def test_kill_of_an_already_exited_process_is_not_an_error() -> None:
    with sleeper() as child:
        record = KillInjector().prepare(CTX, op("kill", KillParams(pid=child.pid)))
        child.kill()
        child.wait()
        KillInjector().apply(CTX, record)


def test_kill_by_rank_and_without_a_rank_resolver() -> None:
    with sleeper() as child:
        ctx = InjectionContext(LocalTransport(), target=Ranks({1: child.pid}))
        record = KillInjector().prepare(ctx, op("kill", KillParams(rank=1)))
        assert record.description == f"SIGKILL rank 1 (pid {child.pid})"
        KillInjector().apply(ctx, record)
        assert child.wait(timeout=15) == -signal.SIGKILL
    with pytest.raises(InjectionError, match="does not report ranks"):
        KillInjector().prepare(CTX, op("kill", KillParams(rank=0)))
    with pytest.raises(InjectionError, match="no running process for rank 3"):
        KillInjector().prepare(InjectionContext(LocalTransport(), target=Ranks({})), op("kill", KillParams(rank=3)))


def test_selectors_never_hit_the_harness_or_nothing() -> None:
    with pytest.raises(InjectionError, match="harness"):
        FreezeInjector().prepare(CTX, op("freeze", FreezeParams(pid=os.getpid()), 5))
    with pytest.raises(InjectionError, match="harness"):
        FreezeInjector().prepare(CTX, op("freeze", FreezeParams(pid=os.getppid()), 5))
    with pytest.raises(InjectionError, match="no running process"):
        KillInjector().prepare(CTX, op("kill", KillParams(name=f"nothing-runs-this-{uuid.uuid4().hex}")))


# -- freeze -----------------------------------------------------------------------------------------------------


def test_freeze_then_heal_twice_then_heal_after_exit() -> None:
    with sleeper() as child:
        injector = FreezeInjector()
        record = injector.prepare(CTX, op("freeze", FreezeParams(pid=child.pid), 20))
        assert record.description == f"SIGSTOP pid {child.pid} for 20s"
        revert = injector.revert_command(record)  # a constant sh script; run for real in test_fault_holds.py
        assert revert is not None and revert[:2] == ["sh", "-c"] and revert[-1].startswith(f"{child.pid}-")
        injector.apply(CTX, record)
        assert wait_for(lambda: process_state(child.pid) == "T", 5)
        injector.heal(CTX, record)
        assert wait_for(lambda: running(child.pid), 5)
        injector.heal(CTX, record)
        assert running(child.pid)
        child.kill()
        child.wait()
        injector.heal(CTX, record)


def test_freeze_needs_a_duration() -> None:
    with sleeper() as child, pytest.raises(InjectionError, match="needs a duration"):
        FreezeInjector().prepare(CTX, op("freeze", FreezeParams(pid=child.pid)))


def test_freeze_heal_skips_a_reused_pid() -> None:
    with sleeper() as child:
        injector = FreezeInjector()
        record = injector.prepare(CTX, op("freeze", FreezeParams(pid=child.pid), 20))
        injector.apply(CTX, record)
        try:
            assert wait_for(lambda: process_state(child.pid) == "T", 5)
            # As if the recorded process had exited and its pid now belonged to a stranger.
            stranger = record.model_copy(deep=True)
            stranger.state["start_times"] = [record.state["start_times"][0] + 1]  # type: ignore[index,operator]
            injector.heal(CTX, stranger)
            time.sleep(0.3)
            assert process_state(child.pid) == "T"
        finally:
            os.kill(child.pid, signal.SIGCONT)


def test_freeze_through_command_transport_and_name() -> None:
    marker = f"remote-{uuid.uuid4().hex}"
    ctx = InjectionContext(PseudoRemote())
    with sleeper(marker) as child:
        FreezeInjector().check(ctx, FreezeParams(name=marker))
        record = FreezeInjector().prepare(ctx, op("freeze", FreezeParams(name=marker), 10))
        assert record.host == "pseudo-remote" and record.state["pids"] == [child.pid]
        try:
            FreezeInjector().apply(ctx, record)
            assert wait_for(lambda: process_state(child.pid) == "T", 5)
            FreezeInjector().heal(ctx, record)
            assert wait_for(lambda: running(child.pid), 5)
        finally:
            os.kill(child.pid, signal.SIGCONT)


def test_check_reports_a_missing_kill_binary() -> None:
    ctx = InjectionContext(PseudoRemote(kill_binary="/nonexistent/kill"))
    for injector in (KillInjector(), FreezeInjector(), SlowInjector()):
        with pytest.raises(Unsupported, match="kill"):
            injector.check(ctx, FreezeParams(pid=2))


# -- slow -------------------------------------------------------------------------------------------------------


def _helper(record: Applied) -> int:
    helper = record.state["helper_pid"]
    assert isinstance(helper, int)
    return helper


def _end_helper(record: Applied) -> None:
    helper = record.state.get("helper_pid")
    if isinstance(helper, int) and dutycycle_alive(helper, record.op_id):
        os.kill(helper, signal.SIGKILL)


def dutycycle_alive(pid: int, op_id: str) -> bool:
    from chaos.safety.deadman import is_helper

    return is_helper(pid, dutycycle.MODULE, op_id)


def test_slow_cycles_then_heal_resumes_and_ends_the_helper() -> None:
    with sleeper() as child:
        injector = SlowInjector()
        params = SlowParams(pid=child.pid, stopped_fraction=0.5, period="200ms")
        record = injector.prepare(CTX, op("slow", params, 30))
        assert record.description == f"SIGSTOP/SIGCONT pid {child.pid} 50% of every 0.2s for 30s"
        try:
            injector.apply(CTX, record)
            helper = _helper(record)
            assert dutycycle_alive(helper, record.op_id)
            states = sampled_states(child.pid, 2.0)
            assert "T" in states and any(state in ("S", "R") for state in states), states
            injector.heal(CTX, record)
            assert not dutycycle_alive(helper, record.op_id)
            assert all(state in ("S", "R") for state in sampled_states(child.pid, 0.6))
            injector.heal(CTX, record)  # twice is fine
        finally:
            _end_helper(record)
            os.kill(child.pid, signal.SIGCONT)


def test_slow_helper_ends_by_itself_and_leaves_the_target_running() -> None:
    with sleeper() as child:
        record = SlowInjector().prepare(CTX, op("slow", SlowParams(pid=child.pid, stopped_fraction=0.9, period=0.3), 1))
        try:
            SlowInjector().apply(CTX, record)
            helper = _helper(record)
            assert wait_for(lambda: not dutycycle_alive(helper, record.op_id), 1 + 15)
            assert running(child.pid)
        finally:
            _end_helper(record)
            os.kill(child.pid, signal.SIGCONT)


def test_slow_heal_finds_an_unjournaled_helper_by_op_id() -> None:
    with sleeper() as child:
        record = SlowInjector().prepare(CTX, op("slow", SlowParams(pid=child.pid, stopped_fraction=0.8), 30))
        journaled = record.model_copy(deep=True)  # what the journal holds if we crash right after apply
        try:
            SlowInjector().apply(CTX, record)
            helper = _helper(record)
            assert "helper_pid" not in journaled.state
            SlowInjector().heal(CTX, journaled)
            assert not dutycycle_alive(helper, record.op_id)
            assert wait_for(lambda: running(child.pid), 5)
        finally:
            _end_helper(record)
            os.kill(child.pid, signal.SIGCONT)


def test_slow_needs_a_duration() -> None:
    with sleeper() as child, pytest.raises(InjectionError, match="needs a duration"):
        SlowInjector().prepare(CTX, op("slow", SlowParams(pid=child.pid)))


# -- params -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "fields", "message"),
    [
        (KillParams, {}, "exactly one of rank, pid, name, replica or port (got none)"),
        (FreezeParams, {"pid": 5, "rank": 1}, "exactly one of rank, pid, name, replica or port (got rank, pid)"),
        (SlowParams, {"pid": 5, "name": "x", "rank": 0}, "got rank, pid, name"),
        (KillParams, {"name": "("}, "not a valid regex"),
        (KillParams, {"pid": 1}, "greater than or equal to 2"),
        (KillParams, {"pid": 5, "signal": "SIGNOPE"}, "unknown signal"),
        (KillParams, {"pid": 5, "sig": "KILL"}, "Extra inputs are not permitted"),
        (SlowParams, {"pid": 5, "stopped_fraction": 1.0}, "less than 1"),
        (SlowParams, {"pid": 5, "period": "soon"}, "not a duration"),
    ],
)
def test_params_validation(model: type[BaseModel], fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        model.model_validate(fields)


def test_params_normalise_signal_and_duration() -> None:
    assert KillParams(pid=5, signal="term").signal == "SIGTERM"
    assert KillParams(pid=5, signal="9").signal == "SIGKILL"
    assert SlowParams(pid=5, period="1m30s").period == 90.0
