"""container_kill / stop / restart / pause / cpu against a real Docker daemon and real containers.

Every test creates its own uniquely named ``chaos-ctest-*`` containers from the local testbed image (no
registry) and removes them, by name, in ``finally``, so a container recreated under the same name by a test
goes too. Without a reachable daemon the daemon tests skip with the reason; the pure tests always run.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError
from support import ROOT

from chaos.cluster.inventory import Host
from chaos.cluster.local import LocalTransport
from chaos.plugins.injector import Applied, FaultOp, InjectionContext, InjectionError, Unsupported
from injectors.container import (
    INJECTORS,
    NOT_DOCKER,
    ContainerCpuInjector,
    ContainerCpuParams,
    ContainerKillInjector,
    ContainerKillParams,
    ContainerPauseInjector,
    ContainerPauseParams,
    ContainerRestartInjector,
    ContainerRestartParams,
    ContainerStopInjector,
    ContainerStopParams,
)

docker = pytest.importorskip("docker")

PID1 = ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 3600 & wait $!; done"]
PREFIX = "chaos-ctest-"
MakeContainer = Callable[..., Any]


def op(injector: str, params: BaseModel, duration_s: float | None = None) -> FaultOp:
    return FaultOp(
        op_id=f"op-{uuid.uuid4().hex[:8]}", fault="f", injector=injector, params=params, duration_s=duration_s
    )


def docker_ctx(container: str, url: str | None = None) -> InjectionContext:
    from chaos.cluster.docker import DockerTransport

    host = Host(name="c1", address="10.0.0.2", transport="docker", container=container, docker_url=url)
    return InjectionContext(transport=DockerTransport(host))


# -- without a daemon ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", INJECTORS, ids=lambda cls: cls.name)
def test_non_docker_transport_is_unsupported(cls: Any) -> None:
    ctx = InjectionContext(transport=LocalTransport())
    with pytest.raises(Unsupported, match="need a docker host"):
        cls().check(ctx, cls.Params.model_validate({"cpus": 0.5} if cls is ContainerCpuInjector else {}))
    assert NOT_DOCKER.startswith("container faults need a docker host (transport: docker")


def test_params_are_validated() -> None:
    assert ContainerKillParams().signal == "SIGKILL"
    assert ContainerKillParams.model_validate({"signal": "term"}).signal == "SIGTERM"
    assert ContainerKillParams.model_validate({"signal": 9}).signal == "SIGKILL"
    assert ContainerStopParams.model_validate({"timeout": "2s"}).timeout == 2.0
    for cls, data in [
        (ContainerKillParams, {"signal": "SIGNOPE"}),
        (ContainerKillParams, {"sig": "SIGKILL"}),
        (ContainerStopParams, {"timeout": "soon"}),
        (ContainerStopParams, {"timeout": -1}),
        (ContainerCpuParams, {"cpus": 0}),
        (ContainerCpuParams, {}),
        (ContainerPauseParams, {"for": "1s"}),
        (ContainerRestartParams, {"timeout": "1s", "x": 1}),
    ]:
        with pytest.raises(ValidationError):
            cls.model_validate(data)


@pytest.mark.parametrize(
    ("cls", "params"),
    [
        (ContainerStopInjector, ContainerStopParams()),
        (ContainerPauseInjector, ContainerPauseParams()),
        (ContainerCpuInjector, ContainerCpuParams(cpus=0.5)),
    ],
    ids=lambda value: getattr(value, "name", ""),
)
def test_faults_with_a_heal_need_a_duration(cls: Any, params: BaseModel) -> None:
    with pytest.raises(InjectionError, match="needs a duration"):
        cls().prepare(docker_ctx("chaos-ctest-nonexistent"), op(cls.name, params))


def test_revert_commands_run_docker_on_the_harness_machine() -> None:
    def applied(injector: str, url: str | None = None, **state: Any) -> Applied:
        return Applied(op_id="o", fault="f", injector=injector, state={"container": "web", "docker_url": url, **state})

    assert ContainerStopInjector().revert_command(applied("container_stop")) == ["docker", "start", "web"]
    assert ContainerPauseInjector().revert_command(applied("container_pause", "tcp://d:2375")) == [
        "docker",
        "-H",
        "tcp://d:2375",
        "unpause",
        "web",
    ]
    cpu = ContainerCpuInjector()
    assert cpu.revert_command(applied("container_cpu", previous_cpu_quota=0, fault_cpu_quota=20000)) == [
        "docker",
        "update",
        "--cpu-quota=-1",
        "web",
    ]
    assert cpu.revert_command(applied("container_cpu", previous_cpu_quota=50000, fault_cpu_quota=20000)) == [
        "docker",
        "update",
        "--cpu-quota=50000",
        "web",
    ]
    assert cpu.revert_command(applied("container_cpu", previous_nano_cpus=1500000000, fault_nano_cpus=1)) == [
        "docker",
        "update",
        "--cpus=1.5",
        "web",
    ]
    assert ContainerKillInjector().revert_command(applied("container_kill")) is None
    assert ContainerRestartInjector().revert_command(applied("container_restart")) is None
    assert all(cls.revert_on_harness for cls in INJECTORS)


# -- against the daemon --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    try:
        found = docker.from_env()
        found.ping()
    except Exception:
        started = subprocess.run(["bash", str(ROOT / "scripts/start-dockerd.sh")], capture_output=True, text=True)
        try:
            found = docker.from_env()
            found.ping()
        except Exception as exc:
            pytest.skip(f"no Docker daemon: {exc}; {started.stdout.strip()} {started.stderr.strip()}")
    from chaos.testbed.image import ensure_image

    ensure_image(found)
    try:
        yield found
    finally:
        found.close()


@pytest.fixture
def make_container(client: Any) -> Iterator[MakeContainer]:
    """``make_container(name=None, **run_kwargs)`` starts a container; every name made is removed at the end."""
    from chaos.testbed.image import IMAGE, python_binds

    names: list[str] = []

    def make(name: str | None = None, **kwargs: Any) -> Any:
        name = name or f"{PREFIX}{uuid.uuid4().hex[:10]}"
        names.append(name)
        return client.containers.run(IMAGE, PID1, name=name, detach=True, volumes=python_binds(), **kwargs)

    try:
        yield make
    finally:
        for name in dict.fromkeys(names):
            try:
                client.containers.get(name).remove(force=True)
            except docker.errors.NotFound:
                pass


def fresh(client: Any, name: str) -> Any:
    return client.containers.get(name)


def wait_status(client: Any, name: str, status: str, timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while (container := fresh(client, name)).status != status and time.monotonic() < deadline:
        time.sleep(0.05)
    assert container.status == status, f"{name} is {container.status}, expected {status}"
    return container


def new_container(make_container: MakeContainer) -> tuple[Any, InjectionContext]:
    """A fresh running container and the injection context that targets it."""
    container = make_container()
    return container, docker_ctx(container.name)


def healed_to_running(client: Any, injector: Any, ctx: InjectionContext, applied: Applied, name: str) -> None:
    """Heal ``applied``; the container ``name`` must be running afterwards."""
    injector.heal(ctx, applied)
    assert fresh(client, name).status == "running"


def fire(injector: Any, ctx: InjectionContext, params: BaseModel, duration_s: float | None = None) -> Applied:
    """The runner's order: check, prepare, (journal), apply."""
    injector.check(ctx, params)
    applied: Applied = injector.prepare(ctx, op(injector.name, params, duration_s))
    injector.apply(ctx, applied)
    return applied


