"""Every random stream of a run comes from its one seed through chaos.plan.seeds, and the streams are the ones
earlier releases drew (a saved seed replays the same faults, hosts and arrivals after the layout change)."""

from __future__ import annotations

import random

from chaos.plan.seeds import derive_rng, derive_seed


def test_the_plan_stream_is_the_run_seed_itself() -> None:
    assert derive_seed(1234) == 1234
    assert derive_rng(1234).random() == random.Random(1234).random()


def test_purposes_give_the_streams_of_the_formats_used_before() -> None:
    # hosts: f"{seed}:{op_id}" / f"{seed}:target"; agent: f"{seed}:{op_id}:{rank}"; load: f"{seed}:arrivals"
    for purpose, legacy in [
        (("op-3",), "7:op-3"),
        (("target",), "7:target"),
        (("op-1", 2), "7:op-1:2"),
        (("arrivals",), "7:arrivals"),
    ]:
        assert derive_rng(7, *purpose).random() == random.Random(legacy).random()


def test_different_purposes_and_seeds_give_different_streams() -> None:
    draws = {derive_rng(seed, *purpose).random() for seed in (1, 2) for purpose in [("a",), ("b",), ("a", 0), ()]}
    assert len(draws) == 8
