"""Pure logic of rank discovery (chaos.targets.rank_discovery): the scan's output parsing, which processes of a
launcher's tree are workers, and the events a watch derives from successive scans (new workers, restarts with
the launcher's logged cause). The real /proc scans, local and through a transport, are in
tests/integration/test_torchrun_discovery.py."""

from __future__ import annotations

import json

import pytest

from chaos.history.timeline import Event
from chaos.targets.rank_discovery import (
    SCAN_SNIPPET,
    ProcInfo,
    ScanError,
    TreeWatch,
    Worker,
    exit_text,
    parse_scan,
    workers_in,
)

LAUNCHER = 100


def env(rank: int, local: int, restart: int = 0, group: int = 0, world: int = 2) -> dict[str, str]:
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(local),
        "GROUP_RANK": str(group),
        "WORLD_SIZE": str(world),
        "TORCHELASTIC_RESTART_COUNT": str(restart),
        "TORCHELASTIC_RUN_ID": "run-7",
    }


def generation(restart: int, base_pid: int) -> list[ProcInfo]:
    """A launcher with two workers and a dataloader child of rank 1 (it inherits rank 1's environment)."""
    return [
        ProcInfo(LAUNCHER, 1, 50, {}),
        ProcInfo(base_pid, LAUNCHER, 60 + restart, env(0, 0, restart)),
        ProcInfo(base_pid + 1, LAUNCHER, 61 + restart, env(1, 1, restart)),
        ProcInfo(base_pid + 2, base_pid + 1, 62 + restart, env(1, 1, restart)),
    ]


def test_parse_scan_reads_the_snippet_rows() -> None:
    text = json.dumps([[100, 1, 50, {}], [101, 100, 60, {"RANK": "1", "LOCAL_RANK": "1"}]])
    assert parse_scan(text) == [ProcInfo(100, 1, 50, {}), ProcInfo(101, 100, 60, {"RANK": "1", "LOCAL_RANK": "1"})]
    assert parse_scan("[]\n") == []


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("Traceback (most recent call last):", "no JSON"),
        ('{"pid": 1}', "not a list"),
        ("[[1, 2, 3]]", "malformed row"),
        ('[[1, 2, "3", {}]]', "malformed row"),
        ("[[1, 2, true, {}]]", "malformed row"),
        ('[[1, 2, 3, {"RANK": 1}]]', "malformed row"),
    ],
)
def test_parse_scan_refuses_anything_else(text: str, why: str) -> None:
    with pytest.raises(ScanError, match=why):
        parse_scan(text)


def test_the_remote_snippet_is_the_scan_function_and_prints_json() -> None:
    assert "def scan_proc(" in SCAN_SNIPPET and "json.dumps(scan_proc(" in SCAN_SNIPPET
    compile(SCAN_SNIPPET, "<snippet>", "exec")  # a syntax error here would only show on a remote host


def test_workers_are_the_topmost_processes_of_each_rank_below_the_launcher() -> None:
    procs = [*generation(0, 200), ProcInfo(300, LAUNCHER, 70, {"PATH": "/bin"})]  # a helper without a rank
    workers = workers_in(procs, LAUNCHER, "h1")
    assert [(w.rank, w.local_rank, w.pid) for w in workers] == [(0, 0, 200), (1, 1, 201)]  # not 202, not 100
    assert workers[1] == Worker("h1", 201, 61, 1, 1, group_rank=0, world_size=2, restart=0, run_id="run-7")
    # A launcher whose own environment has a rank (a nested launch) is still not a worker.
    nested = [ProcInfo(LAUNCHER, 1, 50, env(5, 0)), *generation(0, 200)[1:]]
    assert [w.pid for w in workers_in(nested, LAUNCHER, "h1")] == [200, 201]


def test_unparsable_rank_variables_are_no_worker() -> None:
    procs = [ProcInfo(LAUNCHER, 1, 50, {}), ProcInfo(201, LAUNCHER, 61, {"RANK": "x", "LOCAL_RANK": "1"})]
    assert workers_in(procs, LAUNCHER, "h1") == []


