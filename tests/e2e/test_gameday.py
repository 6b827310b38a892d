"""`mlchaos gameday`: the blast radius against a real process, and the real CLI in a pty (pexpect): a declined
plan runs nothing; inject, note, heal all and abort from the keyboard land in the history and on the real process;
Ctrl-C heals and exits 3. The pure parts (command parsing, the line editor, the live state, the history tail) are
in tests/unit/test_gameday_engine.py."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pexpect
import pytest
from support import ROOT, pids_running, wait_for

from chaos.cluster.hosts import LOCAL, HostSet
from chaos.cluster.local import process_state
from chaos.gameday.engine import (
    blast_radius,
)
from chaos.plan.build import make_plan
from chaos.run.result import EXIT_HARNESS
from chaos.safety.journal import all_journals
from chaos.spec.scenario import parse_scenario

TIMEOUT = 90  # generous: a busy 2-core machine starts python, the run and the target slowly

SCENARIO = """\
name: {name}
description: a sleeper frozen only when the operator says so
seed: 5
allow_no_checks: true  # the operator judges this one
target:
  type: command
  command: [sleep, "{arg}"]
faults:
  - name: freeze-sleeper
    type: freeze
    params: {{name: '^sleep {pattern}$'}}
    trigger: {{after: 10m}}   # never on its own: only the operator's `i` fires it
    duration: 60s
