"""The harness SIGKILLed mid-fault, a sample of ``scripts/kill_trials.py`` (which runs 40 and more): one trial of
each of six kinds at once, each a real ``mlchaos run`` killed at a seeded moment while its fault is applied;
at the run's deadline + heal_grace nothing of it is left, and its journal says the dead-man healed it. Three of the
six have no duration (a partition, a packet loss and a delay, its NFQUEUE packet holder included here): only the
run's deadline ends those. Three more run on testbed host h2 (over SSH): a
duration-less partition with the job on h2 too, a freeze and a duty cycle (its helper runs on h2) of a victim there, the job on h1: each job dies with the harness, h2's own
switch heals by the deadline (the victim runs again, the helper is gone), and ``mlchaos cleanup`` then journals
that heal as the dead-man's instead of healing again. (The same on containers: ``test_e2e_docker.py``.)"""

from __future__ import annotations

import random
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from support import ROOT

sys.path.insert(0, str(ROOT / "scripts"))

from kill_trials import run_remote_trial, run_trial  # noqa: E402

from chaos.cluster.inventory import Inventory, dump_inventory  # noqa: E402

pytestmark = pytest.mark.slow

SAMPLE = [("freeze", 0), ("partition", 1), ("storage", 0), ("memory_pressure", 0), ("packet_loss", 1), ("delay", 1)]
REMOTE = [("partition", 1), ("freeze", 0), ("slow", 0)]


def test_a_killed_harness_leaves_nothing_past_its_runs_deadline(testbed: Inventory, tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.yaml"
    dump_inventory(testbed, inventory)
    with ThreadPoolExecutor(max_workers=len(SAMPLE) + len(REMOTE)) as pool:
        remote = [
            pool.submit(run_remote_trial, *item, random.Random(f"suite-h2-{item[0]}"), inventory) for item in REMOTE
        ]
        trials = list(pool.map(lambda item: run_trial(*item, random.Random(f"suite-{item[0]}")), SAMPLE))
        trials += [future.result() for future in remote]
    assert [t.line() for t in trials if t.left] == []
    assert {t.healed_by for t in trials} == {"deadman"}, [t.line() for t in trials]
    assert sum(t.durationless for t in trials) == 4
