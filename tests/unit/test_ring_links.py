"""The straggler guard's link half: which rank's two ring links are slow (pure), and the ring ping on real gloo."""

from __future__ import annotations

import math

import pytest

from chaos.guards.ring_links import LinkDetector

FAST, SLOW = 0.0003, 0.05


def _feed(detector: LinkDetector, rows: list[list[float]]) -> list[tuple[int, int]]:
    return [(found.rank, found.step) for step, row in enumerate(rows) for found in detector.observe(step, row)]


def test_the_rank_on_both_slow_ring_links_is_named_once_per_episode() -> None:
    # Rank 1's egress delayed: link 0 (0->1, the echo comes back from 1) and link 1 (1->2) slow, link 2 fast.
    detector = LinkDetector(3, window=3)
    named = _feed(detector, [[FAST, FAST, FAST]] * 3 + [[2 * SLOW, SLOW, FAST]] * 6)
    assert named == [(1, 4)]  # the window's median turns once two of its three rows are slow; not again


def test_one_slow_link_names_no_rank() -> None:
    # Only the pair 1->2 is slow: either end could be at fault, so no rank is named.
    detector = LinkDetector(3, window=3)
    assert _feed(detector, [[FAST, SLOW, FAST]] * 8) == []


def test_every_link_slow_alike_names_no_rank() -> None:
    detector = LinkDetector(4, window=3)
    assert _feed(detector, [[SLOW, SLOW, SLOW, SLOW]] * 8) == []


def test_one_stall_does_not_make_a_link_slow() -> None:
    # One step where rank 1 was descheduled mid-ping: the window's median ignores it.
    detector = LinkDetector(3, window=5)
    rows = [[FAST, FAST, FAST]] * 5 + [[10 * SLOW, 10 * SLOW, FAST]] + [[FAST, FAST, FAST]] * 5
    assert _feed(detector, rows) == []


def test_two_ranks_cannot_tell_which_end_is_slow() -> None:
    detector = LinkDetector(2, window=2)
    assert _feed(detector, [[SLOW, SLOW]] * 5) == []


def test_a_rank_is_named_again_after_a_calm_window() -> None:
    detector = LinkDetector(3, window=2)
    slow, calm = [[FAST, 2 * SLOW, SLOW]] * 3, [[FAST, FAST, FAST]] * 3
    assert [rank for rank, _ in _feed(detector, slow + calm + slow)] == [2, 2]


def test_the_floor_keeps_sub_millisecond_noise_quiet() -> None:
    # 10x slower but only 0.9 ms above the others: under the 5 ms default floor.
    detector = LinkDetector(3, window=2)
    assert _feed(detector, [[0.001, 0.001, 0.0001]] * 5) == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"window": 0}, "window"),
        ({"window": 2, "ratio": 0.5}, "ratio"),
        ({"window": 2, "min_excess": -1}, "min_excess"),
    ],
)
def test_bad_settings_are_refused(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LinkDetector(3, **kwargs)  # type: ignore[arg-type]


def test_bad_rows_are_refused() -> None:
    detector = LinkDetector(3, window=2)
    with pytest.raises(ValueError, match="expected 3"):
        detector.observe(0, [FAST, FAST])
    with pytest.raises(ValueError, match="finite"):
        detector.observe(0, [FAST, math.nan, FAST])