safety: {{no_progress_timeout: null, max_duration: 3m}}
"""


# -- offline: the blast radius (a real process stands inside it) ------------------------------------------------


def test_blast_radius_names_hosts_processes_and_warns_about_existing_matches() -> None:
    arg = f"600.{secrets.randbelow(10**6):06d}"
    scenario = parse_scenario(SCENARIO.format(name="radius", arg=arg, pattern=arg.replace(".", r"\.")))
    # The same fault against an endpoint someone else runs: there, name: matches across the machine.
    endpoint = parse_scenario(
        SCENARIO.format(name="radius", arg=arg, pattern=arg.replace(".", r"\.")).replace(
            f'type: command\n  command: [sleep, "{arg}"]', "type: http\n  url: http://127.0.0.1:9"
        )
    )
    hosts = HostSet.for_scenario(scenario, None, None)
    [reach] = blast_radius(scenario, make_plan(scenario), hosts)
    assert reach.hosts == [LOCAL] and reach.ops == ["freeze-sleeper#1"] and reach.duration_s == 60
    assert reach.touches.startswith("the target's own processes matching /^sleep 600"), reach.touches
    assert reach.warnings == []
    [reach] = blast_radius(endpoint, make_plan(endpoint), hosts)
    assert reach.touches.startswith("processes matching /^sleep 600") and reach.warnings == []
    stranger = subprocess.Popen(["sleep", arg])  # already running before the game day
    try:
        deadline = time.monotonic() + 10  # until the child has exec'd sleep (a busy machine forks slowly)
        while (
            not Path(f"/proc/{stranger.pid}/cmdline").read_bytes().startswith(b"sleep") and time.monotonic() < deadline
        ):
            time.sleep(0.01)
        [reach] = blast_radius(scenario, make_plan(scenario), hosts)
        assert reach.warnings == []  # outside the command's own tree: a scoped selector never touches it
        [reach] = blast_radius(endpoint, make_plan(endpoint), hosts)  # inside an unscoped selector's radius
        assert len(reach.warnings) == 1 and f"{stranger.pid} (sleep {arg})" in reach.warnings[0]
    finally:
        stranger.kill()
        stranger.wait()


# -- the real CLI in a pty ----------------------------------------------------------------------------------------


CLI = ["-m", "chaos.cli.commands", "gameday"]


class Day:
    """One `mlchaos gameday` in a pty, with the sleeper it targets and its report and state folders."""

    def __init__(self, tmp_path: Path, *args: str) -> None:
        self.arg = f"600.{secrets.randbelow(10**6):06d}"  # unique: the freeze's regex matches only this sleeper
        self.file = tmp_path / "day.yaml"
        self.file.write_text(SCENARIO.format(name="day", arg=self.arg, pattern=self.arg.replace(".", r"\.")))
        self.reports, self.state = tmp_path / "reports", tmp_path / "state"
        env = {**os.environ, "MLCHAOS_STATE_DIR": str(self.state), "USER": "alice", "COLUMNS": "100"}
        self.child = pexpect.spawn(
            sys.executable,
            [*CLI, str(self.file), "--report-dir", str(self.reports), *args],
            cwd=str(ROOT),
            env=env,
            encoding="utf-8",
            codec_errors="replace",
            timeout=TIMEOUT,
            dimensions=(30, 100),
        )
        self.transcript = tmp_path / "transcript.txt"
        self.child.logfile_read = open(self.transcript, "w")  # noqa: SIM115 (closed in close())

    def sleeper(self) -> int:
        assert wait_for(lambda: len(pids_running(["sleep", self.arg])) == 1, TIMEOUT), "the target never started"
        return pids_running(["sleep", self.arg])[0]

    def finish(self) -> int:
        self.child.expect(pexpect.EOF, timeout=TIMEOUT)
        self.child.close()
        return int(self.child.exitstatus if self.child.exitstatus is not None else -1)

    def events(self) -> list[dict[str, Any]]:
        [history] = self.reports.glob("day-*/history.jsonl")
        return [json.loads(line) for line in history.read_text().splitlines()]

    def close(self) -> None:
        if self.child.isalive():
            self.child.terminate(force=True)
        if self.child.logfile_read is not None:
            self.child.logfile_read.close()
        for pid in pids_running(["sleep", self.arg]):  # a failed test must not leave a stopped sleeper behind
            os.kill(pid, 18)  # SIGCONT
            os.kill(pid, 9)


@pytest.fixture
def day_factory(tmp_path: Path) -> Iterator[Callable[..., Day]]:
    days: list[Day] = []

    def make(*args: str) -> Day:
        days.append(Day(tmp_path, *args))
        return days[-1]

    yield make
    for day in days:
        day.close()


def _notes(events: list[dict[str, Any]]) -> list[str]:
    return [str(e["data"]["text"]) for e in events if e["kind"] == "runner.note"]


def _journal_clean(state: Path) -> bool:
    return all_journals(state) == [] and len(list((state / "journal" / "done").glob("day-*.jsonl"))) == 1


@pytest.mark.slow
def test_a_declined_plan_runs_nothing(day_factory: Callable[..., Day]) -> None:
    day = day_factory()
    day.child.expect("blast radius")
    day.child.expect("processes matching")
    day.child.expect(r"Start the game day\? \[y/N\]")
    day.child.sendline("no thanks")
    day.child.expect("nothing was run")
    assert day.finish() == 0
    assert not day.reports.exists() and pids_running(["sleep", day.arg]) == []


@pytest.mark.slow
def test_inject_note_heal_and_abort_from_the_keyboard(day_factory: Callable[..., Day]) -> None:
    day = day_factory("--author", "alice")
    day.child.expect(r"Start the game day\? \[y/N\]")
    day.child.sendline("y")
    pid = day.sleeper()
    day.child.sendline("i")
    assert wait_for(lambda: process_state(pid) == "T", TIMEOUT), "inject did not freeze the target"
    day.child.sendline("n checking the dashboards")
    day.child.sendline("h")
    assert wait_for(lambda: process_state(pid) in ("S", "R"), TIMEOUT), "heal all did not thaw the target"
    day.child.sendline("what is this")
    day.child.sendline("a")
    assert day.finish() == 0
    events = day.events()
    operator = [e["data"] for e in events if e["kind"] == "runner.operator"]
    assert [o["command"] for o in operator] == ["inject_next", "heal_all", "abort"]
    assert all(o["author"] == "alice" for o in operator)
    notes = _notes(events)
    assert "checking the dashboards" in notes and "typed: what is this" in notes
    assert any(n.startswith("game day started by alice") for n in notes)
    kinds = [e["kind"] for e in events]
    assert kinds.index("fault.applied") < kinds.index("fault.healed") < kinds.index("runner.end")
    assert process_state(pid) != "T" and _journal_clean(day.state)
    assert "the scenario has no checks" in day.transcript.read_text()


@pytest.mark.slow
def test_ctrl_c_while_a_fault_is_active_heals_and_exits_3(day_factory: Callable[..., Day]) -> None:
    day = day_factory("--yes")
    pid = day.sleeper()
    day.child.sendline("i")
    assert wait_for(lambda: process_state(pid) == "T", TIMEOUT), "inject did not freeze the target"
    day.child.sendintr()
    day.child.expect(r"interrupted: healed 1 fault\(s\)")
    assert day.finish() == EXIT_HARNESS
    assert process_state(pid) != "T"  # healed, then the target was stopped (gone) at the run's end
    events = day.events()
    kinds = [e["kind"] for e in events]
    assert kinds.index("fault.applied") < kinds.index("fault.healed") < kinds.index("target.exit")
    assert "runner.interrupted" in kinds and "runner.end" not in kinds  # interrupted, not a normal end
    assert any(n.startswith("typed: Ctrl-C") for n in _notes(events))
    assert _journal_clean(day.state)
    document = json.loads(next(day.reports.glob("day-*/run.json")).read_text())
    assert document["ended_by"] == "interrupted" and document["verdict"] == "error"


@pytest.mark.slow
def test_without_a_terminal_the_view_is_plain_lines(tmp_path: Path) -> None:
    arg = f"600.{secrets.randbelow(10**6):06d}"
    file = tmp_path / "day.yaml"
    file.write_text(SCENARIO.format(name="day", arg=arg, pattern=arg.replace(".", r"\.")))
    harness = subprocess.Popen(
        [sys.executable, *CLI, str(file), "--report-dir", str(tmp_path / "reports"), "--yes"],
        cwd=ROOT,
        env={**os.environ, "MLCHAOS_STATE_DIR": str(tmp_path / "state")},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert harness.stdin is not None
    try:
        assert wait_for(lambda: len(pids_running(["sleep", arg])) == 1, TIMEOUT), "the target never started"
        [pid] = pids_running(["sleep", arg])
        harness.stdin.write("i\n")
        harness.stdin.flush()
        assert wait_for(lambda: process_state(pid) == "T", TIMEOUT), "inject did not freeze the target"
        harness.stdin.write("a\n")
        harness.stdin.flush()
        output, _ = harness.communicate(timeout=TIMEOUT)
    finally:
        if harness.poll() is None:
            harness.kill()
        for stray in pids_running(["sleep", arg]):
            os.kill(stray, 18)
            os.kill(stray, 9)
    assert harness.returncode == 0, output
    assert "\x1b[" not in output  # no cursor movement: plain lines for logs
    assert "> i  (injecting the next planned fault now)" in output and "fault applied:" in output
    assert "fault healed: freeze-sleeper#1" in output
