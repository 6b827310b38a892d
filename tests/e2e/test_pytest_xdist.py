"""Shipped scenarios side by side under pytest-xdist, as a user's CI runs them: ``pytest -n 2`` over three scenario
files (a frozen rank, a bit flip on the wire, a killed model server) passes, each item on its own
worker, with every run's history holding only its own faults.

The report dir links the golden cache of the suite's shared e2e root, so the golden runs the other end-to-end
tests compute (same scenarios, same seeds, same code) are read from its cache instead of being run again. These runs are also the
suite's only runs of ``freeze-rank`` and ``sdc-in-transit`` as shipped: what each must show (the freeze healed
and seen as a collective timeout; the flip fired by the in-job agent and caught in its step, naming rank 1) is
asserted here, on their histories.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT, SCENARIOS

from chaos.history.timeline import FAULT_APPLIED, FAULT_HEALED, Event, History

pytestmark = pytest.mark.slow

SIDE_BY_SIDE = ["freeze-rank", "sdc-in-transit", "serving-primary-killed"]


def test_pytest_n_2_runs_shipped_scenarios_side_by_side(e2e_report_root: Path, tmp_path: Path) -> None:
    # Its own report dir (other tests run these scenarios into the suite's root too: each run found here is
    # one of this call's), with the suite's golden cache linked in.
    reports = tmp_path / "reports"
    reports.mkdir()
    (e2e_report_root / ".golden").mkdir(exist_ok=True)
    (reports / ".golden").symlink_to(e2e_report_root / ".golden")
    files = [str(SCENARIOS / f"{name}.yaml") for name in SIDE_BY_SIDE]
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "-n",
        "2",
        "-p",
        "no:cacheprovider",
        "-q",
        "--chaos-report-dir",
        str(reports),
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}  # not this session's xdist worker
    done = subprocess.run([*argv, *files], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "3 passed" in done.stdout, done.stdout[-2000:]
    histories = {}
    for name in SIDE_BY_SIDE:
        runs = sorted(reports.glob(f"{name}-*/run.json"), key=lambda p: p.stat().st_mtime)
        assert runs, f"no report of {name} in {reports}"
        record = json.loads(runs[-1].read_text())
        faults = {e["data"]["fault"] for e in record["events"] if str(e["kind"]).startswith("fault.")}
        own = {fault["name"] for fault in record["scenario"]["faults"]}
        assert faults == own, (name, faults, own)
        histories[name] = History.from_events(Event.model_validate(e) for e in record["events"])
    # freeze-rank: the frozen rank was resumed, and the job's process group timed out on it.
    assert len(histories["freeze-rank"].of(FAULT_HEALED)) == 1
    assert histories["freeze-rank"].of("detect.collective_timeout")
    # sdc-in-transit: the in-job agent fired the flip; the guard caught it in that step and named rank 1.
    in_transit = histories["sdc-in-transit"]
    [applied] = in_transit.of(FAULT_APPLIED)
    assert applied.source == "target", "the in-job agent did not fire the fault"
    detections = in_transit.of("detect.sdc")
    assert detections, "no detect.sdc"
    assert {d.get_int("step") for d in detections} == {applied.get_int("step")}
    assert {d.get_int("culprit_rank") for d in detections} == {1}
