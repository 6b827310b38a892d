"""Pytest fixtures for tests that need real containers: a 3-host Docker testbed, session-wide.

Use it from a test module with a direct import (the tests folder is on sys.path)::

    from docker_fixture import docker_testbed, docker_transports  # noqa: F401  (pytest finds fixtures by name)

``docker_testbed`` yields the :class:`~chaos.cluster.inventory.Inventory` (hosts h1..h3, ``transport: docker``)
and tears the whole testbed down in ``finally``, even when ``up`` failed half way. It skips, with the reason,
where no Docker daemon can run (``bash scripts/start-dockerd.sh`` fails: not root, no dockerd, ...).
``docker_transports`` gives one DockerTransport per host for one test and closes them after it.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaos.cluster.docker import DockerTransport
from chaos.cluster.inventory import Inventory
from chaos.cluster.testbed import containers as dtb

DOCKER_HOSTS = 3
_START = Path(__file__).resolve().parents[1] / "scripts" / "start-dockerd.sh"


def docker_unavailable() -> str | None:
    """Why no Docker daemon can be used here (the start script's own words), or None when one answers."""
    try:
        done = subprocess.run(["bash", str(_START)], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot run {_START.name}: {exc}"
    if done.returncode != 0:
        return f"no Docker daemon: {(done.stdout + done.stderr).strip() or f'{_START.name} exited {done.returncode}'}"
    return None


@pytest.fixture(scope="session")
def docker_state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("chaos-dtb")


@pytest.fixture(scope="session")
def docker_testbed(docker_state_dir: Path) -> Iterator[Inventory]:
    reason = docker_unavailable()
    if reason is not None:
        pytest.skip(reason)
    try:
        yield dtb.up(DOCKER_HOSTS, docker_state_dir)
    finally:
        dtb.down(docker_state_dir)


@pytest.fixture
def docker_transports(docker_testbed: Inventory) -> Iterator[dict[str, DockerTransport]]:
    transports = {host.name: DockerTransport.for_host(docker_testbed, host.name) for host in docker_testbed.hosts}
    try:
        yield transports
    finally:
        for transport in transports.values():
            transport.close()
