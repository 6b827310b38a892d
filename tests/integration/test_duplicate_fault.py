"""``duplicate`` against real network namespaces: a veth pair, real datagrams, the kernel's TEE target."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from capabilities import requires

from chaos.cluster.netns import NetnsTransport
from chaos.plugins.injector import FaultOp, InjectionContext, InjectionError
from injectors.network.faults import DuplicateInjector, DuplicateParams

pytestmark = requires("root", "ip", "iptables")

RECEIVE = r"""
import collections, socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind((sys.argv[1], 9100)); s.settimeout(1.0)
print("ready", flush=True)
seen = collections.Counter()
try:
    while True:
        seen[s.recvfrom(100)[0]] += 1
except socket.timeout:
    pass
print(sum(seen.values()), len(seen), flush=True)
"""
SEND = r"""
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(int(sys.argv[2])):
    s.sendto(str(i).encode(), (sys.argv[1], 9100)); time.sleep(0.0002)
"""


@dataclass
class Pair:
    sender: str
    receiver: str
    receiver_address: str = "10.78.0.2"

    def count(self, datagrams: int) -> tuple[int, int]:
        """(datagrams received, distinct datagrams) of ``datagrams`` sent from sender to receiver."""
        listen = subprocess.Popen(
            ["ip", "netns", "exec", self.receiver, sys.executable, "-c", RECEIVE, self.receiver_address],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert listen.stdout is not None and listen.stdout.readline().strip() == "ready"
        subprocess.run(
            ["ip", "netns", "exec", self.sender, sys.executable, "-c", SEND, self.receiver_address, str(datagrams)],
            check=True,
        )
        received, distinct = (int(word) for word in listen.communicate(timeout=30)[0].split())
        return received, distinct


@pytest.fixture
def pair() -> Iterator[Pair]:
    tag = uuid.uuid4().hex[:6]
    sender, receiver, veth = f"chaos-dup-{tag}-a", f"chaos-dup-{tag}-b", f"cdup{tag}"
    setup = [
        ["ip", "netns", "add", sender],
        ["ip", "netns", "add", receiver],
        [
            "ip",
            "link",
            "add",
            f"{veth}a",
            "netns",
            sender,
            "type",
            "veth",
            "peer",
            "name",
            f"{veth}b",
            "netns",
            receiver,
        ],
        ["ip", "-n", sender, "addr", "add", "10.78.0.1/24", "dev", f"{veth}a"],
        ["ip", "-n", receiver, "addr", "add", "10.78.0.2/24", "dev", f"{veth}b"],
        ["ip", "-n", sender, "link", "set", f"{veth}a", "up"],
        ["ip", "-n", receiver, "link", "set", f"{veth}b", "up"],
    ]
    try:
        for argv in setup:
            subprocess.run(argv, check=True)
        yield Pair(sender, receiver)
    finally:
        for name in (sender, receiver):
            subprocess.run(["ip", "netns", "del", name], check=False)


def _op(probability: float, peers: list[str]) -> FaultOp:
    return FaultOp(
        op_id="dup#1",
        fault="dup",
        injector="duplicate",
        params=DuplicateParams(peers=peers, probability=probability),
        duration_s=10,
    )


def test_duplicate_sends_a_share_twice_and_heal_stops_it(pair: Pair) -> None:
    ctx, injector = InjectionContext(NetnsTransport(pair.sender)), DuplicateInjector()
    op = _op(0.3, [pair.receiver_address])
    injector.check(ctx, op.params)
    applied = injector.prepare(ctx, op)
    assert applied.description.startswith("duplicate 30% of packets")
    try:
        injector.apply(ctx, applied)
        received, distinct = pair.count(1000)
        assert distinct == 1000  # nothing lost ...
        assert 200 <= received - distinct <= 400  # ... and about 30% arrived twice
    finally:
        injector.heal(ctx, applied)
    assert "CHAOS" not in ctx.transport.run(["iptables-save"]).stdout
    assert pair.count(300) == (300, 300)  # healed: each once


def test_a_peer_without_a_route_is_refused_before_anything_is_applied(pair: Pair) -> None:
    ctx, injector = InjectionContext(NetnsTransport(pair.sender)), DuplicateInjector()
    with pytest.raises(InjectionError, match="no single next hop"):
        injector.prepare(ctx, _op(0.5, ["192.0.2.7"]))
