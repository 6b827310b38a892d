"""The Docker testbed: up (idempotent, repairing), status, down (leaves nothing of ours), and the CLI."""

from __future__ import annotations

import ipaddress
import sys
from pathlib import Path

import docker
import pytest
from typer.testing import CliRunner

from chaos.cli.commands import app
from chaos.cluster.base import TransportError
from chaos.cluster.docker import DockerTransport
from chaos.cluster.inventory import Inventory, load_inventory
from chaos.testbed import containers as dtb
from chaos.testbed.image import IMAGE, LABEL
from chaos.testbed.shared_mounts import mount_points

# Registered as a plugin (not imported), so every module shares ONE session testbed.


def _leftovers(client: docker.DockerClient, tag: str) -> list[str]:
    """Everything on the daemon that belongs to the Docker testbed tagged ``tag``."""
    prefix = f"{dtb.PREFIX}-{tag}"
    found = [f"container {c.name}" for c in client.containers.list(all=True) if (c.name or "").startswith(prefix)]
    found += [f"container {c.name}" for c in client.containers.list(all=True, filters={"label": f"{LABEL}={tag}"})]
    found += [f"network {n.name}" for n in client.networks.list() if (n.name or "").startswith(prefix)]
    found += [f"network {n.name}" for n in client.networks.list(filters={"label": f"{LABEL}={tag}"})]
    return found


def test_inventory_describes_the_containers(docker_testbed: Inventory, docker_state_dir: Path) -> None:
    layout = dtb.Layout.of(docker_state_dir)
    assert load_inventory(layout.inventory) == docker_testbed
    assert docker_testbed.names() == ["h1", "h2", "h3"]
    subnets = set()
    for index, host in enumerate(docker_testbed.hosts, start=1):
        assert host.transport == "docker" and host.container == layout.container(index)
        assert host.python == sys.executable and host.groups == ["testbed"]
        assert host.labels == {"testbed": layout.tag, "container": layout.container(index)}
        subnets.add(ipaddress.ip_network(f"{host.address}/24", strict=False))
    assert len(subnets) == 1 and str(subnets.pop()).startswith(dtb.SUBNET_PREFIX + ".")
    # The containers reach each other on that network, and the shares are the same folder everywhere.
    with DockerTransport.for_host(docker_testbed, "h1") as h1, DockerTransport.for_host(docker_testbed, "h2") as h2:
        probe = docker_state_dir / "shared-probe.txt"
        h1.run(["sh", "-c", f"hostname > {probe}"], check=True)
        assert probe.read_text() == "h1\n" and h2.run(["cat", str(probe)], check=True).stdout == "h1\n"
        probe.unlink()
        h3 = docker_testbed.host("h3").address
        code = f"import socket; socket.create_connection(({h3!r}, 9), 2)"
        refused = h2.run([h2.python, "-c", code], timeout=30)
        assert "ConnectionRefusedError" in refused.stderr  # an answer (RST) from h3, not a timeout


def test_up_is_idempotent_and_repairs(docker_testbed: Inventory, docker_state_dir: Path) -> None:
    client = docker.from_env()
    layout = dtb.Layout.of(docker_state_dir)
    try:
        ids = {c.name: c.id for c in client.containers.list(filters={"label": f"{LABEL}={layout.tag}"})}
        assert dtb.up(3, docker_state_dir) == docker_testbed
        assert {c.name: c.id for c in client.containers.list(filters={"label": f"{LABEL}={layout.tag}"})} == ids

        h3 = DockerTransport.for_host(docker_testbed, "h3")
        client.containers.get(layout.container(3)).stop(timeout=2)
        with pytest.raises(TransportError, match=r"not running \(exited"):
            h3.run(["true"])
        assert not dtb.status(docker_state_dir).healthy
        client.containers.get(layout.container(2)).remove(force=True)

        lines: list[str] = []
        assert dtb.up(3, docker_state_dir, log=lines.append) == docker_testbed
        assert any("started" in line and layout.container(3) in line for line in lines)
        assert any(layout.container(2) in line for line in lines)
        state = dtb.status(docker_state_dir)
        assert state.healthy and [h.state for h in state.hosts] == ["running"] * 3
        assert client.containers.get(layout.container(2)).id != ids[layout.container(2)]  # recreated
        assert h3.run(["hostname"], check=True).stdout.strip() == "h3"
        h2 = DockerTransport.for_host(docker_testbed, "h2")
        assert h2.run(["hostname"], check=True).stdout.strip() == "h2"  # found by name: the new container
        h2.close()
        h3.close()
    finally:
        dtb.up(3, docker_state_dir)  # leave the session's testbed whole for the other tests
        client.close()


def test_cli_status_up_down(docker_testbed: Inventory, docker_state_dir: Path) -> None:
    runner = CliRunner()
    shown = runner.invoke(app, ["testbed", "status", "--docker", "--state-dir", str(docker_state_dir)])
    assert shown.exit_code == 0, shown.output
    assert "h1" in shown.output and "running" in shown.output
    done = runner.invoke(app, ["testbed", "up", "--docker", "-n", "3", "--state-dir", str(docker_state_dir)])
    assert done.exit_code == 0, done.output
    assert done.stdout.strip().endswith("inventory.yaml")
    refused = runner.invoke(app, ["testbed", "up", "--share", "/tmp", "--state-dir", str(docker_state_dir)])
    assert refused.exit_code == 1


@pytest.mark.slow
def test_up_then_down_leaves_nothing(tmp_path: Path, docker_testbed: Inventory) -> None:
    state = tmp_path / "another-state"
    share = tmp_path / "share"
    layout = dtb.Layout.of(state)
    client = docker.from_env()
    try:
        inventory = dtb.up(2, state, shares=[share])
        assert share.is_dir() and len(inventory.hosts) == 2
        with DockerTransport(inventory.hosts[0]) as h1:
            h1.run(["touch", str(share / "from-h1")], check=True)
        assert (share / "from-h1").exists()  # read-write at the same path
        assert str(share) in mount_points()  # made a shared self-bind for the containers' rslave binds
        assert dtb.status(state).healthy
        assert _leftovers(client, layout.tag)
        dtb.down(state)
        assert _leftovers(client, layout.tag) == []
        assert str(share) not in mount_points()  # its self-bind went with it (other testbeds bind other dirs)
        assert not layout.inventory.exists() and not state.exists()
        image_users = client.containers.list(all=True, filters={"ancestor": IMAGE})
        image_kept = bool(client.images.list(name=IMAGE))
        # The session testbed still uses the image, so it stays; with no user it would be gone.
        assert image_kept == bool(image_users)
        assert dtb.down(state) == []  # already down: nothing to do, no error
        assert not dtb.status(state).built
    finally:
        dtb.down(state)
        client.close()


@pytest.mark.slow
def test_a_share_two_testbeds_bind_is_released_by_the_last_one_down(tmp_path: Path, docker_testbed: Inventory) -> None:
    # The testbed that made the self-bind goes down first, while the other still binds the share: it must stay;
    # the other then goes down and releases it (before, nobody did: every suite run left <checkout>/reports
    # bound onto itself).
    share = tmp_path / "share"
    first, second = tmp_path / "first", tmp_path / "second"
    try:
        dtb.up(1, first, shares=[share])
        dtb.up(1, second, shares=[share])
        assert str(share) in mount_points()
        dtb.down(first)
        assert str(share) in mount_points(), "released while another testbed's container still binds it"
        dtb.down(second)
        assert str(share) not in mount_points(), "the last testbed down left the self-bind"
    finally:
        dtb.down(first)
        dtb.down(second)
