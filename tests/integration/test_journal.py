"""The journal: durable records, the unhealed view after a crash, and cleanup of leftovers from other runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from pathlib import Path

import pytest
from support import sleeper, wait_for

from chaos.cluster.local import LocalTransport, process_state
from chaos.plugins.injector import Applied, FaultOp, InjectionContext
from chaos.safety import deadman, remote_deadman
from chaos.safety.cleanup import heal_leftovers
from chaos.safety.journal import Journal, all_journals, journal_dir
from chaos.safety.state import state_dir
from injectors.process.faults import FreezeInjector, FreezeParams

pytestmark = pytest.mark.usefixtures("isolated_state_dir")  # each test journals into a state dir of its own


def applied(op_id: str, *, reversible: bool = True) -> Applied:
    return Applied(op_id=op_id, fault="f", injector="freeze", reversible=reversible, state={"pids": [12345]})


def test_state_dir_follows_env(tmp_path: Path) -> None:
    assert state_dir() == tmp_path
    assert Journal.for_run("r1").path == tmp_path / "journal" / "r1.jsonl"


def test_run_id_must_be_a_safe_file_name() -> None:
    with pytest.raises(ValueError, match="safe file name"):
        Journal.for_run("../escape")


def test_lifecycle_intent_applied_healed() -> None:
    with Journal.for_run("life") as journal:
        journal.intent(applied("op1"))
        assert [a.op_id for a in journal.unhealed()] == ["op1"]
        journal.applied("op1", {"pids": [1], "helper_pid": 77})
        assert journal.unhealed()[0].state["helper_pid"] == 77  # the state learned while applying wins
        journal.deadman("op1", 4242, 123)
        assert journal.deadman_pid("op1") == 4242
        assert journal.healed_by("op1") is None
        journal.healed("op1", "harness")
        assert journal.unhealed() == []
        assert journal.healed_by("op1") == "harness"
        assert [r.kind for r in journal.records()] == ["intent", "applied", "deadman", "healed"]


def test_unhealed_after_crash_is_newest_first_and_skips_irreversible(tmp_path: Path) -> None:
    journal = Journal.for_run("crashed")
    journal.intent(applied("a"))
    journal.applied("a")
    journal.intent(applied("kill", reversible=False))
    journal.intent(applied("b"))
    journal.failed("b", "boom")  # a failed apply may have half-changed the world: still needs a heal
    journal.intent(applied("c"))
    journal.healed("c", "harness")
    journal.close()  # the harness "dies" here: no more records

    reopened = Journal(tmp_path / "journal" / "crashed.jsonl", owner=False)
    assert [a.op_id for a in reopened.unhealed()] == ["b", "a"]


def test_records_are_whole_lines_on_disk_and_survive_reopening(tmp_path: Path) -> None:
    with Journal.for_run("durable") as journal:
        for index in range(20):
            journal.intent(applied(f"op{index}"))
    lines = (tmp_path / "journal" / "durable.jsonl").read_text().splitlines()
    assert len(lines) == 20
    assert [json.loads(line)["op_id"] for line in lines] == [f"op{i}" for i in range(20)]
    assert len(Journal(tmp_path / "journal" / "durable.jsonl", owner=False).unhealed()) == 20


def test_torn_tail_is_reported_and_later_records_stay_readable(tmp_path: Path) -> None:
    path = tmp_path / "journal" / "torn.jsonl"
    with Journal(path) as journal:
        journal.intent(applied("a"))
        with open(path, "ab") as handle:
            handle.write(b'{"kind":"intent","op_id":"half')  # what a power cut mid-write could leave
        journal.intent(applied("b"))
        assert [a.op_id for a in journal.unhealed()] == ["b", "a"]
        assert len(journal.unreadable) == 1


def _frozen_leftover(pid: int, run_id: str) -> tuple[Path, Applied]:
    """What a harness that died mid-fault leaves behind: a frozen process and its journal."""
    ctx = InjectionContext(LocalTransport())
    op = FaultOp(op_id=f"{run_id}-op", fault="hang", injector="freeze", params=FreezeParams(pid=pid), duration_s=60)
    injector = FreezeInjector()
    record = injector.prepare(ctx, op)
    journal = Journal.for_run(run_id)
    journal.intent(record)
    injector.apply(ctx, record)
    journal.applied(record.op_id)
    journal.close()  # the owner is gone: the kernel would drop its lock the same way
    return journal.path, record


def test_heal_leftovers_heals_a_really_frozen_process_from_another_run(tmp_path: Path) -> None:
    with sleeper() as child:
        path, record = _frozen_leftover(child.pid, "other-run")
        dm = deadman.arm(path, record.op_id, ["kill", "-s", "CONT", str(child.pid)], 120)
        try:
            assert wait_for(lambda: process_state(child.pid) == "T", 5)
            seen: list[str] = []
            lines = heal_leftovers(LocalTransport(), state_dir=tmp_path, log=seen.append)
            assert lines == seen
            assert any("other-run-op" in line and "healed" in line for line in lines), lines
            assert any("dead-man" in line and "disarmed" in line for line in lines), lines
            assert process_state(child.pid) not in (None, "T")
            assert not deadman.is_deadman(dm)
            done = journal_dir(tmp_path) / "done" / "other-run.jsonl"
            assert done.exists() and not path.exists()
            assert Journal(done, owner=False).healed_by(record.op_id) == "cleanup"
            assert all_journals(tmp_path) == []
            assert heal_leftovers(LocalTransport(), state_dir=tmp_path) == []
        finally:
            deadman.disarm(dm)


def test_heal_leftovers_leaves_a_live_run_alone(tmp_path: Path) -> None:
    with sleeper() as child, Journal.for_run("live") as journal:
        ctx = InjectionContext(LocalTransport())
        op = FaultOp(op_id="op", fault="f", injector="freeze", params=FreezeParams(pid=child.pid), duration_s=60)
        record = FreezeInjector().prepare(ctx, op)
        journal.intent(record)
        FreezeInjector().apply(ctx, record)
        try:
            assert wait_for(lambda: process_state(child.pid) == "T", 5)  # SIGSTOP lands asynchronously
            lines = heal_leftovers(LocalTransport(), state_dir=tmp_path)
            assert lines == ["run live: still running, its faults are left to it"]
            assert process_state(child.pid) == "T"
            assert journal.unhealed()
            forced = heal_leftovers(LocalTransport(), state_dir=tmp_path, only_dead_owners=False)
            assert forced[0] == "run live: still running, healing its faults anyway"
            assert "healed" in forced[1]
            assert wait_for(lambda: process_state(child.pid) not in (None, "T"), 5)
            assert journal.healed_by("op") == "cleanup"
            assert journal.path.exists()  # its owner may still write: not moved to done/
        finally:
            FreezeInjector().heal(ctx, record)


def test_failed_heal_is_reported_and_kept(tmp_path: Path) -> None:
    with Journal.for_run("broken") as journal:
        journal.intent(Applied(op_id="op", fault="f", injector="no-such-injector"))
    lines = heal_leftovers(LocalTransport(), state_dir=tmp_path)
    assert len(lines) == 1 and "FAILED" in lines[0] and "no-such-injector" in lines[0]
    kept = Journal(journal_dir(tmp_path) / "broken.jsonl", owner=False)
    assert [a.op_id for a in kept.unhealed()] == ["op"]
    assert [r.kind for r in kept.records()] == ["intent", "failed"]
    assert "FAILED" in heal_leftovers(LocalTransport(), state_dir=tmp_path)[0]  # still there next time


def _frozen_on_host(pid: int, run_id: str) -> tuple[Path, Applied]:
    """:func:`_frozen_leftover` as if on host ``h1``, whose transport (here: this machine's) ran its switch."""
    ctx = InjectionContext(LocalTransport())
    op = FaultOp(op_id=f"{run_id}-op", fault="hang", injector="freeze", params=FreezeParams(pid=pid), duration_s=60)
    injector = FreezeInjector()
    record = injector.prepare(ctx, op).model_copy(update={"host": "h1"})
    journal = Journal.for_run(run_id)
    journal.intent(record)
    injector.apply(ctx, record)
    journal.applied(record.op_id)
    journal.close()
    return journal.path, record


def _switches(op_id: str) -> list[str]:
    found = subprocess.run(["pgrep", "-f", remote_deadman.marker(op_id)], capture_output=True, text=True, check=False)
    return found.stdout.split()


def test_a_heal_done_by_the_hosts_own_deadman_is_recorded_as_its_and_not_done_again(tmp_path: Path) -> None:
    hosts = {"h1": LocalTransport()}
    with sleeper() as child:
        path, record = _frozen_on_host(child.pid, "fired-run")
        remote_deadman.start(LocalTransport(), record.op_id, ["kill", "-s", "CONT", str(child.pid)], 0.5)
        assert wait_for(lambda: process_state(child.pid) not in (None, "T"), 10)  # the host's switch fired
        os.kill(child.pid, signal.SIGSTOP)  # a heal now would continue it: cleanup must not heal again
        try:
            lines = heal_leftovers(hosts, state_dir=tmp_path)
            assert lines == [
                f"run fired-run: {record.op_id} ({record.description}): already healed by its dead-man "
                "on h1 (revert exit 0)"
            ], lines
            assert wait_for(lambda: process_state(child.pid) == "T", 5)
            done = Journal(journal_dir(tmp_path) / "done" / "fired-run.jsonl", owner=False)
            assert done.healed_by(record.op_id) == "deadman"
            assert not list(Path("/tmp").glob(f"{remote_deadman.marker(record.op_id)}*.fired"))  # read once, removed
        finally:
            os.kill(child.pid, signal.SIGCONT)


def test_cleanup_stops_the_hosts_deadman_of_what_it_heals(tmp_path: Path) -> None:
    with sleeper() as child:
        path, record = _frozen_on_host(child.pid, "armed-run")
        remote_deadman.start(LocalTransport(), record.op_id, ["kill", "-s", "CONT", str(child.pid)], 120)
        assert wait_for(lambda: len(_switches(record.op_id)) == 1, 5) and process_state(child.pid) == "T"
        try:
            lines = heal_leftovers({"h1": LocalTransport()}, state_dir=tmp_path)
            assert (
                lines[0].endswith(": healed") and lines[1] == f"run armed-run: {record.op_id}: dead-man on h1 stopped"
            )
            assert wait_for(lambda: process_state(child.pid) not in (None, "T"), 5)
            assert wait_for(lambda: _switches(record.op_id) == [], 5)
        finally:
            remote_deadman.disarm(LocalTransport(), remote_deadman.marker(record.op_id))


def test_a_run_starting_beside_another_runs_cleanup_keeps_its_journal(tmp_path: Path) -> None:
    # Two runs started at once on one state dir: each run's start heals dead runs' leftovers. A journal created
    # and only then locked could be taken for a dead run's in between and moved to done/ (the new run then died
    # at start or wrote to a journal nobody held). Owners are created while cleanups run, many times.
    stop = threading.Event()
    errors: list[BaseException] = []

    def cleanups() -> None:
        while not stop.is_set():
            try:
                heal_leftovers(LocalTransport(), state_dir=tmp_path)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

    sweeper = threading.Thread(target=cleanups)
    sweeper.start()
    try:
        for index in range(300):
            journal = Journal.for_run(f"starting-{index}")
            try:
                journal.intent(Applied(op_id=f"op{index}", fault="f", injector="no-such-injector"))  # nothing to heal
                assert journal.path.exists() and journal.path.parent.name == "journal", journal.path
                assert not (journal.path.parent / "done" / journal.path.name).exists(), "a live run's journal moved"
            finally:
                journal.close()
    finally:
        stop.set()
        sweeper.join()
    assert errors == []