@pytest.mark.parametrize("cls", INJECTORS, ids=lambda cls: cls.name)
def test_check_refuses_a_missing_container_by_name(client: Any, cls: Any) -> None:
    name = f"{PREFIX}missing-{uuid.uuid4().hex[:6]}"
    params = cls.Params.model_validate({"cpus": 0.5} if cls is ContainerCpuInjector else {})
    with pytest.raises(Unsupported, match=name):
        cls().check(docker_ctx(name), params)


def test_check_refuses_a_stopped_container(client: Any, make_container: MakeContainer) -> None:
    container = make_container()
    container.stop(timeout=1)
    with pytest.raises(Unsupported, match=container.name):
        ContainerPauseInjector().check(docker_ctx(container.name), ContainerPauseParams())


def test_kill_sends_the_signal_through_the_daemon(client: Any, make_container: MakeContainer) -> None:
    container, ctx = new_container(make_container)
    kill = ContainerKillInjector()
    applied = fire(kill, ctx, ContainerKillParams())
    assert applied.reversible is False and applied.state["signal"] == "SIGKILL"
    killed = wait_status(client, container.name, "exited")
    assert killed.attrs["State"]["ExitCode"] == 137  # 128 + SIGKILL: the kernel's kill, not a clean exit
    kill.heal(ctx, applied)  # nothing to undo, and no error
    assert fresh(client, container.name).status == "exited"
    with pytest.raises(InjectionError, match="exited"):
        kill.apply(ctx, applied)  # a container that is down is not silently "killed" again

    other = make_container()
    fire(kill, docker_ctx(other.name), ContainerKillParams(signal="SIGTERM"))  # PID 1 traps TERM: exit 0
    assert wait_status(client, other.name, "exited").attrs["State"]["ExitCode"] == 0


