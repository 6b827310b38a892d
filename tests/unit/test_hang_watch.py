"""The flight recorder's file, the hang watch's culprit rules (:func:`chaos.detect.hang_watch.judge`) on inputs that
violate each rule's premise, and one detect.hang per episode."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from chaos.detect.hang_watch import HangWatch, RankView, judge
from chaos.injob.flight_recorder import CollectiveRecord, FlightState, Recorder, flight_path, read_state

S = 1_000_000_000
NOW = 100 * S


def state(
    rank: int,
    *,
    busy: bool = True,
    step: int = 7,
    index: int = 0,
    op: str = "all_reduce",
    nbytes: int = 64,
    group: int = 0,
    since: float = 5.0,
    done_at: float = 10.0,
) -> FlightState:
    """Rank ``rank`` in collective (``busy``) or just past it; the last completion ``done_at`` s before NOW."""
    seq = 40
    record = CollectiveRecord(
        seq, step, index, nbytes, NOW - int(since * S), 0 if busy else NOW - int(done_at * S), op, group
    )
    return FlightState(
        rank=rank,
        world=4,
        pid=1000 + rank,
        start_time=1,
        step=step,
        next_index=index + 1,
        started=seq,
        completed=seq - 1 if busy else seq,
        completed_ns=NOW - int(done_at * S),
        host="h",
        current=record,
        recent=(record,),
    )


def view(st: FlightState, proc: str = "S", cpu: float | None = 0.0) -> RankView:
    return RankView(st, proc, cpu, 1.0)


def test_a_stopped_rank_is_the_culprit_even_inside_the_collective() -> None:
    views = [view(state(r)) for r in range(4)]
    views[1] = view(state(1), proc="T")
    verdict = judge(views, NOW, 2.0)
    assert verdict is not None and verdict.reason == "stopped" and verdict.culprits == (1,)


def test_a_rank_outside_the_collective_burning_cpu_is_spinning() -> None:
    views = [view(state(r)) for r in range(4)]
    views[3] = view(state(3, busy=False), proc="R", cpu=0.95)
    verdict = judge(views, NOW, 2.0)
    assert verdict is not None and (verdict.reason, verdict.culprits) == ("spinning", (3,))


def test_a_rank_outside_the_collective_that_sleeps_is_not_called_spinning() -> None:
    views = [view(state(r)) for r in range(4)]
    views[0] = view(state(0, busy=False), proc="S", cpu=0.0)
    verdict = judge(views, NOW, 2.0)
    assert verdict is not None and (verdict.reason, verdict.culprits) == ("not_in_collective", (0,))


def test_a_running_rank_starved_of_cpu_still_reads_as_spinning() -> None:
    views = [view(state(r)) for r in range(4)]
    views[1] = view(state(1, busy=False), proc="R", cpu=0.1)  # a busy machine: runnable, little CPU
    verdict = judge(views, NOW, 2.0)
    assert verdict is not None and (verdict.reason, verdict.culprits) == ("spinning", (1,))


def test_the_rank_in_a_different_collective_is_named() -> None:
    views = [view(state(r)) for r in range(4)]
    views[2] = view(state(2, index=1, nbytes=4, group=7))
    verdict = judge(views, NOW, 2.0)
    assert verdict is not None and (verdict.reason, verdict.culprits) == ("wrong_collective", (2,))
    assert verdict.signature == (7, 0, "all_reduce", 64, 0)


def test_no_majority_names_nobody() -> None:
    views = [view(state(r, index=r % 2)) for r in range(4)]
    verdict = judge(views, NOW, 2.0)
    assert verdict is not None and verdict.reason == "wrong_collective" and verdict.culprits == ()


def test_everyone_waiting_in_the_same_collective_names_nobody() -> None:
    verdict = judge([view(state(r)) for r in range(4)], NOW, 2.0)
    assert verdict is not None and verdict.reason == "all_waiting" and verdict.culprits == ()


def test_no_hang_before_hang_after() -> None:
    views = [view(state(r, since=1.0, done_at=1.0)) for r in range(4)]
    views[1] = view(state(1, since=1.0, done_at=1.0), proc="T")
    assert judge(views, NOW, 2.0) is None


def test_a_recent_completion_on_any_rank_is_progress() -> None:
    views = [view(state(r)) for r in range(3)] + [view(state(3, busy=False, done_at=0.5), proc="R", cpu=1.0)]
    assert judge(views, NOW, 2.0) is None


def test_nobody_in_a_collective_is_no_hang() -> None:
    assert judge([view(state(r, busy=False), proc="R", cpu=1.0) for r in range(4)], NOW, 2.0) is None


def test_exited_ranks_are_not_culprits() -> None:
    views = [view(state(r)) for r in range(3)] + [view(state(3, busy=False), proc="gone", cpu=None)]
    verdict = judge(views, NOW, 2.0)
    assert verdict is not None and verdict.reason == "all_waiting" and 3 not in verdict.culprits


def test_recorder_file_round_trip_and_skip(tmp_path: Path) -> None:
    rec = Recorder(flight_path(tmp_path, 1), rank=1, world=2)
    rec.begin_step(3)
    seq, skipped = rec.started_one("all_reduce", 128, 0)
    got = read_state(flight_path(tmp_path, 1))
    assert got is not None and got.in_collective and got.current is not None
    assert (got.rank, got.pid, got.step, got.current.op, got.current.nbytes, got.current.index) == (
        1,
        os.getpid(),
        3,
        "all_reduce",
        128,
        0,
    )
    rec.completed_one(seq)
    rec.skip_next(3, 1)
    skipped_seen: list[tuple[int, int, str]] = []
    rec.on_skip = lambda step, index, op: skipped_seen.append((step, index, op))
    assert rec.started_one("broadcast", 8, 0) == (0, True)
    assert skipped_seen == [(3, 1, "broadcast")]
    seq2, skipped = rec.started_one("barrier", 0, 0)
    got = read_state(flight_path(tmp_path, 1))
    assert not skipped and got is not None and got.current is not None
    assert (got.current.seq, got.current.index, got.current.op, got.in_collective) == (seq2, 2, "barrier", True)
    assert seq2 == seq + 1  # the skipped one ran nothing and took no sequence number


@pytest.fixture()
def two_ranks(tmp_path: Path) -> tuple[Path, list[Recorder]]:
    return tmp_path, [Recorder(flight_path(tmp_path, r), rank=r, world=2) for r in range(2)]


def test_one_detection_per_episode_and_rearm_after_progress(two_ranks: tuple[Path, list[Recorder]]) -> None:
    directory, (r0, r1) = two_ranks
    me = f"{os.getpid()} (x) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {r0._start_time} 0 0"  # noqa: SLF001
    watch = HangWatch(directory, hang_after=1.0, listeners=[], proc_stat=lambda pid: me)
    seq0, _ = r0.started_one("all_reduce", 64, 0)
    t0 = r0.completed_ns or 0
    later = max(t0, (read_state(flight_path(directory, 0)) or state(0)).recent[-1].start_ns) + 2 * S
    first = watch.poll(later, force=True)
    assert [e.kind for e in first] == ["detect.hang"] and first[0].rank == 1
    assert first[0].data["reason"] == "not_in_collective" and first[0].data["culprit_ranks"] == [1]
    assert watch.poll(later + S, force=True) == []  # the same episode: nothing new
    r0.completed_one(seq0)  # progress ends the episode
    assert watch.poll(later + S, force=True) == []
    seq1, _ = r1.started_one("all_reduce", 64, 0)
    r0.started_one("all_reduce", 64, 0)
    r1.completed_one(seq1)  # rank 1 got through; rank 0 is stuck in its second collective alone
    again = watch.poll(later + 5 * S, force=True)
    assert [e.data["culprit_ranks"] for e in again] == [[1]]


TORCHRUN = "target: {type: torchrun, script: job.py, nproc_per_node: 4%s}\n"
SPIN = "faults: [{name: s, type: spin, params: {rank: 1}, trigger: {at_step: 5, rank: 1}, duration: 2s}]\n"
CULPRIT = "checks: [{type: culprit_named, params: {fault: s}}]\n"


def _problems(text: str) -> list[str]:
    from chaos.spec.preflight import preflight
    from chaos.spec.scenario import parse_scenario

    return [p.message for p in preflight(parse_scenario("name: x\n" + text))]


def test_preflight_refuses_culprit_named_without_a_hang_watch() -> None:
    assert _problems(TORCHRUN % ", hang_watch: {hang_after: 2s}" + SPIN + CULPRIT) == []
    [problem] = _problems(TORCHRUN % "" + SPIN + CULPRIT)
    assert "culprit_named" in problem and "hang watch" in problem


def test_preflight_refuses_hang_faults_where_no_rank_runs_the_agent() -> None:
    http = "target: {type: http, url: 'http://127.0.0.1:9/'}\n"
    problems = _problems(http + SPIN.replace("{rank: 1}, trigger", "{}, trigger") + "checks: [{type: completes}]\n")
    assert any("spin" in p for p in problems), problems
