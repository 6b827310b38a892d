"""The agent on DDP with a non-default process group: ``tests/jobs/user_ddp_subgroup.py``, a
user-style script whose 4 gloo ranks form two DDP groups (``dist.new_group``: ranks 0-1 and 2-3) training two
different models. Four ranks, not two: with two, a DDP group of both ranks reduces exactly what the default group
does, and a guard on the wrong group would go unnoticed.

- Clean, checksum guard and consistency guard on: each group's ranks end bit-identical and the two groups differ
  (a hook on the default group would average all four ranks into one model); the consistency guard compared
  each group on its own (its reporters are ranks 0 and 2, every verdict agrees; on the default group the two
  models would be a divergence at the first check).
- ``grad_corrupt`` in transit on rank 3: detected inside group 2-3's reduction only, named by global ranks, and
  repaired by the retry (the group's ranks still end identical).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from jobs.launch import launch
from support import ROOT

JOB = [str(ROOT / "tests" / "jobs" / "user_ddp_subgroup.py"), "--steps", "6", "--guard", "checksum"]


def _digests(events: list[dict[str, Any]]) -> dict[int, str]:
    return {e["rank"]: e["data"]["digest"] for e in events if e["kind"] == "target.digest"}


@pytest.mark.slow
def test_guards_run_on_the_ddp_modules_own_group(tmp_path: Path) -> None:
    rc, events, log = launch(tmp_path / "job", JOB, nproc=4)
    assert rc == 0, log[-3000:]
    digests = _digests(events)
    assert digests[0] == digests[1] and digests[2] == digests[3], digests
    assert digests[0] != digests[2], digests
    verdicts = [e for e in events if e["kind"] == "guard.consistency"]
    assert {e["rank"] for e in verdicts} == {0, 2}, verdicts
    assert verdicts and all(e["data"]["agree"] for e in verdicts), verdicts
    assert not [e for e in events if e["kind"].startswith("detect.")], events
    steps = [e for e in events if e["kind"] == "target.step"]
    assert {e["rank"] for e in steps} == {0, 1, 2, 3} and len(steps) == 4 * 6


@pytest.mark.slow
def test_sdc_in_one_groups_reduction_is_detected_there_and_repaired(tmp_path: Path) -> None:
    op = {
        "op_id": "sdc#1",
        "fault": "sdc",
        "injector": "grad_corrupt",
        "at_step": 3,
        "rank": 3,
        "params": {"site": "in_transit", "rank": 3},
    }
    rc, events, log = launch(tmp_path / "job", JOB, [op], nproc=4)
    assert rc == 0, log[-3000:]
    assert [(e["rank"], e["data"]["step"]) for e in events if e["kind"] == "fault.applied"] == [(3, 3)]
    detected = [e for e in events if e["kind"] == "detect.sdc"]
    assert detected and {e["rank"] for e in detected} <= {2, 3}, detected
    assert all(set(e["data"]["ranks"]) <= {2, 3} and e["data"]["step"] == 3 for e in detected), detected
    digests = _digests(events)
    assert digests[2] == digests[3] and digests[0] == digests[1], digests
