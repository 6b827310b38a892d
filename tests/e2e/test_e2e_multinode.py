"""The multi-host scenarios, unchanged, against the 3-host testbed: a torchrun job with one agent per host
(c10d rendezvous over the testbed network), faults applied over SSH on the host of a rank, checks on the
merged history. Each runs through the CLI exactly as a user would (`mlchaos run FILE --inventory FILE`), and
afterwards no rule, mount or process of the run may be left on any host."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import leftovers_on_testbed, run_scenario_file, write_inventory, written_run

from chaos.cluster.inventory import Inventory

pytestmark = pytest.mark.slow

# (scenario, extra CLI args): the five multi-host scenarios. A local scenario file moved unchanged onto a remote
# host (`--nodes`) is test_e2e_docker's kill-rank on a container.
CASES = [
    ("partition-node", []),
    ("slow-node", []),
    ("checkpoint-storage-stall", []),
    ("lossy-link", []),
    ("slow-link", []),
]


@pytest.mark.parametrize(("name", "extra"), CASES, ids=[name for name, _ in CASES])
def test_scenario_passes_on_the_testbed(
    name: str,
    extra: list[str],
    testbed: Inventory,
    tmp_path: Path,
    e2e_report_root: Path,
) -> None:
    inventory_file = write_inventory(testbed, tmp_path)
    # A RELATIVE report dir, as `mlchaos run` and `mlchaos suite run` default to: the job on the other hosts
    # must still find its run dir (they do not start in the harness's working directory).
    reports = "reports"
    done = run_scenario_file(name, "--inventory", inventory_file, "--report-dir", reports, *extra, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    run_dir, run, history = written_run(done)
    assert run["verdict"] == "pass"
    applied = [e for e in history if e["kind"] == "fault.applied"]
    healed = [e for e in history if e["kind"] == "fault.healed"]
    assert len(applied) == 1 and applied[0]["data"]["host"] in testbed.names()
    assert len(healed) == 1
    # The rank -> host mapping is in the history: every rank's start names the host it ran on.
    starts = [e for e in history if e["kind"] == "target.start"]
    expected = {"h1"} if extra else set(testbed.names())
    assert {e["data"]["host"] for e in starts} == expected
    assert not leftovers_on_testbed(testbed, run_dir)
