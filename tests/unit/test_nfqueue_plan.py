"""The NFQUEUE packet holder's plan, record and draws (pure logic; the holder on a real queue is in
tests/integration/test_network_injectors.py and the injector contract suite)."""

from __future__ import annotations

import statistics

import pytest

from chaos.plugins.injector import Applied, InjectionError
from injectors.network import nfqueue
from injectors.network.iptables import ChainSpec
from injectors.network.nfq_holder import Delays

TARGET = ["-j", "NFQUEUE", "--queue-num", "4242", "--queue-bypass"]


def test_rules_send_the_peers_traffic_to_the_queue_with_bypass() -> None:
    assert nfqueue.queue_rules(["10.0.0.2"], None, 4242) == [["-d", "10.0.0.2", *TARGET]]
    assert nfqueue.queue_rules([], "eth0", 4242) == [["-o", "eth0", *TARGET]]
    by_port = nfqueue.queue_rules(["10.0.0.2"], None, 4242, [80, 443], "all")
    assert by_port == [
        ["-d", "10.0.0.2", "-p", proto, "-m", "multiport", "--dports", "80,443", *TARGET] for proto in ("tcp", "udp")
    ]
    with pytest.raises(InjectionError, match="peers or an interface"):
        nfqueue.queue_rules([], None, 4242)


def _state() -> nfqueue.HolderState:
    chain = ChainSpec("CHAOS-0123456789-out", "OUTPUT", [["-d", "10.0.0.2", *TARGET]])
    return nfqueue.HolderState(chain, "mlchaos:d#1", False, 4242, 100_000, 10_000, "normal", 25.0, 7, helper_pid=99)


def test_the_record_round_trips_and_a_foreign_chain_is_refused() -> None:
    state = _state()
    assert nfqueue.is_holder_state(state.to_json())
    assert nfqueue.HolderState.from_json(state.to_json()) == state
    forged = {**state.to_json(), "chains": [{"chain": "INPUT", "hook": "OUTPUT", "rules": []}]}
    with pytest.raises(InjectionError, match="not an mlchaos chain"):
        nfqueue.HolderState.from_json(forged)


def test_the_dead_mans_command_stops_the_holder_then_removes_the_chain() -> None:
    applied = Applied(op_id="d#1", fault="d", injector="delay", state=_state().to_json())
    argv = nfqueue.revert_command(applied)
    assert argv[:2] == ["sh", "-c"] and "mlchaos-stop-helper" in argv
    assert argv.index("mlchaos-netrevert") > argv.index("mlchaos-stop-helper")
    assert argv[-1] == "CHAOS-0123456789-out"


def test_draws_are_seeded_never_negative_and_centred_on_the_delay() -> None:
    assert {Delays(0.1, 0.0, "uniform", 0.0, 1).next() for _ in range(10)} == {0.1}
    uniform = [Delays(0.1, 0.02, "uniform", 0.0, 3).next() for _ in range(1)]
    draws = Delays(0.1, 0.02, "uniform", 0.0, 3)
    sample = [draws.next() for _ in range(2000)]
    assert all(0.08 <= d <= 0.12 for d in sample) and abs(statistics.mean(sample) - 0.1) < 0.002
    assert uniform[0] == sample[0]  # the same seed draws the same delays
    wide = Delays(0.005, 0.05, "normal", 50.0, 3)
    assert min(wide.next() for _ in range(2000)) >= 0.0


def test_reorder_sends_its_share_at_once_and_holds_the_rest() -> None:
    draws = Delays(0.02, 0.0, "uniform", 0.0, 5, reorder=25.0)
    sample = [draws.next() for _ in range(4000)]
    at_once = sample.count(0.0) / len(sample)
    assert 0.22 < at_once < 0.28 and set(sample) == {0.0, 0.02}
