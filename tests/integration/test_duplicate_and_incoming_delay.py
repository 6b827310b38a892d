"""``duplicate`` (the kernel's TEE target) and ``delay`` of incoming packets (the NFQUEUE holder on INPUT) against
real network namespaces: a veth pair, real datagrams."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from capabilities import requires
from netns_pair import Pair, veth_pair

from chaos.cluster.netns import NetnsTransport
from chaos.plugins.injector import FaultOp, InjectionContext, InjectionError
from injectors.network.faults import DelayInjector, DelayParams, DuplicateInjector, DuplicateParams

pytestmark = requires("root", "ip", "iptables")


@pytest.fixture
def pair() -> Iterator[Pair]:
    with veth_pair() as made:
        yield made


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


def test_delay_of_what_a_host_receives_holds_incoming_packets(pair: Pair) -> None:
    # On the RECEIVER, delay what the sender sends to it: tc cannot (it shapes only egress); the holder does.
    ctx, injector = InjectionContext(NetnsTransport(pair.receiver)), DelayInjector()
    op = FaultOp(
        op_id="in#1",
        fault="in",
        injector="delay",
        params=DelayParams(peers=["10.78.0.1"], delay=0.05, direction="in"),
        duration_s=20,
    )
    before = pair.rtt_ms()
    injector.check(ctx, op.params)
    applied = injector.prepare(ctx, op)
    assert "10.78.0.1 -> 10.78.0.2 (incoming; NFQUEUE packet holder" in applied.description
    try:
        injector.apply(ctx, applied)
        assert 45 <= pair.rtt_ms() - before <= 80
        assert "-A INPUT" in ctx.transport.run(["iptables-save"]).stdout
    finally:
        injector.heal(ctx, applied)
    assert "CHAOS" not in ctx.transport.run(["iptables-save"]).stdout
    assert pair.rtt_ms() < 20