def test_stop_then_heal_starts_it_again(client: Any, make_container: MakeContainer) -> None:
    container, ctx = new_container(make_container)
    stop = ContainerStopInjector()
    applied = fire(stop, ctx, ContainerStopParams(timeout="2s"), duration_s=30)
    assert applied.state["timeout_s"] == 2
    assert fresh(client, container.name).status == "exited"
    healed_to_running(client, stop, ctx, applied, container.name)
    healed_to_running(client, stop, ctx, applied, container.name)  # idempotent

    # Someone (the orchestration under test) already started it before the heal: heal changes nothing.
    applied = fire(stop, ctx, ContainerStopParams(timeout=1), duration_s=30)
    fresh(client, container.name).start()
    healed_to_running(client, stop, ctx, applied, container.name)


def test_stop_heal_leaves_a_recreated_or_removed_container_alone(client: Any, make_container: MakeContainer) -> None:
    container, ctx = new_container(make_container)
    stop = ContainerStopInjector()
    applied = fire(stop, ctx, ContainerStopParams(timeout=1), duration_s=30)
    fresh(client, container.name).remove(force=True)
    stop.heal(ctx, applied)  # gone: nothing to start, no error
    recreated = make_container(container.name)
    stop.heal(ctx, applied)
    assert fresh(client, container.name).id == recreated.id and fresh(client, container.name).status == "running"


def test_stop_dead_man_revert_starts_it(client: Any, make_container: MakeContainer) -> None:
    container = make_container()
    stop = ContainerStopInjector()
    applied = fire(stop, docker_ctx(container.name), ContainerStopParams(timeout=1), duration_s=30)
    revert = stop.revert_command(applied)
    assert revert == ["docker", "start", container.name]
    subprocess.run(revert, check=True, capture_output=True, timeout=60)
    assert fresh(client, container.name).status == "running"


def test_restart_is_one_shot(client: Any, make_container: MakeContainer) -> None:
    container = make_container()
    before = fresh(client, container.name).attrs["State"]["StartedAt"]
    ctx = docker_ctx(container.name)
    restart = ContainerRestartInjector()
    applied = fire(restart, ctx, ContainerRestartParams(timeout=1))
    after = wait_status(client, container.name, "running")
    assert after.attrs["State"]["StartedAt"] != before and after.id == container.id
    assert applied.reversible is False
    healed_to_running(client, restart, ctx, applied, container.name)


