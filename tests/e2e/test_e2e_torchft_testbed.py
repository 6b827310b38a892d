"""torchft replica groups spread over the hosts of the testbed: ``scenarios/torchft-replica-killed-testbed.yaml``
puts the lighthouse on h1 and the two replica groups on h2 and h3, each started over SSH by the roles target.
The kill of group 1 must land on h3 (the host that runs it), the survivor on h2 keeps training, and group 1,
restarted on h3, heals from h2 across the testbed network (by hostname, as on a cluster with DNS) and rejoins.

Skipped, with the reason, without torchft or where the testbed cannot be built (not root, no netns/sshd).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support import ROOT, write_inventory

from chaos.cluster.inventory import Inventory
from chaos.run.orchestrator import RunOptions, execute
from chaos.spec.scenario import load_scenario
from chaos.testbed.system import netns_pids

pytest.importorskip("torchft", reason="torchft is not installed: pip install -e '.[torchft]' (scripts/setup.sh does)")

pytestmark = pytest.mark.slow

SCENARIO = ROOT / "scenarios" / "torchft-replica-killed-testbed.yaml"


def test_a_replica_group_on_another_host_is_killed_there_and_rejoins(testbed: Inventory, tmp_path: Path) -> None:
    inventory = write_inventory(testbed, tmp_path)
    result = execute(
        load_scenario(SCENARIO),
        RunOptions(report_root=tmp_path / "reports", scenario_file=SCENARIO, inventory=inventory),
    )
    got = {r.name: (r.status, r.reason) for r in result.results}
    history = result.history
    applied = history.of("fault.applied")
    assert applied and applied[0].get_str("host") == "h3", applied  # the kill went to the replica's host
    starts = {e.get_str("replica"): e for e in history.of("target.role_start") if e.get_int("attempt") == 0}
    assert set(starts) == {"lighthouse", "group.0", "group.1"}, starts
    steps = [e for e in history.of("target.step") if e.get_str("replica") == "group.0"]
    assert steps and {e.get_str("host") for e in steps} == {"h2"}, "group 0's steps did not come from h2"
    restarts = [e for e in history.of("target.role_restart") if e.get_str("replica") == "group.1"]
    assert restarts, "the roles target did not restart the killed group on its host"
    heals = [e for e in history.of("target.heal") if e.get_str("replica") == "group.1"]
    assert heals and {e.get_str("host") for e in heals} == {"h3"}, heals  # healed on h3 from h2's live state
    assert result.verdict == "pass", got
    for host in testbed.hosts:  # nothing of the run is left on any host
        left = [pid for pid in netns_pids(host.labels["netns"]) if b"torchft" in _cmdline(pid)]
        assert not left, f"torchft processes left on {host.name}: {left}"


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
