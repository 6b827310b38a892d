"""The agent for PyTorch Lightning users: ``tests/jobs/user_lightning.py``, a Lightning script
(CPU, ``strategy="ddp"`` on 2 gloo ranks under torchrun) whose only mlchaos line is ``ChaosCallback(guard=...)``.

- With a planned ``grad_corrupt`` on rank 1 at step 3: every optimizer step is reported by both ranks
  (``target.step`` 1..6 with the loss), the fault fires inside Lightning's DDP all-reduce at step 3, the checksum
  guard detects it and the retry repairs it (both ranks end with the same digest).
- Without the guard the same fault is not detected (the detection above is the guard's, not an artefact).

Skipped, with the reason, where Lightning (the ``lightning`` extra) is not installed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from jobs.launch import launch
from support import ROOT

pytest.importorskip(
    "lightning", reason="Lightning is not installed: pip install -e '.[lightning]' (scripts/setup.sh does)"
)

JOB = str(ROOT / "tests" / "jobs" / "user_lightning.py")
SDC = {
    "op_id": "sdc#1",
    "fault": "sdc",
    "injector": "grad_corrupt",
    "at_step": 3,
    "rank": 1,
    "params": {"site": "in_transit", "rank": 1},
}


# An abort of one rank AFTER the run: C++ std::terminate during interpreter finalization, no Python frame left
# (faulthandler's dump), after fit returned, the agent closed and the process group was destroyed. Seen in 3 of
# ~40 runs of this module under pytest (2 in full `make test` runs), never in the plain-DDP user scripts; not
# yet pinned to Lightning, gloo or torch (docs/design/agent-integrations.md, "A Lightning rank may abort at
# interpreter exit"). Tolerated ONLY in that shape: both ranks reported every step and their closing digest, and
# the log carries the terminate line.
EXIT_ABORT = "terminate called without an active exception"


def _run(tmp_path: Path, guard: str) -> list[dict[str, Any]]:
    rc, events, log = launch(tmp_path / "job", [JOB, "--steps", "6", "--guard", guard], [SDC], nproc=2, timeout_s=240)
    closed = {e["rank"] for e in events if e["kind"] == "target.digest"}
    steps = {(e["rank"], e["data"]["step"]) for e in events if e["kind"] == "target.step"}
    aborted_after_close = EXIT_ABORT in log and closed == {0, 1} and len(steps) == 12
    assert rc == 0 or aborted_after_close, log[-3000:]
    assert [(e["rank"], e["data"]["step"]) for e in events if e["kind"] == "fault.applied"] == [(1, 3)], events
    return events


@pytest.mark.slow
def test_the_callback_reports_steps_and_an_armed_fault_fires_and_is_caught(tmp_path: Path) -> None:
    events = _run(tmp_path, "checksum")
    for rank in (0, 1):
        steps = [e["data"] for e in events if e["kind"] == "target.step" and e["rank"] == rank]
        assert [s["step"] for s in steps] == [1, 2, 3, 4, 5, 6] and all("loss" in s for s in steps), steps
    detected = [e for e in events if e["kind"] == "detect.sdc"]
    assert {e["rank"] for e in detected} == {0, 1} and all(e["data"]["step"] == 3 for e in detected), detected
    digests = {e["rank"]: e["data"]["digest"] for e in events if e["kind"] == "target.digest"}
    assert digests[0] == digests[1], digests


@pytest.mark.slow
def test_without_the_guard_the_fault_goes_unseen(tmp_path: Path) -> None:
    events = _run(tmp_path, "none")
    assert not [e for e in events if e["kind"] == "detect.sdc"]
