"""The harness SIGKILLed mid-fault, a sample of ``scripts/kill_trials.py`` (which runs 40 and more): one trial of
each of five kinds at once, each a real ``mlchaos run`` killed at a seeded moment while its fault is applied;
at the run's deadline + heal_grace nothing of it is left, and its journal says the dead-man healed it. Two of the
five have no duration (a partition and a packet loss): only the run's deadline ends those."""

from __future__ import annotations

import random
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from support import ROOT

sys.path.insert(0, str(ROOT / "scripts"))

from kill_trials import run_trial  # noqa: E402

pytestmark = pytest.mark.slow

SAMPLE = [("freeze", 0), ("partition", 1), ("storage", 0), ("memory_pressure", 0), ("packet_loss", 1)]


def test_a_killed_harness_leaves_nothing_past_its_runs_deadline() -> None:
    with ThreadPoolExecutor(max_workers=len(SAMPLE)) as pool:
        trials = list(pool.map(lambda item: run_trial(*item, random.Random(f"suite-{item[0]}")), SAMPLE))
    assert [t.line() for t in trials if t.left] == []
    assert {t.healed_by for t in trials} == {"deadman"}, [t.line() for t in trials]
    assert sum(t.durationless for t in trials) == 2
