"""End to end: the shipped optimizer-state-bitflip scenario. A flip in rank 1's momentum buffer makes rank 1's
replica diverge while the job exits 0; the consistency guard names rank 1 within 10 steps and ``ranks_agree``
fails the run (the scenario is expected to fail)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import ROOT

from chaos.history.timeline import FAULT_APPLIED
from chaos.run.orchestrator import RunOptions, execute
from chaos.run.result import EXIT_FAIL
from chaos.spec.scenario import load_scenario

pytestmark = pytest.mark.slow

EVERY = 10  # the scenario's --consistency-every


def test_optimizer_state_flip_is_named_and_fails_ranks_agree(e2e_report_root: Path) -> None:
    source = ROOT / "scenarios" / "optimizer-state-bitflip.yaml"
    result = execute(load_scenario(source), RunOptions(report_root=e2e_report_root, scenario_file=source))
    statuses = {r.check: (r.status, r.reason) for r in result.results}
    [applied] = result.history.of(FAULT_APPLIED)
    assert applied.source == "target" and applied.rank == 1, "the in-job agent did not fire the fault on rank 1"
    fault_step = applied.get_int("step")
    assert fault_step == 12

    detections = result.history.of("detect.divergence")
    assert len(detections) == 1, "one detection per onset, not one per check"
    [divergence] = detections
    step = divergence.get_int("step")
    assert step is not None and fault_step <= step <= fault_step + EVERY
    assert divergence.get_int("culprit_rank") == 1 and divergence.data["odd_ranks"] == [1]
    assert divergence.data["groups"] == [[0, 2], [1]]

    assert statuses["sdc_detected"][0] == "pass", statuses
    assert statuses["ranks_agree"][0] == "fail" and "rank 1 diverged" in statuses["ranks_agree"][1], statuses
    assert statuses["completes"][0] == "pass", statuses  # the job itself exited 0: only ranks_agree catches it
    assert result.exit_code == EXIT_FAIL
