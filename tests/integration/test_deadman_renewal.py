"""Dead-man switches for faults without a duration: armed at max_duration + heal_grace, re-armed while the harness
lives, against real stopped processes; the local reverter (journal-driven) and the host's ``sh`` (generations).

The revert of every switch here continues a stopped child, so "fired" is read from /proc. Deadlines are a few
seconds; the asserts only say "not before the pushed deadline's neighbourhood" and "eventually", never exact.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from support import cont, frozen_child, wait_for

from chaos.cluster.base import Completed, TransportError
from chaos.cluster.local import LocalTransport, process_state
from chaos.plugins.injector import Applied, FaultOp, InjectionContext
from chaos.run.lifecycle import ActiveFault, renew_switches
from chaos.run.switch import DeadMan
from chaos.safety import deadman, remote_deadman
from chaos.safety.journal import HEALED_BY_DEADMAN, Journal
from chaos.spec.scenario import SafetySpec
from injectors.process.faults import FreezeInjector

pytestmark = pytest.mark.usefixtures("isolated_state_dir")


@contextmanager
def journal_for(pid: int, op_id: str) -> Iterator[Journal]:
    with Journal.for_run(f"run-{uuid.uuid4().hex[:6]}") as journal:
        journal.intent(Applied(op_id=op_id, fault="hang", injector="freeze", state={"pids": [pid], "start_times": [0]}))
        yield journal


def stays_stopped(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process_state(pid) != "T":
            return False
        time.sleep(0.05)
    return True


def remote_switches(op_key: str) -> list[int]:
    """Pids of the host-side switches of ``op_key`` (any generation) on this machine."""
    found = subprocess.run(["pgrep", "-f", remote_deadman.marker(op_key)], capture_output=True, text=True, check=False)
    return [int(pid) for pid in found.stdout.split()]


def test_a_rearmed_local_deadman_fires_at_its_new_deadline_not_its_first() -> None:
    with frozen_child() as child, journal_for(child.pid, "op1") as journal:
        pid = deadman.arm(journal.path, "op1", cont(child.pid), 2.0)
        try:
            deadman.rearm(journal.path, "op1", pid, 6.0)  # a live harness pushes it on
            assert stays_stopped(child.pid, 4.0), "the dead-man fired at the deadline it was armed with"
            assert wait_for(lambda: process_state(child.pid) not in ("T", None), 10)
            assert wait_for(lambda: journal.healed_by("op1") == HEALED_BY_DEADMAN, 10)
        finally:
            deadman.disarm(pid)


def test_a_rearm_recorded_for_another_deadman_pid_is_ignored() -> None:
    with frozen_child() as child, journal_for(child.pid, "op1") as journal:
        pid = deadman.arm(journal.path, "op1", cont(child.pid), 2.0)
        try:
            journal.deadman("op1", pid + 1, time.time_ns() + 60 * 10**9)  # not this dead-man's record
            assert wait_for(lambda: process_state(child.pid) not in ("T", None), 10)
        finally:
            deadman.disarm(pid)


def test_remote_switch_generations_replace_each_other_and_the_op_marker_cancels_all() -> None:
    transport = LocalTransport()
    key = f"op-{uuid.uuid4().hex[:8]}"
    with frozen_child() as child:
        try:
            remote_deadman.arm(transport, key, cont(child.pid), 2.0, generation=0)
            mark = remote_deadman.rearm(transport, key, cont(child.pid), 6.0, 0)
            assert mark == remote_deadman.marker(key, 1)
            # the cancelled generation is signalled, and gone a moment later (under load /proc can still list it)
            assert wait_for(lambda: len(remote_switches(key)) == 1, 5), remote_switches(key)
            assert stays_stopped(child.pid, 4.0), "the replaced generation still fired"
            assert wait_for(lambda: process_state(child.pid) not in ("T", None), 10)
            os.kill(child.pid, signal.SIGSTOP)
            remote_deadman.arm(transport, key, cont(child.pid), 2.0, generation=2)
            remote_deadman.arm(transport, key, cont(child.pid), 2.0, generation=3)
            assert wait_for(lambda: len(remote_switches(key)) == 2, 5)
            assert remote_deadman.disarm(transport, remote_deadman.marker(key))
            assert wait_for(lambda: remote_switches(key) == [], 5)
            assert stays_stopped(child.pid, 3.0), "a cancelled generation fired"
        finally:
            remote_deadman.disarm(transport, remote_deadman.marker(key))


def _active(switch: DeadMan, pid: int) -> ActiveFault:
    op = FaultOp(
        op_id=switch.op_key, fault="hang", injector="freeze", params=FreezeInjector.Params.model_construct(pid=pid)
    )
    applied = Applied(op_id=switch.op_key, fault="hang", injector="freeze")
    return ActiveFault(op, FreezeInjector(), applied, switch.ctx, switch)


@pytest.mark.parametrize("local", [True, False])
def test_a_durationless_fault_is_armed_at_max_duration_plus_grace_and_renewed_while_alive(local: bool) -> None:
    safety = SafetySpec(max_duration=3.0, heal_grace=1.0)
    op_key = f"hang-{uuid.uuid4().hex[:6]}#1"
    ctx = InjectionContext(LocalTransport())
    with frozen_child() as child, journal_for(child.pid, op_key) as journal:
        switch = DeadMan.arm(ctx, journal.path, op_key, cont(child.pid), None, safety, local=local)
        assert switch is not None and switch.renewable and switch.window_s == pytest.approx(4.0)
        try:
            armed = time.monotonic()
            active = [_active(switch, child.pid)]
            # The harness's loop, for longer than the first deadline: every renewal pushes the switch on.
            while time.monotonic() - armed < 6.0:
                assert renew_switches(active, time.monotonic(), print) == []
                assert process_state(child.pid) == "T", "the switch fired while the harness was alive"
                time.sleep(0.05)
            assert local or switch.generation is not None and switch.generation >= 1
            # The harness "dies": nothing renews it any more, so it fires within one window.
            assert wait_for(lambda: process_state(child.pid) not in ("T", None), switch.window_s + 6)
        finally:
            switch.disarm()


def test_a_fault_with_a_duration_is_armed_once_and_never_renewed() -> None:
    safety = SafetySpec(max_duration=300.0, heal_grace=1.0)
    ctx = InjectionContext(LocalTransport())
    with frozen_child() as child, journal_for(child.pid, "op1") as journal:
        switch = DeadMan.arm(ctx, journal.path, "op1", cont(child.pid), 1.0, safety, local=True)
        assert switch is not None and not switch.renewable and switch.window_s == pytest.approx(2.0)
        try:
            assert switch.renew_if_due(time.monotonic() + 10) is False
            assert wait_for(lambda: process_state(child.pid) not in ("T", None), 10)
        finally:
            switch.disarm()
    assert DeadMan.arm(ctx, Path("unused"), "op2", None, None, safety, local=True) is None  # nothing to revert


@pytest.mark.parametrize("local", [True, False])
@pytest.mark.parametrize("duration_s", [3600.0, None])
def test_no_switch_outlives_the_runs_deadline_plus_grace(local: bool, duration_s: float | None) -> None:
    # `duration: 1h` (or none) in a run that ends in 2 s: the switch fires at the run's end + grace, not in an hour
    # (or max_duration after its apply), and a live harness does not push it past that either.
    safety = SafetySpec(max_duration=300.0, heal_grace=1.0)
    op_key = f"hang-{uuid.uuid4().hex[:6]}#1"
    ctx = InjectionContext(LocalTransport())
    with frozen_child() as child, journal_for(child.pid, op_key) as journal:
        ends_at = time.monotonic() + 2.0
        switch = DeadMan.arm(
            ctx, journal.path, op_key, cont(child.pid), duration_s, safety, local=local, ends_at=ends_at
        )
        assert switch is not None and not switch.renewable and switch.window_s == pytest.approx(3.0, abs=0.2)
        try:
            assert renew_switches([_active(switch, child.pid)], time.monotonic() + 2.5, print) == []
            assert switch.window_s == pytest.approx(3.0, abs=0.2)  # not pushed on
            assert wait_for(lambda: process_state(child.pid) not in ("T", None), 3.0 + 5)
            assert time.monotonic() >= ends_at + 1.0 - 0.5, "it fired before the run's end + grace"
        finally:
            switch.disarm()


class Unreachable:
    """A host that stopped answering: every command fails to run."""

    host = "gone"

    def run(self, argv: list[str], *, timeout: float = 30.0, check: bool = False) -> Completed:
        raise TransportError("connection refused")

    def spawn(self, argv: list[str], **kwargs: object) -> subprocess.Popen[bytes]:
        raise TransportError("connection refused")

    def put(self, data: bytes, path: str) -> None:
        raise TransportError("connection refused")

    def clock_offset(self) -> float:
        return 0.0


def test_a_failed_renewal_is_reported_not_raised_and_not_retried_at_once() -> None:
    ctx = InjectionContext(Unreachable())
    switch = DeadMan(ctx, Path("unused"), "op1", ["true"], window_s=4.0, renewable=True, generation=0, fires_at=0.0)
    active = [_active(switch, 1)]
    lines: list[str] = []
    problems = renew_switches(active, time.monotonic(), lines.append)
    assert len(problems) == 1 and "not renewed" in problems[0] and "connection refused" in problems[0]
    assert lines == problems and switch.generation == 0  # the old generation is still the armed one
    assert renew_switches(active, time.monotonic(), lines.append) == []  # no retry storm
