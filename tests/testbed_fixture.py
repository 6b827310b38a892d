"""Pytest fixtures for tests that need real hosts: a 3-host testbed (network namespaces + sshd), session-wide.

Use it from a test module with a direct import (the tests folder is on sys.path)::

    from testbed_fixture import testbed, testbed_transports  # noqa: F401  (pytest finds fixtures by name)

``testbed`` yields the :class:`~chaos.cluster.inventory.Inventory` and tears the whole testbed down in
``finally``, even when ``up`` failed half way. It skips (with the reason) where a testbed cannot be built:
not root, no ``ip netns``, no sshd. ``testbed_transports`` gives one connected SshTransport per host for
one test and closes them after it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from chaos.cluster.inventory import Inventory
from chaos.cluster.ssh import SshTransport
from chaos.cluster.testbed import namespaces as tb

TESTBED_HOSTS = 3


@pytest.fixture(scope="session")
def testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Inventory]:
    reason = tb.unsupported_reason()
    if reason is not None:
        pytest.skip(reason)
    state = tmp_path_factory.mktemp("chaos-tb")
    try:
        yield tb.up(TESTBED_HOSTS, state)
    finally:
        tb.down(state)


@pytest.fixture
def testbed_transports(testbed: Inventory) -> Iterator[dict[str, SshTransport]]:
    transports = {host.name: SshTransport.for_host(testbed, host.name) for host in testbed.hosts}
    try:
        yield transports
    finally:
        for transport in transports.values():
            transport.close()