def failed_line(local_rank: int, pid: int, exitcode: int) -> Event:
    """The launcher's ``failed (exitcode: ...)`` line as TORCHRUN_MATCHERS turn it into an event."""
    return Event(
        ts_ns=5, kind="detect.worker_exit", source="torchrun", rank=local_rank, data={"exitcode": exitcode, "pid": pid}
    )


def test_a_watch_reports_new_workers_then_a_restart_with_the_logged_cause() -> None:
    watch = TreeWatch("local", lambda root: [], restart_is_attempt=True)
    events, new = watch.update(workers_in(generation(0, 200), LAUNCHER, "local"), 10)
    assert [(e.kind, e.rank, e.data["restart"], e.data["pid"]) for e in events] == [
        ("target.worker", 0, 0, 200),
        ("target.worker", 1, 0, 201),
    ]
    assert events[0].source == "process_tree" and events[0].data["host"] == "local"
    assert [w.pid for w in new] == [200, 201]
    # The same scan again adds nothing.
    assert watch.update(workers_in(generation(0, 200), LAUNCHER, "local"), 11) == ([], [])

    watch.note(failed_line(1, 201, -9))
    watch.note(
        Event(
            ts_ns=6,
            kind="target.agent_restart",
            source="torchrun",
            data={"state": "FAILED", "attempts_left": 1, "max_restarts": 1},
        )
    )
    events, new = watch.update(workers_in(generation(1, 400), LAUNCHER, "local"), 20)
    assert [e.kind for e in events] == ["target.restart", "target.worker", "target.worker"]
    restart = events[0]
    assert restart.data["restart"] == 1 and restart.data["attempt"] == 1 and restart.rank is None
    assert restart.data["exitcode"] == -9 and restart.data["failed_rank"] == 1 and restart.data["failed_pid"] == 201
    assert restart.data["cause"] == "rank 1 (local_rank 1, pid 201) died of SIGKILL (exitcode -9)"
    assert restart.data["group_state"] == "FAILED"
    assert [(e.rank, e.data["restart"]) for e in events[1:]] == [(0, 1), (1, 1)]
    assert watch.restart == 1


def test_a_restart_without_a_logged_failure_says_so_and_skipped_rounds_each_count() -> None:
    watch = TreeWatch("h2", lambda root: [], restart_is_attempt=False)
    watch.update(workers_in(generation(0, 200), LAUNCHER, "h2"), 10)
    events, _ = watch.update(workers_in(generation(2, 400), LAUNCHER, "h2"), 20)  # round 1 came and went unseen
    restarts = [e for e in events if e.kind == "target.restart"]
    assert [e.data["restart"] for e in restarts] == [1, 2]
    assert all("attempt" not in e.data for e in restarts)  # a node's count is not the job's attempt
    assert all("no worker failure was logged" in str(e.data["cause"]) for e in restarts)


def test_a_failure_of_a_worker_never_seen_is_named_by_its_local_rank() -> None:
    watch = TreeWatch("h2", lambda root: [], restart_is_attempt=False)
    # A multi-node job moves the launcher's local rank to data.local_rank (the event's rank is global).
    watch.note(
        Event(
            ts_ns=5,
            kind="detect.worker_exit",
            source="torchrun",
            data={"local_rank": 0, "pid": 999, "exitcode": 1, "host": "h2"},
        )
    )
    events, _ = watch.update(workers_in(generation(1, 400), LAUNCHER, "h2"), 20)
    assert events[0].data["cause"] == "local_rank 0 (pid 999) exited with code 1"
    assert "failed_rank" not in events[0].data and events[0].data["failed_local_rank"] == 0


def test_a_scan_failure_is_reported_once() -> None:
    def broken(root: int) -> list[ProcInfo]:
        raise ScanError("python3: not found")

    watch = TreeWatch("h3", broken, restart_is_attempt=False)
    watch.root = LAUNCHER
    events, _ = watch.refresh()
    assert [(e.kind, e.data["host"]) for e in events] == [("runner.discovery_failed", "h3")]
    assert "python3: not found" in str(events[0].data["reason"])
    assert watch.refresh() == ([], [])


def test_exit_text() -> None:
    assert exit_text(-9) == "died of SIGKILL (exitcode -9)"
    assert exit_text(1) == "exited with code 1"
    assert exit_text(-200) == "died of signal 200 (exitcode -200)"