def test_pause_then_heal_unpauses(client: Any, make_container: MakeContainer) -> None:
    container, ctx = new_container(make_container)
    pause = ContainerPauseInjector()
    applied = fire(pause, ctx, ContainerPauseParams(), duration_s=30)
    paused = fresh(client, container.name)
    assert paused.status == "paused" and paused.attrs["State"]["Paused"] is True
    assert pause.revert_command(applied) == ["docker", "unpause", container.name]
    healed_to_running(client, pause, ctx, applied, container.name)
    healed_to_running(client, pause, ctx, applied, container.name)  # idempotent: unpausing a running container is fine

    # The dead-man's revert, run as the harness machine would after a crash.
    applied = fire(pause, ctx, ContainerPauseParams(), duration_s=30)
    subprocess.run(pause.revert_command(applied) or [], check=True, capture_output=True, timeout=60)
    assert fresh(client, container.name).status == "running"
    pause.heal(ctx, applied)


def test_pause_heal_after_restart_or_recreate(client: Any, make_container: MakeContainer) -> None:
    container, ctx = new_container(make_container)
    pause = ContainerPauseInjector()
    applied = fire(pause, ctx, ContainerPauseParams(), duration_s=30)
    fresh(client, container.name).restart(timeout=1)  # a paused container restarted meanwhile
    healed_to_running(client, pause, ctx, applied, container.name)

    applied = fire(pause, ctx, ContainerPauseParams(), duration_s=30)
    fresh(client, container.name).remove(force=True)
    recreated = make_container(container.name)  # same name, new id
    pause.heal(ctx, applied)
    now = fresh(client, container.name)
    assert now.id == recreated.id and now.status == "running"


def host_config(client: Any, name: str) -> dict[str, int]:
    config = fresh(client, name).attrs["HostConfig"]
    return {key: config[key] for key in ("CpuQuota", "CpuPeriod", "NanoCpus")}


def cgroup_quota(container_id: str) -> int | None:
    """cgroup v1 cpu.cfs_quota_us of the container, when this machine exposes it (cgroupfs driver)."""
    for path in (f"/sys/fs/cgroup/cpu/docker/{container_id}/cpu.cfs_quota_us",):
        if os.path.exists(path):
            return int(Path(path).read_text())
    return None


def test_cpu_caps_and_heal_restores_unlimited(client: Any, make_container: MakeContainer) -> None:
    container, ctx = new_container(make_container)
    cpu = ContainerCpuInjector()
    applied = fire(cpu, ctx, ContainerCpuParams(cpus=0.2), duration_s=30)
    assert applied.state["previous_cpu_quota"] == 0 and applied.state["previous_nano_cpus"] == 0
    assert host_config(client, container.name)["CpuQuota"] == 20_000  # 0.2 x the default 100ms period
    assert cgroup_quota(container.id) in (None, 20_000)
    cpu.heal(ctx, applied)
    assert host_config(client, container.name)["CpuQuota"] == -1  # docker's "unlimited"; 0 cannot be written
    assert cgroup_quota(container.id) in (None, -1)
    cpu.heal(ctx, applied)  # idempotent
    assert host_config(client, container.name)["CpuQuota"] == -1


def test_cpu_restores_the_recorded_limits_after_a_restart(client: Any, make_container: MakeContainer) -> None:
    container = make_container(cpu_period=50_000, cpu_quota=100_000)  # two CPUs at a 50ms period
    ctx = docker_ctx(container.name)
    cpu = ContainerCpuInjector()
    applied = fire(cpu, ctx, ContainerCpuParams(cpus=0.5), duration_s=30)
    assert host_config(client, container.name) == {"CpuQuota": 25_000, "CpuPeriod": 50_000, "NanoCpus": 0}
    assert cpu.revert_command(applied) == ["docker", "update", "--cpu-quota=100000", container.name]
    fresh(client, container.name).restart(timeout=1)  # the cap survives a restart, and so does our heal
    cpu.heal(ctx, applied)
    assert host_config(client, container.name) == {"CpuQuota": 100_000, "CpuPeriod": 50_000, "NanoCpus": 0}


