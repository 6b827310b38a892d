"""The one /proc/<pid>/stat reader: a real process's fields, a command name with spaces and parentheses, and
texts that are not a stat line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from chaos.kernel.procfs import lineage, parse_stat, read_stat


def test_a_real_process_stat_and_a_stopped_one() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        stat = read_stat(child.pid)
        assert stat is not None and stat.ppid == os.getpid() and stat.start_time > 0 and not stat.stopped
        os.kill(child.pid, signal.SIGSTOP)
        for _ in range(500):
            if (now := read_stat(child.pid)) is not None and now.stopped:
                break
            time.sleep(0.01)
        assert now is not None and now.stopped and now.start_time == stat.start_time
    finally:
        child.kill()
        child.wait()
    assert read_stat(child.pid) is None


def test_a_command_name_with_spaces_and_parentheses() -> None:
    fields = " ".join(["S", "42", *["0"] * 17, "12345", "0", "0"])
    stat = parse_stat(f"7 (a) b (c)) {fields}\n")
    assert stat is not None
    assert (stat.comm, stat.state, stat.ppid, stat.start_time) == ("a) b (c)", "S", 42, 12345)


def test_texts_that_are_not_a_stat_line() -> None:
    assert parse_stat("") is None
    assert parse_stat("7 (short) S 1 2") is None
    assert parse_stat("no parentheses at all") is None


# Sources that run where mlchaos cannot be imported, so they carry their own parse: the thaw script a rank
# starts with ``python -c`` and the scan a remote host runs through its own python.
SELF_CONTAINED = {"chaos/injob/phase_faults.py": "THAW", "chaos/targets/rank_discovery.py": "SCAN_SNIPPET"}


def test_one_reader_of_proc_stat() -> None:
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    parsers = sorted(
        str(path.relative_to(root))
        for top in ("chaos", "injectors")
        for path in (root / top).rglob("*.py")
        if 'rindex(")")' in path.read_text() or 'rsplit(")", 1)' in path.read_text()
    )
    assert parsers == sorted(SELF_CONTAINED), "parse /proc/<pid>/stat with chaos.kernel.procfs"


def test_lineage_is_this_process_and_its_ancestors_short_of_init() -> None:
    mine = lineage(os.getpid())
    assert {os.getpid(), os.getppid()} <= mine and 1 not in mine
    assert lineage(2**22 + 1) == {2**22 + 1}  # a pid that is not there: itself, nothing above it
