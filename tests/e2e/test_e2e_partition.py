"""A partition on a real SSH host of the testbed, driven by the runner from a scenario: applied over SSH,
detected by a reachability probe, healed on time; and, with the harness SIGKILLed mid-partition, healed by
the host's own dead-man switch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support import REACH_SSHD, cut_off, dead_man_heal_seconds, scenario_yaml, write_inventory

from chaos.cluster.inventory import Inventory
from chaos.history.timeline import FAULT_APPLIED, FAULT_HEALED
from chaos.run.orchestrator import RunOptions, execute
from chaos.run.result import EXIT_PASS
from chaos.spec.scenario import parse_scenario

pytestmark = pytest.mark.slow


def _scenario_text(inventory: Inventory, duration: float, rounds: int) -> str:
    h1 = next(h for h in inventory.hosts if h.name == "h1")
    h2 = next(h for h in inventory.hosts if h.name == "h2")
    ns = h1.labels["netns"]
    target = {  # inside h1's namespace, probing h2: success = progress, failure = detection
        "type": "command",
        "command": ["ip", "netns", "exec", ns, sys.executable, "-c", REACH_SSHD, h2.address, rounds],
        "matchers": [
            {"pattern": r"^ok (?P<step>\d+)", "event": "target.step"},
            {"pattern": r"^unreachable (?P<step>\d+)", "event": "detect.unreachable"},
        ],
    }
    detected = {"fault": "cut-h2", "within": "5s", "event": "detect.unreachable"}
    return scenario_yaml(
        "partition-probe",
        5,
        target,
        cluster={"transport": "ssh"},
        faults=[cut_off("h2", after="1.5s", duration=duration)],
        checks=[
            {"type": "detected_within", "params": detected},
            {"type": "recovered_within", "params": {"fault": "cut-h2", "within": f"{duration + 10}s"}},
        ],
        safety={"heal_grace": "2s", "max_duration": "90s", "no_progress_timeout": "30s"},
    )


def _h2_has_our_rules(inventory: Inventory) -> bool:
    h2 = next(h for h in inventory.hosts if h.name == "h2")
    out = subprocess.run(
        ["ip", "netns", "exec", h2.labels["netns"], "iptables", "-S"], capture_output=True, text=True, check=True
    ).stdout
    return "CHAOS-" in out or "mlchaos:" in out


def test_partition_over_ssh_is_detected_and_healed(testbed: Inventory, tmp_path: Path) -> None:
    inventory_file = write_inventory(testbed, tmp_path)
    scenario = parse_scenario(_scenario_text(testbed, duration=3, rounds=40))
    result = execute(scenario, RunOptions(report_root=tmp_path, inventory=inventory_file))
    assert result.exit_code == EXIT_PASS, (result.error, [r.model_dump() for r in result.results])
    [applied] = result.history.of(FAULT_APPLIED)
    assert applied.data["host"] == "h2"
    assert len(result.history.of(FAULT_HEALED)) == 1
    assert not _h2_has_our_rules(testbed)


def test_missing_inventory_is_refused_before_anything_runs(testbed: Inventory, tmp_path: Path) -> None:
    scenario = parse_scenario(_scenario_text(testbed, duration=3, rounds=5))
    result = execute(scenario, RunOptions(report_root=tmp_path))
    assert result.exit_code == 2 and "no inventory was given" in result.error
    assert not result.history.of(FAULT_APPLIED)


def test_sigkilled_harness_mid_partition_is_healed_by_the_hosts_dead_man(
    testbed: Inventory,
    tmp_path: Path,
) -> None:
    scenario_file = tmp_path / "s.yaml"
    duration, grace = 4.0, 2.0
    scenario_file.write_text(_scenario_text(testbed, duration=duration, rounds=200))
    # Whatever happens, h2 is left clean: `mlchaos cleanup` heals from the journal over SSH.
    healed_after = dead_man_heal_seconds(
        scenario_file, testbed, tmp_path, lambda: _h2_has_our_rules(testbed), heal_within=duration + grace + 10
    )
    assert healed_after >= duration * 0.5, "healed too early: not the dead-man"
    assert not _h2_has_our_rules(testbed)
