"""On a job we did not write: a 1-ULP one-step weight flip, healed, leaves every rank of
``tests/jobs/user_ddp_adam.py`` (DDP, Adam, 2 gloo ranks, the one-line agent) bitwise equal to the golden run.

Three real torchrun launches: golden (no plan), the flip fired after backward (healed at the end of its step,
after the optimizer step), and the same flip fired before the forward as a control: the forward reads the
corrupted bias, so that run must differ, which shows the digest comparison can see a one-ulp fault at all.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from jobs.launch import launch
from support import ROOT

JOB = ROOT / "tests" / "jobs" / "user_ddp_adam.py"
STEPS = 8
FAULT_STEP = 3
TIMEOUT_S = 180


def run_job(workdir: Path, phase: str | None) -> list[dict[str, Any]]:
    """One torchrun launch (2 ranks); with ``phase``, a plan flips bit 0 of ``4.bias[1]`` on rank 1 at FAULT_STEP."""
    ops = []
    if phase is not None:
        params = {"where": "weights", "layer": "4.bias", "element": 1, "bit": 0, "phase": phase, "rank": 1}
        ops = [{"op_id": "op1", "fault": "flip", "injector": "bitflip", "at_step": FAULT_STEP, "rank": 1,
                "params": params}]  # fmt: skip
    rc, events, log = launch(workdir, [str(JOB), "--steps", str(STEPS)], ops, timeout_s=TIMEOUT_S, seed=5)
    assert rc == 0, log[-3000:]
    return events


def digests(events: list[dict[str, Any]]) -> dict[int, str]:
    return {e["rank"]: e["data"]["digest"] for e in events if e["kind"] == "target.digest"}


@pytest.mark.slow
def test_one_ulp_weight_flip_healed_after_the_step_leaves_every_rank_golden(tmp_path: Path) -> None:
    golden = run_job(tmp_path / "golden", None)
    assert len(set(digests(golden).values())) == 1 and set(digests(golden)) == {0, 1}
    assert [e["data"]["step"] for e in golden if e["kind"] == "target.step" and e["rank"] == 0] == list(
        range(1, STEPS + 1)
    )

    healed = run_job(tmp_path / "healed", "backward")
    applied = [e for e in healed if e["kind"] == "fault.applied"]
    assert [(e["rank"], e["data"]["step"]) for e in applied] == [(1, FAULT_STEP)]
    assert "4.bias" in applied[0]["data"]["description"] and "[1] bit 0" in applied[0]["data"]["description"]
    assert [(e["rank"], e["data"]["step"]) for e in healed if e["kind"] == "fault.healed"] == [(1, FAULT_STEP)]
    assert digests(healed) == digests(golden)

    control = run_job(tmp_path / "control", "forward")
    assert any(e["kind"] == "fault.applied" for e in control)
    assert set(digests(control).values()).isdisjoint(digests(golden).values())
