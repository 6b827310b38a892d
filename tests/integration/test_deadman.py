"""The dead-man switch against real stopped processes: it reverts when nobody heals, and only then."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from support import cont, frozen_child, wait_for

from chaos.cluster.local import process_state
from chaos.plugins.injector import Applied
from chaos.safety import deadman
from chaos.safety.journal import Journal

pytestmark = pytest.mark.usefixtures("isolated_state_dir")  # each test journals into a state dir of its own


@contextmanager
def journal_for(pid: int, op_id: str = "op1") -> Iterator[Journal]:
    with Journal.for_run("run1") as journal:
        journal.intent(Applied(op_id=op_id, fault="hang", injector="freeze", state={"pids": [pid]}))
        yield journal


def test_unhealed_fault_is_reverted_by_the_deadman() -> None:
    with frozen_child() as child, journal_for(child.pid) as journal:
        dm = deadman.arm(journal.path, "op1", cont(child.pid), 2.0)
        try:
            assert deadman.is_deadman(dm, "op1")
            assert journal.deadman_pid("op1") == dm
            assert wait_for(lambda: process_state(child.pid) not in (None, "T"), 2.0 + 15)
            assert wait_for(lambda: journal.healed_by("op1") == "deadman", 10)
            assert wait_for(lambda: not deadman.is_deadman(dm), 10)
            assert journal.unhealed() == []
        finally:
            deadman.disarm(dm)


def test_disarmed_deadman_never_reverts() -> None:
    with frozen_child() as child, journal_for(child.pid) as journal:
        dm = deadman.arm(journal.path, "op1", cont(child.pid), 2.0)
        try:
            assert deadman.disarm(dm, "op1") is True
            assert not deadman.is_deadman(dm)
            time.sleep(4.0)  # well past the deadline it would have fired at
            assert process_state(child.pid) == "T"
            assert journal.healed_by("op1") is None
        finally:
            deadman.disarm(dm)
            os.kill(child.pid, signal.SIGCONT)


def test_disarm_refuses_what_is_not_that_deadman() -> None:
    with frozen_child() as child, journal_for(child.pid) as journal:
        dm = deadman.arm(journal.path, "op1", cont(child.pid), 60.0)
        try:
            assert deadman.disarm(child.pid) is False  # a live process, but not a dead-man
            assert process_state(child.pid) == "T"
            assert deadman.disarm(dm, "another-op") is False  # a dead-man, but for another op
            assert deadman.is_deadman(dm, "op1")
            assert deadman.disarm(2**22 + 12345) is False  # no such pid at all
        finally:
            assert deadman.disarm(dm, "op1") is True


def test_deadman_retires_once_the_journal_says_healed() -> None:
    with frozen_child() as child, journal_for(child.pid) as journal:
        dm = deadman.arm(journal.path, "op1", cont(child.pid), 60.0)
        try:
            journal.healed("op1", "harness")  # the harness healed but died before disarming
            assert wait_for(lambda: not deadman.is_deadman(dm), deadman.POLL_S + 10)
            assert process_state(child.pid) == "T"  # it did not revert on its way out
        finally:
            deadman.disarm(dm)


def test_failed_revert_is_journaled_and_keeps_the_op_unhealed() -> None:
    with frozen_child() as child, journal_for(child.pid) as journal:
        dm = deadman.arm(journal.path, "op1", ["false"], 0.5)
        try:
            assert wait_for(lambda: any(r.kind == "failed" for r in journal.records()), 15)
            assert [a.op_id for a in journal.unhealed()] == ["op1"]
        finally:
            deadman.disarm(dm)


def test_arm_rejects_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="non-empty"):
        deadman.arm(tmp_path / "j.jsonl", "op", [], 1.0)
    with pytest.raises(ValueError, match="negative"):
        deadman.arm(tmp_path / "j.jsonl", "op", ["true"], -1.0)
