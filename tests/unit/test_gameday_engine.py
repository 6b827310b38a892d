"""`mlchaos gameday`'s pure parts, offline: command parsing, the line editor, the live state folded from events,
and the history tail. The blast radius and the real CLI in a pty are in tests/e2e/test_gameday.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from chaos.cluster.hosts import LOCAL
from chaos.gameday.engine import (
    GameState,
    LineEditor,
    find_run_dir,
    parse_command,
)
from chaos.history.timeline import Event, EventFileTail, History


def test_commands_parse_and_unknown_lines_are_not_commands() -> None:
    assert parse_command("i").command == "inject_next"
    assert parse_command(" heal ").command == "heal_all"
    note = parse_command("n the loss spiked")
    assert (note.command, note.text) == ("note", "the loss spiked")
    assert parse_command("a enough").text == "enough" and parse_command("abort").command == "abort"
    assert parse_command("?").help and parse_command("?").command is None
    for line in ("n", "inject now please", "xyz", ""):
        assert parse_command(line).command is None


def test_line_editor_handles_backspace_word_erase_and_arrow_keys() -> None:
    editor = LineEditor()
    assert editor.feed("n helo\x7flo") == [] and editor.buffer == "n hello"
    assert editor.feed("\x1b[A\x1bOB wor\x17world\r") == ["n hello world"]
    assert editor.feed("x\x15i\n") == ["i"] and editor.buffer == ""


def _event(kind: str, t: float, rank: int | None = None, **data: object) -> Event:
    return Event.model_validate({"ts_ns": int(t * 1e9), "kind": kind, "rank": rank, "data": data})


def test_game_state_folds_ranks_faults_steps_and_request_rate() -> None:
    state = GameState(recent=3, window_s=5)
    for event in [
        _event("runner.start", 100, pid=1),
        _event("target.start", 100.5, rank=0, pid=11, attempt=0),
        _event("target.start", 100.5, rank=1, pid=12, attempt=0, host="n2"),
        _event("target.step", 101, rank=0, step=7),
        _event("fault.applied", 102, op="f#1", fault="f", host="local", duration_s=20.0, description="SIGSTOP rank 1"),
        _event("fault.applied", 102, op="g#1", fault="g", host="n2", description="cut"),
        _event("fault.healed", 103, op="g#1", fault="g", host="n2"),
        _event("serving.replica_start", 103, replica="primary", pid=21, port=8001),
        *[_event("load.request", 104 + i / 10, status=200 if i % 4 else 503) for i in range(20)],
    ]:
        state.observe(event)
    assert state.step == 7 and state.fired == 2 and state.healed == 1
    assert [v.op for v in state.applied.values()] == ["f#1"]
    assert state.ranks[1].pid == 12 and state.ranks[1].host == "n2" and state.hosts == {LOCAL, "n2"}
    assert state.replicas["primary"].pid == 21
    assert [e.kind for e in state.recent] == ["fault.applied", "fault.healed", "serving.replica_start"]
    rate = state.request_rate(int(106 * 1e9))
    assert rate is not None and rate[0] == pytest.approx(4.0) and rate[1] == pytest.approx(0.25)
    assert state.request_rate(int(200 * 1e9)) is None


def test_history_tail_waits_for_whole_lines_and_finds_its_run_folder(tmp_path: Path) -> None:
    run_dir = tmp_path / "demo-20250101-000000-abcd"
    run_dir.mkdir()
    (tmp_path / "demo-old").mkdir()
    history = History(run_dir / "history.jsonl")
    history.record("runner.start", scenario="demo", seed=1, pid=os.getpid())
    tail = EventFileTail(run_dir / "history.jsonl")
    assert [e.kind for e in tail.poll()] == ["runner.start"]
    line = _event("runner.note", 1, text="hi").model_dump_json() + "\n"
    with open(run_dir / "history.jsonl", "a") as handle:
        handle.write(line[:10])
        handle.flush()
        assert tail.poll() == []
        handle.write(line[10:])
    assert [e.kind for e in tail.poll()] == ["runner.note"]
    history.close()
    assert find_run_dir(tmp_path, "demo", {tmp_path / "demo-old"}, os.getpid()) == run_dir
    assert find_run_dir(tmp_path, "demo", {run_dir}, os.getpid()) is None
    assert find_run_dir(tmp_path, "demo", set(), os.getpid() + 1) is None