def test_cpu_on_a_nano_cpus_container_and_a_recreated_one(client: Any, make_container: MakeContainer) -> None:
    container = make_container(nano_cpus=1_500_000_000)  # docker run --cpus 1.5 (compose's `cpus:`)
    ctx = docker_ctx(container.name)
    cpu = ContainerCpuInjector()
    applied = fire(cpu, ctx, ContainerCpuParams(cpus=0.25), duration_s=30)
    assert host_config(client, container.name)["NanoCpus"] == 250_000_000
    revert = cpu.revert_command(applied)
    assert revert == ["docker", "update", "--cpus=1.5", container.name]
    subprocess.run(revert, check=True, capture_output=True, timeout=60)  # the dead-man's way
    assert host_config(client, container.name)["NanoCpus"] == 1_500_000_000
    cpu.heal(ctx, applied)  # the limit is no longer ours: kept
    assert host_config(client, container.name)["NanoCpus"] == 1_500_000_000

    applied = fire(cpu, ctx, ContainerCpuParams(cpus=0.25), duration_s=30)
    fresh(client, container.name).remove(force=True)
    make_container(container.name)  # recreated without any limit: heal must not invent one, nor fail
    cpu.heal(ctx, applied)
    assert host_config(client, container.name) == {"CpuQuota": 0, "CpuPeriod": 0, "NanoCpus": 0}


def test_apply_on_a_vanished_container_fails_clearly_and_heal_skips(client: Any, make_container: MakeContainer) -> None:
    container, ctx = new_container(make_container)
    pause = ContainerPauseInjector()
    applied = pause.prepare(ctx, op(pause.name, ContainerPauseParams(), 30))
    fresh(client, container.name).remove(force=True)
    with pytest.raises(InjectionError, match=f"container '{container.name}' on c1 does not exist"):
        pause.apply(ctx, applied)
    pause.heal(ctx, applied)

    other = make_container()
    other_ctx = docker_ctx(other.name)
    applied = pause.prepare(other_ctx, op(pause.name, ContainerPauseParams(), 30))
    fresh(client, other.name).pause()  # someone else's pause between prepare and apply
    with pytest.raises(InjectionError, match="is paused since prepare"):
        pause.apply(other_ctx, applied)
    pause.heal(other_ctx, applied)  # the runner heals a failed apply: it must not undo someone else's pause
    assert fresh(client, other.name).status == "paused"


def test_unreachable_daemon_is_unsupported() -> None:
    ctx = docker_ctx(f"{PREFIX}x", url="unix:///nonexistent/docker.sock")
    with pytest.raises(Unsupported):
        ContainerStopInjector().check(ctx, ContainerStopParams())


@pytest.mark.slow
def test_harness_side_dead_man_restarts_a_stopped_container(
    client: Any, make_container: MakeContainer, tmp_path: Path
) -> None:
    """The crash path: the dead-man armed on THIS machine (revert_on_harness) starts the container by itself."""
    from chaos.safety import deadman
    from chaos.safety.journal import Journal

    container, ctx = new_container(make_container)
    stop = ContainerStopInjector()
    applied = stop.prepare(ctx, op(stop.name, ContainerStopParams(timeout=1), duration_s=1))
    journal = Journal(tmp_path / "journal.jsonl")
    journal.intent(applied)
    revert = stop.revert_command(applied)
    assert revert is not None
    pid = deadman.arm(journal.path, applied.op_id, revert, 0.5)
    try:
        stop.apply(ctx, applied)
        journal.applied(applied.op_id, applied.state)  # ... and the harness "dies" here: no heal
        wait_status(client, container.name, "running")
        deadline = time.monotonic() + 15
        while journal.healed_by(applied.op_id) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert journal.healed_by(applied.op_id) == "deadman"
    finally:
        deadman.disarm(pid)
        journal.close()
