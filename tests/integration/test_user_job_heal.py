"""On a job we did not write (``tests/jobs/user_ddp_adam.py``: DDP, Adam, 2 gloo ranks, the one-line agent), the
digest sees a one-ulp fault at all: the same 1-ULP flip of one bias that, fired after backward and healed at the
end of its step, leaves every rank golden (judged through the whole harness in
tests/e2e/test_e2e_user_job.py), changes every rank's digest when fired before the forward, which reads it.

Two real torchrun launches: golden (no plan) and the flip before the forward.
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
        ops = [
            {"op_id": "op1", "fault": "flip", "injector": "bitflip", "at_step": FAULT_STEP, "rank": 1, "params": params}
        ]
    rc, events, log = launch(workdir, [str(JOB), "--steps", str(STEPS)], ops, timeout_s=TIMEOUT_S, seed=5)
    assert rc == 0, log[-3000:]
    return events


def digests(events: list[dict[str, Any]]) -> dict[int, str]:
    return {e["rank"]: e["data"]["digest"] for e in events if e["kind"] == "target.digest"}


@pytest.mark.slow
def test_a_one_ulp_flip_the_forward_reads_changes_every_ranks_digest(tmp_path: Path) -> None:
    golden = run_job(tmp_path / "golden", None)
    assert len(set(digests(golden).values())) == 1 and set(digests(golden)) == {0, 1}
    assert [e["data"]["step"] for e in golden if e["kind"] == "target.step" and e["rank"] == 0] == list(
        range(1, STEPS + 1)
    )
    control = run_job(tmp_path / "control", "forward")
    applied = [e for e in control if e["kind"] == "fault.applied"]
    assert [(e["rank"], e["data"]["step"]) for e in applied] == [(1, FAULT_STEP)]
    assert "4.bias" in applied[0]["data"]["description"] and "[1] bit 0" in applied[0]["data"]["description"]
    assert set(digests(control)) == {0, 1} and set(digests(control).values()).isdisjoint(digests(golden).values())
