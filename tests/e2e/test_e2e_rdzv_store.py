"""The rendezvous store as a fault target on the 3-host testbed, through the CLI as a user runs it: the c10d store's
port partitioned (scenarios/rdzv-store-partition.yaml) and the etcd store frozen (scenarios/rdzv-etcd-freeze.yaml),
each while rank 2 is killed, re-rendezvous and completion judged; and, with the harness SIGKILLed while etcd is
frozen, etcd thawed by its host's dead-man. etcd runs on h3 for this module only: the session's testbed is brought
``up`` again with ``etcd=True`` and afterwards without it, which must leave no etcd behind."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import (
    ROOT,
    dead_man_heal_seconds,
    leftovers_on_testbed,
    pids_mentioning,
    pids_where,
    run_scenario_file,
    write_inventory,
    written_run,
)

from chaos.cluster.inventory import Inventory
from chaos.testbed import etcd as etcd_host
from chaos.testbed import namespaces as tb

pytestmark = pytest.mark.slow

# scenario -> the store fault's name, and the host it must land on (the store's: node 0 with c10d, etcd's host)
CASES = {"rdzv-store-partition": ("cut-store", "h1"), "rdzv-etcd-freeze": ("freeze-store", "h3")}


def _etcd_pids(state: Path) -> list[int]:
    """The testbed's etcd: the etcd program whose arguments name the testbed's state dir (its data is there)."""
    return pids_where(lambda argv: argv.split(b"\0")[0].endswith(b"etcd") and str(state).encode() in argv)


def _stopped(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] == "T"


@pytest.fixture(scope="module")
def etcd_testbed(testbed: Inventory) -> Iterator[tuple[Inventory, Path]]:
    """The session's testbed with etcd on its last host (inventory group etcd), and the testbed's state dir."""
    reason = etcd_host.unsupported_reason()
    if reason is None and importlib.util.find_spec("etcd") is None:
        reason = "python-etcd is not installed (torch's etcd-v2 rendezvous needs it): pip install python-etcd"
    if reason is not None:
        pytest.skip(reason)
    assert testbed.hosts[0].key_file is not None
    state = Path(testbed.hosts[0].key_file).parent  # the client key lives in the testbed's state dir
    try:
        yield tb.up(len(testbed.hosts), state, etcd=True), state
    finally:
        tb.up(len(testbed.hosts), state)  # as before: no etcd, the inventory without its group
    assert not _etcd_pids(state), "etcd outlived the testbed's `up` without it"


def _leftovers(inventory: Inventory, run_dir: Path) -> list[str]:
    ps = subprocess.run(["ps", "-eo", "pid=,stat=,args="], capture_output=True, text=True).stdout
    stopped = [f"stopped: {line.strip()}" for line in ps.splitlines() if " T" in line[:16] and "etcd" in line]
    return leftovers_on_testbed(inventory, run_dir) + stopped


@pytest.mark.parametrize("name", sorted(CASES))
def test_store_scenario_recovers_on_the_testbed(
    name: str, etcd_testbed: tuple[Inventory, Path], tmp_path: Path
) -> None:
    inventory, _ = etcd_testbed
    fault, store_host = CASES[name]
    done = run_scenario_file(name, "--inventory", write_inventory(inventory, tmp_path), "--report-dir", tmp_path)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    run_dir, run, history = written_run(done)
    assert run["verdict"] == "pass"
    applied = [e for e in history if e["kind"] == "fault.applied"]
    healed = [e for e in history if e["kind"] == "fault.healed"]
    assert [e["data"]["host"] for e in applied if e["data"]["fault"] == fault] == [store_host]
    assert [e["data"]["fault"] for e in healed] == [fault]
    assert [e["data"]["fault"] for e in applied].count("kill-rank") == 1
    [rerendezvous] = [c for c in run["checks"] if c["check"] == "rerendezvous_within"]
    assert rerendezvous["status"] == "pass" and rerendezvous["measured"] > 0
    # every node met again after the kill, and not before the store came back
    kill = next(e["ts_ns"] for e in applied if e["data"]["fault"] == "kill-rank")
    rounds = {e["data"]["host"] for e in history if e["kind"] == "target.rendezvous" and e["ts_ns"] > kill}
    assert rounds == set(inventory.names())
    assert not _leftovers(inventory, run_dir)


def test_sigkilled_harness_while_etcd_is_frozen_is_thawed_by_the_dead_man(
    etcd_testbed: tuple[Inventory, Path], tmp_path: Path
) -> None:
    inventory, state = etcd_testbed
    [etcd] = _etcd_pids(state)
    scenario = ROOT / "scenarios" / "rdzv-etcd-freeze.yaml"
    duration, grace = 10.0, 5.0  # the scenario's freeze, and the default heal_grace
    try:
        thawed_after = dead_man_heal_seconds(
            scenario, inventory, tmp_path, lambda: _stopped(etcd), heal_within=duration + grace + 15
        )
        assert thawed_after >= duration * 0.5, "thawed too early: not the dead-man"
    finally:
        for pid in pids_mentioning(str(tmp_path)):  # the job the dead harness left (its run dir is under tmp_path)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert not _stopped(etcd)
