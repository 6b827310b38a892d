"""DockerTransport against real containers of a Docker testbed (skipped where no Docker daemon can run)."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from chaos.cluster.base import TransportError, host_python
from chaos.cluster.docker import DockerTransport
from chaos.cluster.inventory import Host, Inventory
from chaos.testbed import containers as dtb

# Registered as a plugin (not imported), so every module shares ONE session testbed.


def _gone(transport: DockerTransport, pid: int, within: float = 10.0) -> bool:
    """Whether ``pid`` stops existing in the container within ``within`` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not transport.run(["kill", "-0", str(pid)], timeout=10).ok:
            return True
        time.sleep(0.1)
    return False


def test_run_captures_output_and_exit_code(docker_transports: dict[str, DockerTransport]) -> None:
    h1 = docker_transports["h1"]
    done = h1.run(["sh", "-c", 'echo "out $0"; echo err >&2; exit 3', "a b; $(x)"])
    assert (done.returncode, done.stdout, done.stderr) == (3, "out a b; $(x)\n", "err\n")
    assert h1.run(["hostname"], check=True).stdout.strip() == "h1"
    assert h1.run(["no-such-binary-here"]).returncode == 127
    with pytest.raises(TransportError, match="exited 1 on h1"):
        h1.run(["false"], check=True)
    assert host_python(h1) == sys.executable


def test_run_timeout_kills_the_command(docker_transports: dict[str, DockerTransport]) -> None:
    h1 = docker_transports["h1"]
    marker = f"{uuid.uuid4().int % 10**6 + 10**6}"
    started = time.monotonic()
    with pytest.raises(TransportError, match="timed out"):
        h1.run(["sleep", marker], timeout=1)
    assert time.monotonic() - started < 10
    assert marker not in h1.run(["ps", "-eo", "args"]).stdout  # killed, not left behind


def test_spawn_streams_lines_reports_pid_and_takes_signals(docker_transports: dict[str, DockerTransport]) -> None:
    h2 = docker_transports["h2"]
    process = h2.spawn(
        ["sh", "-c", 'echo "pid=$$ foo=$FOO cwd=$(pwd)"; echo to-stderr >&2; echo ready; exec sleep 60'],
        env={"FOO": "bar baz"},
        cwd=Path("/tmp"),
    )
    assert process.stdout is not None
    lines = [process.stdout.readline().decode().strip() for _ in range(3)]
    assert lines == [f"pid={process.pid} foo=bar baz cwd=/tmp", "to-stderr", "ready"]
    assert process.poll() is None
    process.send_signal(signal.SIGTERM)
    assert process.wait(10) == -signal.SIGTERM
    assert process.stdout.read() == b""
    process.send_signal(signal.SIGKILL)  # already exited: a no-op, not an error


def test_spawn_env_is_only_what_is_given(docker_transports: dict[str, DockerTransport]) -> None:
    process = docker_transports["h2"].spawn(["env"], env={"ONLY_THIS": "1"})
    assert process.wait(10) == 0
    assert process.stdout is not None
    names = {line.split(b"=", 1)[0].decode() for line in process.stdout.read().splitlines()}
    assert "ONLY_THIS" in names
    assert "MLCHAOS_STATE_DIR" not in names and "VIRTUAL_ENV" not in names  # the harness's environ stays home
    with pytest.raises(subprocess.TimeoutExpired):
        docker_transports["h2"].spawn(["sleep", "5"]).wait(0.2)


def test_kill_with_parent_fires_when_the_transport_goes_away(docker_testbed: Inventory) -> None:
    watcher = DockerTransport.for_host(docker_testbed, "h3")
    other = DockerTransport.for_host(docker_testbed, "h3")
    try:
        finished = watcher.spawn(["true"], kill_with_parent=signal.SIGKILL)
        assert finished.wait(10) == 0  # a normal exit: the watcher leaves quietly
        process = watcher.spawn(["sleep", "60"], kill_with_parent=signal.SIGTERM)
        time.sleep(0.3)
        assert process.poll() is None  # alive while the harness is
        watcher.close()  # abrupt: no "done" line, like a harness that vanished
        assert _gone(other, process.pid), "kill_with_parent did not fire"
    finally:
        watcher.close()
        other.close()


