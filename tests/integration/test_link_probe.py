"""The link probe against the REAL 3-host testbed: real ICMP echoes sent over SSH from each host's network
namespace, with the real ``drop_large_packets`` fault (iptables length match) on h2 towards h1 (the prober h1's
echoes die in h2's INPUT) and on h1 towards h3 (they die in the prober's own OUTPUT: sendto fails). The probe
must name exactly h1<->h2 and h1<->h3 as ``large_dropped`` (small echoes pass), find h2<->h3 fine, and report
nothing once the faults are healed."""

from __future__ import annotations

import uuid

import pytest

from chaos.cluster.inventory import Inventory
from chaos.cluster.ssh import SshTransport
from chaos.detect.link_probe import DETECT_LINK, RUNNER_LINK_PROBE, LinkProbe
from chaos.history.timeline import Event, History
from chaos.plugins.injector import FaultOp, InjectionContext
from injectors.network.faults import DropLargePacketsInjector, DropLargeParams

pytestmark = pytest.mark.slow


def _history(ranks: dict[int, str]) -> History:
    history = History.from_events(
        [Event(ts_ns=1 + r, kind="target.start", source="target", rank=r, data={"host": h}) for r, h in ranks.items()]
    )
    return history


def _probe(history: History, inventory: Inventory, transports: dict[str, SshTransport]) -> LinkProbe:
    return LinkProbe(
        history,
        transport_of=transports.__getitem__,
        address_of=lambda name: inventory.host(name).address,
        groups_of=lambda name: inventory.host(name).groups,
    )


def test_probe_names_the_large_packet_hole_and_nothing_else(
    testbed: Inventory, testbed_transports: dict[str, SshTransport]
) -> None:
    ranks = {0: "h1", 1: "h2", 2: "h3"}
    injector = DropLargePacketsInjector()
    applied = []
    try:
        for host, peer in (("h2", "host:h1"), ("h1", "host:h3")):
            ctx = InjectionContext(testbed_transports[host], extras={"host": host, "inventory": testbed})
            fault = FaultOp(
                op_id=f"lp-{uuid.uuid4().hex[:8]}",
                fault="f",
                injector="drop_large_packets",
                params=DropLargeParams(peers=[peer]),
            )
            injector.check(ctx, fault.params)
            applied.append((ctx, injector.prepare(ctx, fault)))
            injector.apply(*applied[-1])
        found = _probe(_history(ranks), testbed, testbed_transports).round()
    finally:
        for ctx, done in reversed(applied):
            injector.heal(ctx, done)
    verdicts = {(r.a.host, r.b.host): r.verdict for r in found.results}
    assert verdicts == {("h1", "h2"): "large_dropped", ("h1", "h3"): "large_dropped", ("h2", "h3"): "ok"}, found.results
    links = [e for e in found.events if e.kind == DETECT_LINK]
    assert [e.data["hosts"] for e in links] == [["h1", "h2"], ["h1", "h3"]]
    assert [e.data["ranks"] for e in links] == [[0, 1], [0, 2]]
    assert all(e.data["small_ok"] is True and e.data["large_ok"] is False for e in links)
    [summary] = [e for e in found.events if e.kind == RUNNER_LINK_PROBE]
    assert summary.data["pairs"] == 3 and summary.data["bad"] == 2 and summary.data["errors"] == []
    # All pairs at once, every echo at once: the round costs about one answer timeout, not pairs x echoes.
    assert isinstance(summary.data["probe_s"], float) and summary.data["probe_s"] < 15

    after = _probe(_history(ranks), testbed, testbed_transports).round()
    assert {r.verdict for r in after.results} == {"ok"}, after.results
    assert [e.kind for e in after.events] == [RUNNER_LINK_PROBE]
