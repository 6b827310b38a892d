"""Containers as hosts, end to end, against a real Docker daemon: the kill-rank and checkpoint-storage-stall
scenario files run unchanged with a docker inventory (a multi-node torchrun job across the three containers;
the storage layer goes on the docker host over the bind mount's source); a container restarted in the middle of
a partition is still healed, with the cut checked by real connects; a scenario naming a container that does not
exist is refused before anything is applied; the harness SIGKILLed mid-fault on a container (a duration-less
partition, a freeze of a process there, the container paused) leaves nothing past its run's deadline.

partition-node as shipped runs on the namespace testbed (test_e2e_multinode): what it adds here, a partition in
a container's own network stack, is the restart test's; a torchrun job across all three containers is
checkpoint-storage-stall's. kill-rank reads its golden run from the suite's shared report root, where
test_e2e_multinode's kill-rank on the same host computes it too (one of the two runs it).
"""

from __future__ import annotations

import random
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import docker
import pytest
from support import (
    ROOT,
    cut_off,
    read_jsonl,
    reported_run_dir,
    run_scenario_file,
    scenario_yaml,
    ticker,
    write_inventory,
)

from chaos.cluster.docker import DockerTransport
from chaos.cluster.inventory import Host, Inventory
from chaos.history.timeline import FAULT_APPLIED, FAULT_HEALED
from chaos.run.orchestrator import RunOptions, execute
from chaos.run.result import EXIT_INVALID, EXIT_PASS
from chaos.spec.scenario import parse_scenario

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("name", "extra"),
    [("kill-rank", ["--nodes", "host:h1"]), ("checkpoint-storage-stall", [])],
    ids=["kill-rank", "checkpoint-storage-stall"],
)
def test_scenario_file_runs_unchanged_on_containers(
    name: str, extra: list[str], docker_testbed: Inventory, tmp_path: Path, e2e_report_root: Path
) -> None:
    inventory_file = write_inventory(docker_testbed, tmp_path)
    # kill-rank: a folder of the suite's report root that test_e2e_multinode's kill-rank shares (one golden
    # run for both), apart from the local kill-rank runs other tests find by name there
    reports = e2e_report_root / "on-hosts" if name == "kill-rank" else tmp_path / "reports"
    done = run_scenario_file(name, "--inventory", inventory_file, "--report-dir", reports, *extra)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    run_dir = reported_run_dir(done)
    history = read_jsonl(run_dir / "history.jsonl")
    hosts = {e["data"]["host"] for e in history if e["kind"] == "target.start"}
    assert hosts == ({"h1"} if extra else {"h1", "h2", "h3"})
    [applied] = [e for e in history if e["kind"] == "fault.applied"]
    assert applied["data"]["host"] in hosts
    if name == "checkpoint-storage-stall":  # the FUSE layer went on the docker host, over the bind's source
        assert f"= {docker_testbed.host('h1').container}:" in applied["data"]["description"]
        assert str(run_dir) not in Path("/proc/mounts").read_text()  # and it is gone


def _partition(duration: float, max_duration: float) -> str:
    """h2 cut off from the others for ``duration`` s while a job ticks on h1 (its step regex is kept as it was
    written: it asks for a literal backslash, so no line counts as a step and the safety limits stand alone)."""
    return scenario_yaml(
        "docker-partition-restart",
        3,
        ticker(400, step=r"^tick (?P<step>\\d+)"),
        faults=[cut_off("h2", after="1s", duration=duration)],
        checks=[],
        safety={"heal_grace": "2s", "max_duration": f"{max_duration}s", "no_progress_timeout": "30s"},
    )


def _has_our_rules(transport: DockerTransport) -> bool:
    done = transport.run(["iptables-save"], timeout=30)
    return "CHAOS-" in done.stdout or "mlchaos:" in done.stdout


def _reachable(source: DockerTransport, address: str) -> bool:
    """A TCP connect from ``source`` to a closed port: refused at once = reachable; a timeout = cut off."""
    probe = (
        "import socket, sys\n"
        "try:\n    socket.create_connection((sys.argv[1], 9), timeout=2)\n"
        "except ConnectionRefusedError:\n    print('reachable')\n"
        "except OSError as e:\n    print('cut', e)\n"
    )
    return transport_output(source, [sys.executable, "-c", probe, address]).startswith("reachable")


