"""The journal state of every injector family: typed records with the JSON shape journals already hold.

A journal written before a change must still heal after it (``mlchaos cleanup`` and the dead-man read the
journals of dead runs), so each family's state dataclass must (1) round-trip through ``to_json``/``from_json``
and (2) parse a literal dict shaped exactly like what ``prepare``/``apply`` write. A renamed key fails (2).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from pydantic import JsonValue

from chaos.plugins.injector import Applied, InjectionError, state_int, state_number, state_text, state_texts
from injectors.container import ContainerCpuInjector, ContainerState, ContainerStopInjector
from injectors.network.faults import FilterState, FlapState, PartitionInjector
from injectors.network.iptables import ChainSpec
from injectors.network.tc import DelayInjector, ShapeState
from injectors.node import CpuThrottleInjector, Hierarchy, MemoryState, ThrottleState
from injectors.process.faults import KillState, SlowState, Targets
from injectors.storage.injector import StorageInjector, StorageState

CHAIN_IN, CHAIN_OUT = "CHAOS-0123456789-in", "CHAOS-0123456789-out"

# Literal journal states, as the code before the typed records wrote them (keys and value shapes).
TARGETS: dict[str, JsonValue] = {
    "pids": [4242, 4243],
    "start_times": [1000, 1001],
    "selector": "rank 0 (pids 4242, 4243)",
}
KILL: dict[str, JsonValue] = {**TARGETS, "signal": "SIGKILL"}
SLOW: dict[str, JsonValue] = {
    **TARGETS,
    "stopped_fraction": 0.5,
    "period_s": 1.0,
    "helper_pid": 5151,
    "helper_start_time": 2000,
}
PARTITION: dict[str, JsonValue] = {
    "chains": [
        {"chain": CHAIN_IN, "hook": "INPUT", "rules": [["-s", "10.0.0.2", "-j", "DROP"]]},
        {"chain": CHAIN_OUT, "hook": "OUTPUT", "rules": [["-d", "10.0.0.2", "-j", "DROP"]]},
    ],
    "comment": "mlchaos:op-1",
    "sudo": False,
    "backend": "nf_tables",
    "restore": True,
    "peers": ["10.0.0.2"],
}
FLAP: dict[str, JsonValue] = {**PARTITION, "period_s": 2.0, "down_fraction": 0.25, "helper_pid": 6161}
SHAPE: dict[str, JsonValue] = {
    "interface": "eth0",
    "handle": "1a2b:",
    "kind": "netem",
    "commands": [["tc", "qdisc", "add", "dev", "eth0", "root", "handle", "1a2b:", "netem", "delay", "50ms"]],
    "sudo": True,
}
THROTTLE: dict[str, JsonValue] = {
    **TARGETS,
    "version": 2,
    "mount": "/sys/fs/cgroup",
    "root": "/",
    "cgroup": "/sys/fs/cgroup/chaos-0123456789ab",
    "originals": {"4242": "/sys/fs/cgroup/user.slice", "4243": "/sys/fs/cgroup/user.slice"},
    "period_us": 100000,
    "quota_us": 25000,
}
MEMORY: dict[str, JsonValue] = {"megabytes": 256, "helper_pid": 7171}
STORAGE: dict[str, JsonValue] = {
    "path": "/data/ckpt",
    "fsname": "chaos-fuse:op-1-0123abcd",
    "control": "/run/mlchaos/fuse/op-1-0123abcd.json",
    "status": "/run/mlchaos/fuse/op-1-0123abcd.status.json",
    "log": "/run/mlchaos/fuse/op-1-0123abcd.log",
    "mode": "latency",
    "ops": ["read", "write"],
    "latency_s": 0.5,
    "probability": 1.0,
    "drain_s": 5.0,
}
STORAGE_IN_CONTAINER: dict[str, JsonValue] = {
    **STORAGE,
    "via": "docker-host",
    "container": "trainer-0",
    "container_path": "/ckpt",
    "helper_pid": 8181,
    "helper_start_time": 3000,
}
CONTAINER: dict[str, JsonValue] = {"container": "trainer-0", "container_id": "4f2a9c", "docker_url": None}
CONTAINER_KILL: dict[str, JsonValue] = {**CONTAINER, "signal": "SIGKILL"}
CONTAINER_STOP: dict[str, JsonValue] = {**CONTAINER, "docker_url": "tcp://10.0.0.5:2375", "timeout_s": 2}
CONTAINER_CPU_QUOTA: dict[str, JsonValue] = {
    **CONTAINER,
    "previous_cpu_quota": 0,
    "previous_cpu_period": 0,
    "previous_nano_cpus": 0,
    "cpus": 0.5,
    "fault_cpu_quota": 50000,
}
CONTAINER_CPU_NANO: dict[str, JsonValue] = {
    **CONTAINER,
    "previous_cpu_quota": 0,
    "previous_cpu_period": 0,
    "previous_nano_cpus": 2000000000,
    "cpus": 0.5,
    "fault_nano_cpus": 500000000,
}
CONTAINER_SKIPPED: dict[str, JsonValue] = {**CONTAINER_KILL, "skipped": True}

# (record class, literal state); each literal is exactly what to_json writes back.
RECORDS: list[tuple[Any, dict[str, JsonValue]]] = [
    (Targets, TARGETS),
    (KillState, KILL),
    (FilterState, PARTITION),
    (FlapState, FLAP),
    (ShapeState, SHAPE),
    (ThrottleState, THROTTLE),
    (MemoryState, MEMORY),
    (MemoryState, {"megabytes": 256}),
    (StorageState, STORAGE),
    (StorageState, STORAGE_IN_CONTAINER),
    (ContainerState, CONTAINER),
    (ContainerState, CONTAINER_KILL),
    (ContainerState, CONTAINER_STOP),
    (ContainerState, CONTAINER_CPU_QUOTA),
    (ContainerState, CONTAINER_CPU_NANO),
    (ContainerState, CONTAINER_SKIPPED),
]


@pytest.mark.parametrize(("record", "state"), RECORDS, ids=lambda value: getattr(value, "__name__", ""))
def test_literal_journal_state_round_trips_unchanged(record: Any, state: dict[str, JsonValue]) -> None:
    parsed = record.from_json(state)
    assert parsed.to_json() == state
    assert record.from_json(parsed.to_json()) == parsed


def test_slow_state_keeps_what_apply_added() -> None:
    # helper_start_time is written by apply beside helper_pid but only ever read by the dead-man's pid check.
    parsed = SlowState.from_json(SLOW)
    assert parsed.helper_pid == 5151 and parsed.targets.pids == (4242, 4243)
    assert {key: value for key, value in SLOW.items() if key != "helper_start_time"} == parsed.to_json()


def test_typed_fields_come_from_the_literal_keys() -> None:
    partition = FilterState.from_json(PARTITION)
    assert partition.chain_names == [CHAIN_IN, CHAIN_OUT] and partition.restore and not partition.sudo
    assert partition.chains[0] == ChainSpec(CHAIN_IN, "INPUT", [["-s", "10.0.0.2", "-j", "DROP"]])
    flap = FlapState.from_json(FLAP)
    assert (flap.period_s, flap.down_fraction, flap.helper_pid) == (2.0, 0.25, 6161)
    shape = ShapeState.from_json(SHAPE)
    assert (shape.interface, shape.handle, shape.kind, shape.sudo) == ("eth0", "1a2b:", "netem", True)
    throttle = ThrottleState.from_json(THROTTLE)
    assert throttle.hierarchy == Hierarchy(2, "/sys/fs/cgroup", "/") and throttle.quota_us == 25000
    storage = StorageState.from_json(STORAGE_IN_CONTAINER)
    assert storage.on_docker_host and storage.helper_pid == 8181 and storage.ops == ("read", "write")
    assert not StorageState.from_json(STORAGE).on_docker_host
    assert StorageState.from_json({k: v for k, v in STORAGE.items() if k != "drain_s"}).drain_s == 5.0


def test_apply_adds_the_helper_pid_under_the_old_key() -> None:
    assert (
        replace(FlapState.from_json(PARTITION | {"period_s": 2.0, "down_fraction": 0.25}), helper_pid=6161).to_json()
        == FLAP
    )
    assert replace(MemoryState(256), helper_pid=7171).to_json() == MEMORY


@pytest.mark.parametrize(
    ("record", "state"),
    [
        (FilterState, {**PARTITION, "chains": [{"chain": "INPUT", "hook": "INPUT", "rules": []}]}),  # not ours
        (ShapeState, {**SHAPE, "interface": "eth0; rm -rf /"}),
        (ShapeState, {**SHAPE, "commands": [["rm", "-rf", "/"]]}),
        (ThrottleState, {**THROTTLE, "cgroup": "/sys/fs/cgroup/user.slice"}),  # not a chaos-<hex> cgroup
        (ThrottleState, {**THROTTLE, "quota_us": "25000"}),
        (MemoryState, {}),
        (StorageState, {**STORAGE, "ops": "read"}),
        (KillState, {**TARGETS}),
        (ContainerState, {k: v for k, v in CONTAINER.items() if k != "container"}),
        (ContainerState, {**CONTAINER_CPU_QUOTA, "fault_cpu_quota": None}),
    ],
)
def test_malformed_records_raise_injection_error(record: Any, state: dict[str, JsonValue]) -> None:
    with pytest.raises(InjectionError):
        record.from_json(state)


def test_field_readers_name_the_key() -> None:
    state: dict[str, JsonValue] = {"n": 3, "x": 1, "s": "a", "l": ["a"], "b": True, "e": ""}
    assert (state_int(state, "n"), state_number(state, "x"), state_text(state, "s")) == (3, 1.0, "a")
    assert state_texts(state, "l") == ("a",)
    for reader, key in ((state_int, "b"), (state_number, "s"), (state_text, "e"), (state_texts, "s")):
        with pytest.raises(InjectionError, match=repr(key)):
            reader(state, key)


def _applied(injector: str, state: dict[str, JsonValue]) -> Applied:
    return Applied(op_id="op-1", fault="f", injector=injector, state=dict(state))


def test_revert_commands_from_literal_states() -> None:
    """The dead-man's argv for a pre-change journal: same shape as the code before the typed records built."""
    partition = PartitionInjector().revert_command(_applied("partition", PARTITION))
    assert partition is not None and partition[:2] == ["sh", "-c"] and partition[-2:] == [CHAIN_IN, CHAIN_OUT]
    delay = DelayInjector().revert_command(_applied("delay", SHAPE))
    assert delay is not None and delay[:4] == ["sudo", "-n", "sh", "-c"] and delay[-2:] == ["eth0", "1a2b:"]
    throttle = CpuThrottleInjector().revert_command(_applied("cpu_throttle", THROTTLE))
    assert throttle is not None and throttle[3:] == [
        "mlchaos-cpu-revert",
        "/sys/fs/cgroup/chaos-0123456789ab",
        "cpu.max",
        "max",
        "/sys/fs/cgroup/user.slice",
        "/sys/fs/cgroup",
        "4242=/sys/fs/cgroup/user.slice",
        "4243=/sys/fs/cgroup/user.slice",
    ]
    storage = StorageInjector().revert_command(_applied("storage", STORAGE))
    assert storage is not None and "/data/ckpt" in storage
    assert StorageInjector.revert_on_harness(_applied("storage", STORAGE_IN_CONTAINER))
    stop = ContainerStopInjector().revert_command(_applied("container_stop", CONTAINER_STOP))
    assert stop == ["docker", "-H", "tcp://10.0.0.5:2375", "start", "trainer-0"]
    quota = ContainerCpuInjector().revert_command(_applied("container_cpu", CONTAINER_CPU_QUOTA))
    assert quota == ["docker", "update", "--cpu-quota=-1", "trainer-0"]
    nano = ContainerCpuInjector().revert_command(_applied("container_cpu", CONTAINER_CPU_NANO))
    assert nano == ["docker", "update", "--cpus=2", "trainer-0"]
    assert ContainerState.from_json(CONTAINER_SKIPPED).skipped