@pytest.mark.slow
def test_kill_with_parent_fires_when_the_harness_is_sigkilled(
    docker_testbed: Inventory, docker_state_dir: Path, docker_transports: dict[str, DockerTransport]
) -> None:
    script = (
        "import os, signal, sys\n"
        "from chaos.cluster.docker import DockerTransport\n"
        "from chaos.cluster.inventory import load_inventory\n"
        "t = DockerTransport.for_host(load_inventory(sys.argv[1]), 'h3')\n"
        "p = t.spawn(['sleep', '120'], kill_with_parent=signal.SIGTERM)\n"
        "print(p.pid, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    inventory = dtb.Layout.of(docker_state_dir).inventory
    done = subprocess.run([sys.executable, "-c", script, str(inventory)], capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert _gone(docker_transports["h3"], int(done.stdout.strip())), "the orphaned process survived its harness"


def test_put_is_atomic_and_complete(docker_transports: dict[str, DockerTransport], tmp_path: Path) -> None:
    h1 = docker_transports["h1"]
    folder = f"/root/put-{uuid.uuid4().hex[:8]}"  # container-private (not a shared folder)
    h1.run(["mkdir", "-p", folder], check=True)
    path = f"{folder}/data.bin"
    h1.put(b"old", path)
    before = h1.run(["stat", "-c", "%i", path], check=True).stdout
    payload = os.urandom(1 << 20)
    h1.put(payload, path)
    # A new inode: the file was replaced by a rename, never rewritten in place (a reader sees old or new).
    assert h1.run(["stat", "-c", "%i", path], check=True).stdout != before
    assert h1.run(["sha256sum", path], check=True).stdout.split()[0] == hashlib.sha256(payload).hexdigest()
    assert h1.run(["ls", "-A", folder], check=True).stdout.split() == ["data.bin"]  # no temporary left
    assert not Path(path).exists()  # it landed in the container, not here
    with pytest.raises(TransportError, match="does not exist"):
        h1.put(b"x", f"{folder}/missing/data.bin")
    h1.run(["rm", "-rf", folder])


def test_missing_container_is_named_with_a_suggestion(docker_testbed: Inventory) -> None:
    real = docker_testbed.host("h1").container
    assert real is not None
    ghost = Host(name="ghost", address="10.0.0.1", transport="docker", container=real + "x")
    with DockerTransport(ghost) as transport, pytest.raises(TransportError) as info:
        transport.run(["true"])
    assert f"{real}x" in str(info.value) and f"did you mean {real!r}" in str(info.value)


def test_unreachable_daemon_says_where_and_how_to_start_one() -> None:
    host = Host(name="far", address="10.0.0.1", transport="docker", docker_url="unix:///nonexistent/docker.sock")
    with DockerTransport(host) as transport, pytest.raises(TransportError) as info:
        transport.run(["true"])
    assert "unix:///nonexistent/docker.sock" in str(info.value) and "start-dockerd.sh" in str(info.value)


def test_follows_a_restarted_container(
    docker_testbed: Inventory, docker_transports: dict[str, DockerTransport]
) -> None:
    h2 = docker_transports["h2"]
    boot = h2.run(["cat", "/proc/1/stat"], check=True).stdout.split()[21]
    h2.container().restart(timeout=2)  # `docker restart`: a new PID 1 and network namespace, same name
    assert h2.run(["cat", "/proc/1/stat"], check=True).stdout.split()[21] != boot
    # (the kernel may hand the new namespace the old one's inode number: compare with inside, not before)
    assert h2.run(["readlink", "/proc/1/ns/net"], check=True).stdout.strip() == f"net:[{h2.netns_inode()}]"
    assert h2.run(["hostname"], check=True).stdout.strip() == "h2"


def test_netns_is_the_containers_own(docker_transports: dict[str, DockerTransport]) -> None:
    h1, h2 = docker_transports["h1"], docker_transports["h2"]
    inode = h1.netns_inode()
    assert inode is not None and inode != os.stat("/proc/self/ns/net").st_ino
    assert inode != h2.netns_inode()
    inside = h1.run(["readlink", "/proc/1/ns/net"], check=True).stdout.strip()
    assert inside == f"net:[{inode}]"


def test_iptables_inside_is_invisible_on_the_host(docker_transports: dict[str, DockerTransport]) -> None:
    h1 = docker_transports["h1"]
    chain = f"CHAOS-T{uuid.uuid4().hex[:8]}"
    h1.run(["iptables", "-w", "5", "-N", chain], check=True)
    try:
        assert f"-N {chain}" in h1.run(["iptables", "-S"], check=True).stdout
        assert f"-N {chain}" not in docker_transports["h2"].run(["iptables", "-S"], check=True).stdout
        if shutil.which("iptables") is not None and os.geteuid() == 0:
            root = subprocess.run(["iptables", "-S"], capture_output=True, text=True, check=True).stdout
            assert chain not in root
    finally:
        h1.run(["iptables", "-w", "5", "-X", chain])
    assert chain not in h1.run(["iptables", "-S"], check=True).stdout


def test_clock_offset_is_near_zero_on_one_machine(docker_transports: dict[str, DockerTransport]) -> None:
    estimate = docker_transports["h3"].clock_estimate(samples=5)
    assert abs(estimate.offset_s) < 0.05 and estimate.rtt_s < 1.0
    assert abs(docker_transports["h3"].clock_offset()) < 0.05


def test_container_selected_by_label_and_selector_syntax(docker_testbed: Inventory) -> None:
    from chaos.cluster.docker import selector_filters
    from chaos.testbed.containers import HOST_LABEL, LABEL

    assert selector_filters("web-1") is None
    assert selector_filters("service:shop/web") == ["com.docker.compose.service=web", "com.docker.compose.project=shop"]
    h2 = docker_testbed.host("h2")
    tag = h2.labels["testbed"]
    by_label = Host(name="x2", address=h2.address, transport="docker", container=f"label:{LABEL}={tag},{HOST_LABEL}=h2")
    with DockerTransport(by_label) as transport:
        assert transport.run(["hostname"], timeout=30).stdout.strip() == "h2"
        assert transport.container_name == h2.container
    every = Host(name="x", address=h2.address, transport="docker", container=f"label:{LABEL}={tag}")
    with DockerTransport(every) as transport, pytest.raises(TransportError, match="must match exactly one"):
        transport.container()


def test_execs_started_at_once_before_the_daemon_is_known_all_run(
    docker_testbed: Inventory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Six first execs at once, while nobody knows whether this daemon grants privileged execs: each one that the
    runtime refused for its capabilities is retried (it never ran), none comes back as the command's own exit."""
    from concurrent.futures import ThreadPoolExecutor

    from chaos.cluster import docker as docker_module

    monkeypatch.setattr(docker_module, "_PRIVILEGED", {})  # the daemon unknown again, as in a fresh harness
    transports = [DockerTransport.for_host(docker_testbed, "h2") for _ in range(6)]
    try:
        with ThreadPoolExecutor(max_workers=6) as pool:
            done = list(pool.map(lambda t: t.run(["sh", "-c", "echo ran"], timeout=30), transports))
    finally:
        for transport in transports:
            transport.close()
    assert [(d.returncode, d.stdout.strip()) for d in done] == [(0, "ran")] * 6, [d.stdout[:120] for d in done]