def transport_output(transport: DockerTransport, argv: list[str]) -> str:
    return transport.run(argv, timeout=30).stdout.strip()


def test_container_restarted_mid_partition_is_still_healed(docker_testbed: Inventory, tmp_path: Path) -> None:
    h1 = DockerTransport.for_host(docker_testbed, "h1")
    h2 = DockerTransport.for_host(docker_testbed, "h2")
    inventory_file = write_inventory(docker_testbed, tmp_path)
    address = docker_testbed.host("h2").address
    scenario = parse_scenario(_partition(duration=12, max_duration=25))
    restarted: list[str] = []

    def restart_h2_mid_fault() -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if _has_our_rules(h2):
                    assert not _reachable(h1, address)  # the partition is really in place
                    docker.from_env().containers.get(docker_testbed.host("h2").container or "").restart(timeout=1)
                    restarted.append("yes")
                    return
            except Exception as exc:  # noqa: BLE001 - reported by the assertion below
                restarted.append(f"error: {exc}")
                return
            time.sleep(0.2)

    helper = threading.Thread(target=restart_h2_mid_fault)
    helper.start()
    try:
        result = execute(scenario, RunOptions(report_root=tmp_path, inventory=inventory_file))
    finally:
        helper.join(timeout=30)
        h1.close()
    assert restarted == ["yes"]
    assert result.exit_code == EXIT_PASS, (result.error, result.ended_by)
    assert len(result.history.of(FAULT_APPLIED)) == 1 and len(result.history.of(FAULT_HEALED)) == 1
    h2 = DockerTransport.for_host(docker_testbed, "h2")  # follows the restarted container by name
    try:
        assert not _has_our_rules(h2)
    finally:
        h2.close()
    h1 = DockerTransport.for_host(docker_testbed, "h1")
    try:
        assert _reachable(h1, address)
    finally:
        h1.close()


def test_missing_container_is_refused_before_any_fault(docker_testbed: Inventory, tmp_path: Path) -> None:
    ghost = Host(name="h4", address="10.214.0.99", transport="docker", container="chaos-no-such-container")
    inventory = docker_testbed.model_copy(update={"hosts": [*docker_testbed.hosts, ghost]})
    inventory_file = write_inventory(inventory, tmp_path)
    text = _partition(duration=3, max_duration=20).replace('"host": "h2"', '"host": "h4"')
    result = execute(parse_scenario(text), RunOptions(report_root=tmp_path, inventory=inventory_file))
    assert result.exit_code == EXIT_INVALID
    assert "chaos-no-such-container" in result.error, result.error
    assert not result.history.of(FAULT_APPLIED)
    assert not result.history.of("runner.target_started")


def test_a_killed_harness_leaves_nothing_on_a_container_past_its_runs_deadline(
    docker_testbed: Inventory, tmp_path: Path
) -> None:
    """Three trials of ``scripts/kill_trials.py`` at once: on container h2 a partition without a duration (the job
    on h2 too) and a freeze of a process there (the job on h1), and h3 paused through the Docker API. The harness
    is SIGKILLed at a seeded moment; each job dies with it; h2's own switch heals by the run's deadline + grace
    and ``mlchaos cleanup`` finds that heal and journals it as the dead-man's; h3 is unpaused by the dead-man on
    this machine (the one that reaches the Docker API)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from kill_trials import run_remote_trial

    inventory_file = write_inventory(docker_testbed, tmp_path)
    plan = [("partition", 1, "h2"), ("freeze", 0, "h2"), ("container_pause", 0, "h3")]
    with ThreadPoolExecutor(max_workers=len(plan)) as pool:
        trials = list(
            pool.map(
                lambda item: run_remote_trial(
                    item[0], item[1], random.Random(f"suite-docker-{item[0]}"), inventory_file, item[2]
                ),
                plan,
            )
        )
    assert [t.line() for t in trials if t.left] == []
    assert [t.healed_by for t in trials] == ["deadman"] * 3, [t.line() for t in trials]
    assert trials[0].durationless
