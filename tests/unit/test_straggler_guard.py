"""The straggler guard's decision logic (pure, hand-made and hypothesis sequences), its time accounting and the
peer-loss classification of gloo errors. The real 3-rank torchrun job is in tests/integration/test_straggler_job.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import FakeClock

from chaos.guards.straggler import Detection, StragglerDetector, StragglerGuard
from chaos.reference.trainer import parse_args, peer_address, peer_loss_detector

# --- the pure decision ------------------------------------------------------------------------------------


def _feed(detector: StragglerDetector, rows: list[list[float]]) -> list[Detection]:
    found: list[Detection] = []
    for step, row in enumerate(rows, start=1):
        found += detector.observe(step, row, [0.0] * len(row))
    return found


def test_level_ranks_never_fire() -> None:
    detector = StragglerDetector(3, window=5, ratio=2.0, min_excess=0.2)
    assert _feed(detector, [[0.05, 0.05, 0.05]] * 50) == []


def test_one_slow_rank_fires_once_naming_it_with_the_evidence() -> None:
    detector = StragglerDetector(3, window=5, ratio=2.0, min_excess=0.2)
    assert _feed(detector, [[0.05, 0.05, 0.05]] * 10) == []
    # Rank 1 stalls for 0.5 s once: 0.55 + 4 x 0.05 = 0.75 s against its peers' 0.25 s (3x, +0.5 s).
    found = detector.observe(11, [0.05, 0.55, 0.05], [0.5, 0.0, 0.5])
    assert [(d.rank, d.step, d.window) for d in found] == [(1, 11, 5)]
    detection = found[0]
    assert detection.compute_s == pytest.approx((0.25, 0.75, 0.25))
    assert detection.wait_s == pytest.approx((0.5, 0.0, 0.5))  # the straggler waits least
    assert detection.median_s == pytest.approx(0.25) and detection.observed_ratio == pytest.approx(3.0)
    assert "rank 1" in str(detection)
    # The same episode goes on: no second event while the rank stays slow.
    rows = [[0.05, 0.55, 0.05]] * 20
    assert [d for step, row in enumerate(rows, 12) for d in detector.observe(step, row, [0.0] * 3)] == []


def test_rearms_only_after_a_full_window_under_the_threshold() -> None:
    detector = StragglerDetector(2, window=3, ratio=2.0, min_excess=0.1)
    slow, level = [0.05, 0.5], [0.05, 0.05]
    steps = iter(range(1, 1000))

    def run(rows: list[list[float]]) -> list[int]:
        return [d.step for row in rows for d in detector.observe(next(steps), row, [0.0, 0.0])]

    assert run([level] * 3 + [slow]) == [4]
    # The slow step stays in the window for 2 more steps; then 2 calm steps: not yet a full calm window.
    assert run([level] * 4 + [slow]) == []
    # 3 calm steps once the slow step has left the window re-arm the rank; the next stall fires again.
    assert run([level] * 5 + [slow]) == [15]


def test_min_excess_keeps_fast_jitter_quiet_and_ratio_keeps_slow_jobs_quiet() -> None:
    # 10x slower, but only 5 ms per step: scheduler noise on tiny steps, not a straggler.
    tiny = StragglerDetector(3, window=5, ratio=2.0, min_excess=0.2)
    assert _feed(tiny, [[0.001, 0.01, 0.001]] * 20) == []
    # +1 s over the window but only 1.2x: a big job with uneven ranks, not a straggler.
    big = StragglerDetector(3, window=5, ratio=2.0, min_excess=0.2)
    assert _feed(big, [[1.0, 1.2, 1.0]] * 20) == []


def test_waits_for_a_full_window() -> None:
    detector = StragglerDetector(3, window=4, ratio=2.0, min_excess=0.0)
    rows = [[0.0, 9.0, 0.0]] * 4
    assert [d.step for d in _feed(detector, rows)] == [4]


def test_median_of_the_others_tolerates_a_second_slow_rank_in_larger_worlds() -> None:
    detector = StragglerDetector(5, window=2, ratio=2.0, min_excess=0.1)
    found = _feed(detector, [[0.05, 0.05, 0.9, 0.05, 0.5]] * 2)
    assert sorted(d.rank for d in found) == [2, 4]


def test_two_ranks_work() -> None:
    # A median over ALL ranks would never let one of two ranks reach 2x of it.
    detector = StragglerDetector(2, window=2, ratio=2.0, min_excess=0.1)
    assert [d.rank for d in _feed(detector, [[0.5, 0.05]] * 2)] == [0]


def test_a_single_rank_never_fires() -> None:
    assert _feed(StragglerDetector(1, window=1), [[5.0]] * 3) == []


def test_refuses_bad_settings_and_rows() -> None:
    for kwargs in ({"window": 0}, {"ratio": 0.5}, {"ratio": float("nan")}, {"min_excess": -1.0}):
        with pytest.raises(ValueError):
            StragglerDetector(3, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        StragglerDetector(0)
    detector = StragglerDetector(3)
    for compute, wait in (([0.1, 0.1], [0.0] * 3), ([0.1, float("nan"), 0.1], [0.0] * 3), ([0.1] * 3, [-1.0] * 3)):
        with pytest.raises(ValueError):
            detector.observe(1, compute, wait)


_seconds = st.floats(min_value=0.0, max_value=10.0, allow_nan=False)
_settings = st.tuples(
    st.integers(min_value=1, max_value=8),  # window K
    st.floats(min_value=1.0, max_value=10.0),  # ratio R
    st.floats(min_value=0.0, max_value=1.0),  # min_excess S
)


@settings(max_examples=200, deadline=None)
@given(world=st.integers(2, 8), config=_settings, per_step=st.lists(_seconds, min_size=1, max_size=40))
def test_property_level_ranks_never_fire(world: int, config: tuple[int, float, float], per_step: list[float]) -> None:
    window, ratio, min_excess = config
    detector = StragglerDetector(world, window=window, ratio=ratio, min_excess=min_excess)
    assert _feed(detector, [[v] * world for v in per_step]) == []


@settings(max_examples=300, deadline=None)
@given(
    world=st.integers(2, 8),
    config=_settings,
    prefix=st.lists(_seconds, max_size=20),
    others=st.lists(_seconds, min_size=8, max_size=8),
    extra=st.lists(st.floats(min_value=0.0, max_value=5.0), min_size=8, max_size=8),
    data=st.data(),
)
def test_property_one_inflated_rank_is_named_within_k_steps(
    world: int,
    config: tuple[int, float, float],
    prefix: list[float],
    others: list[float],
    extra: list[float],
    data: st.DataObject,
) -> None:
    """Level ranks, then from some step on one rank takes >= R x its peers' time plus S/K per step: that rank is
    named within K steps of the start, exactly once, and no other rank is named."""
    window, ratio, min_excess = config
    slow = data.draw(st.integers(0, world - 1), label="slow rank")
    detector = StragglerDetector(world, window=window, ratio=ratio, min_excess=min_excess)
    assert _feed(detector, [[v] * world for v in prefix]) == []
    start = len(prefix) + 1
    floor = max(min_excess, 1e-3) / window + 1e-6  # > 0 (level at zero is not inflated); 1e-6 beats rounding
    found: list[Detection] = []
    for i in range(window):
        row = [others[i]] * world
        row[slow] = ratio * others[i] + floor + extra[i]
        found += detector.observe(start + i, row, [0.0] * world)
    assert [d.rank for d in found] == [slow]
    assert start <= found[0].step < start + window


@settings(max_examples=200, deadline=None)
@given(
    world=st.integers(3, 8),
    config=_settings,
    rows=st.lists(st.lists(_seconds, min_size=8, max_size=8), min_size=8, max_size=8),
    data=st.data(),
)
def test_property_inflated_over_uneven_peers_is_still_named(
    world: int, config: tuple[int, float, float], rows: list[list[float]], data: st.DataObject
) -> None:
    """Peers need not be level: a rank at >= R x the slowest peer's time (+ S/K) per step is named within K steps
    (other uneven ranks may be named too)."""
    window, ratio, min_excess = config
    slow = data.draw(st.integers(0, world - 1), label="slow rank")
    detector = StragglerDetector(world, window=window, ratio=ratio, min_excess=min_excess)
    named: set[int] = set()
    for step, full in enumerate(rows[:window], start=1):
        row = full[:world]
        row[slow] = ratio * max(v for r, v in enumerate(row) if r != slow) + max(min_excess, 1e-3) / window + 1e-6
        named |= {d.rank for d in detector.observe(step, row, [0.0] * world)}
    assert slow in named


# --- the in-job accounting (world of one: no process group needed) ---------------------------------------


def test_guard_splits_local_work_from_collective_time() -> None:
    clock = FakeClock(100.0)
    emitted: list[tuple[str, dict[str, Any]]] = []
    guard = StragglerGuard(clock=clock, emit=lambda kind, **data: emitted.append((kind, data)))
    guard.start()
    clock.now += 0.3  # forward: local
    with guard.collective():
        clock.now += 0.5  # backward + all-reduce: blocked
    assert guard.exchange(1) == []
    assert guard.last == pytest.approx((0.3, 0.5))
    clock.now += 0.2  # optimizer, sleep: local
    with guard.collective():
        clock.now += 0.1
    guard.exchange(2)
    assert guard.last == pytest.approx((0.2, 0.1))
    assert emitted == []  # one rank has no peers to straggle behind


# --- peer loss ----------------------------------------------------------------------------------------------

_RESET = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:14053: "
    "Connection reset by peer. This is typically caused by a remote worker hanging or bugs in the application."
)
_CLOSED = "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.7]:29501"
_TIMEOUT = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 4000ms "
    "for recv operation to complete"
)


@pytest.mark.parametrize(
    ("message", "detector", "peer"),
    [
        (_RESET, "gloo", "127.0.0.1:14053"),  # messages as gloo writes them (rank 1 SIGKILLed / SIGSTOPped)
        (_CLOSED, "gloo", "10.0.0.7:29501"),
        (_TIMEOUT, "pg_timeout", None),
        ("[pair.cc:1] Read error [::1]:41234: Connection reset by peer", "gloo", "[::1]:41234"),
        ("Broken pipe while writing to 192.168.1.2:7000", "gloo", "192.168.1.2:7000"),
        ("Socket Timeout", "pg_timeout", None),
        ("gloo: unsupported reduction op", None, None),
        ("Invalid scalar type", None, None),
    ],
)
def test_peer_loss_classification(message: str, detector: str | None, peer: str | None) -> None:
    assert peer_loss_detector(message) == detector
    assert peer_address(message) == peer


def test_cli_flags_and_defaults(tmp_path: Path) -> None:
    default = parse_args(["--checkpoint-dir", str(tmp_path)])
    assert (default.straggler_guard, default.straggler_window) == (False, 5)
    assert (default.straggler_ratio, default.straggler_min_excess) == (2.0, 0.2)
    cfg = parse_args(
        ["--checkpoint-dir", str(tmp_path), "--straggler-guard", "--straggler-window", "8"]
        + ["--straggler-ratio", "3", "--straggler-min-excess", "0.5"]
    )
    assert (cfg.straggler_guard, cfg.straggler_window, cfg.straggler_ratio, cfg.straggler_min_excess) == (
        True,
        8,
        3.0,
        0.5,
    )
    for bad in (["--straggler-window", "0"], ["--straggler-ratio", "0.9"], ["--straggler-min-excess", "-1"]):
        with pytest.raises(SystemExit):
            parse_args(["--checkpoint-dir", str(tmp_path), *bad])
