"""The link probe's pure parts (pair selection, verdicts, parsing, once-per-hang) and the link checks on
hand-made histories; the real probe against real namespaces is tests/integration/test_link_probe.py."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from link_histories import FAULT, LinkRun, wrong_pair

from chaos.checks.link import LinkNamedParams, Side, StalledParams, hits, link_named, peer_matches, stalled_during
from chaos.cluster.base import Completed, TransportError
from chaos.detect.link_probe import (
    DETECT_LINK,
    LARGE_BYTES,
    RUNNER_LINK_PROBE,
    SMALL_BYTES,
    Endpoint,
    LinkProbe,
    Outcome,
    endpoints,
    pairs,
    parse_probe,
    probe_argv,
    rank_hosts,
    verdict,
)
from chaos.history.timeline import Event, History


def start(rank: int, host: str | None, ts: int = 1) -> Event:
    return Event(ts_ns=ts, kind="target.start", source="target", rank=rank, data={} if host is None else {"host": host})


# -- pair selection ---------------------------------------------------------------------------------------------


def test_rank_hosts_takes_each_ranks_latest_start() -> None:
    events = [start(0, "h1"), start(1, "h2", 2), start(1, "h3", 5), start(2, None, 3)]
    events.append(Event(ts_ns=9, kind="target.step", source="target", rank=0, data={"host": "h9"}))
    assert rank_hosts(events) == {0: "h1", 1: "h3", 2: "local"}


def test_pairs_are_distinct_hosts_lowest_rank_first() -> None:
    found, problems = endpoints({0: "h1", 1: "h1", 2: "h2", 3: "h3"}, {"h1": "a1", "h2": "a2", "h3": "a3"})
    assert problems == [] and [e.ranks for e in found] == [(0, 1), (2,), (3,)]
    assert [(a.host, b.host) for a, b in pairs(found)] == [("h1", "h2"), ("h1", "h3"), ("h2", "h3")]
    assert [(a.rank, b.rank) for a, b in pairs(found)] == [(0, 2), (0, 3), (2, 3)]


def test_no_pair_on_one_host_and_duplicates_collapse() -> None:
    one, _ = endpoints({0: "h1", 1: "h1"}, {"h1": "a1"})
    assert pairs(one) == []  # ranks on one host talk through loopback: no link to probe
    twice = [Endpoint("h1", "a1", (3,)), Endpoint("h1", "a1", (0,)), Endpoint("h2", "a2", (1,))]
    [(a, b)] = pairs(twice)
    assert (a.host, a.rank, b.host) == ("h1", 0, "h2")


def test_a_host_without_address_is_named_not_dropped() -> None:
    found, problems = endpoints({0: "h1", 1: "local"}, {"h1": "a1"})
    assert [e.host for e in found] == ["h1"]
    assert problems == ["host local (ranks 1) has no address to probe"]


# -- verdicts and parsing ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("small", "large", "expected"),
    [
        (2, 0, "large_dropped"),
        (1, 0, "large_dropped"),
        (2, 2, "ok"),
        (0, 0, "down"),
        (0, 1, "flaky"),  # only large answered: loss, not a size limit; no detect.link
    ],
)
def test_verdict_from_echo_counts(small: int, large: int, expected: str) -> None:
    assert verdict(Outcome(SMALL_BYTES, 2, small), Outcome(LARGE_BYTES, 2, large)) == expected


def test_missing_or_unsent_rounds_prove_nothing() -> None:
    assert verdict(None, Outcome(LARGE_BYTES, 2, 0)) == "error"
    assert verdict(Outcome(SMALL_BYTES, 2, 2), None) == "error"
    assert verdict(Outcome(SMALL_BYTES, 0, 0), Outcome(LARGE_BYTES, 2, 0)) == "error"


def test_parse_probe_reads_json_and_rejects_garbage() -> None:
    rows = [
        {"size": 56, "sent": 2, "received": 2, "rtt_ms": 0.1, "error": None},
        {"size": 1400, "sent": 2, "received": 0},
    ]
    small, large = parse_probe("noise\n" + json.dumps(rows), (SMALL_BYTES, LARGE_BYTES))
    assert small is not None and small.ok and large is not None and not large.ok
    assert parse_probe("Traceback ...", (SMALL_BYTES, LARGE_BYTES)) == (None, None)
    assert parse_probe(json.dumps([{"size": "x"}]), (SMALL_BYTES,)) == (None,)
    assert parse_probe("", (SMALL_BYTES,)) == (None,)


# -- the probe round with a scripted transport (the real one: tests/integration/test_link_probe.py) ---------------


class Scripted:
    """A transport whose prober answers are fixed per (source host, target address)."""

    python = "python3"

    def __init__(self, host: str, answers: dict[str, tuple[int, int]], calls: list[tuple[str, list[str]]]) -> None:
        self.host, self.answers, self.calls = host, answers, calls

    def run(self, argv: list[str], *, timeout: float = 30.0, check: bool = False) -> Completed:
        self.calls.append((self.host, argv))
        address = argv[3]
        if address == "unreachable":
            raise TransportError("ssh: connection refused")
        small, large = self.answers.get(address, (2, 2))
        rows = [
            {"size": SMALL_BYTES, "sent": 2, "received": small},
            {"size": LARGE_BYTES, "sent": 2, "received": large},
        ]
        return Completed(tuple(argv), 0, json.dumps(rows), "")


def _probe(
    history: History, answers: dict[str, dict[str, tuple[int, int]]], calls: list[tuple[str, list[str]]]
) -> LinkProbe:
    addresses = {"h1": "10.0.0.11", "h2": "10.0.0.12", "h3": "10.0.0.13"}
    return LinkProbe(
        history,
        transport_of=lambda host: Scripted(host, answers.get(host, {}), calls),  # type: ignore[arg-type,return-value]
        address_of=addresses.get,
        groups_of=lambda host: ["trainers"],
    )


def _hang(reason: str = "all_waiting", since: int = 7) -> Event:
    return Event(
        ts_ns=50, kind="detect.hang", source="runner", data={"reason": reason, "hung_since_ns": since, "seq": 3}
    )


def test_round_reports_only_the_bad_pair() -> None:
    history = History.from_events([start(0, "h1"), start(1, "h2"), start(2, "h3")])
    calls: list[tuple[str, list[str]]] = []
    found = _probe(history, {"h1": {"10.0.0.12": (2, 0)}}, calls).round(_hang())
    assert {(r.a.host, r.b.host): r.verdict for r in found.results} == {
        ("h1", "h2"): "large_dropped",
        ("h1", "h3"): "ok",
        ("h2", "h3"): "ok",
    }
    assert sorted((src, argv[3]) for src, argv in calls) == [
        ("h1", "10.0.0.12"),
        ("h1", "10.0.0.13"),
        ("h2", "10.0.0.13"),
    ]
    [link, summary] = found.events
    assert link.kind == DETECT_LINK and summary.kind == RUNNER_LINK_PROBE
    assert link.data["ranks"] == [0, 1] and link.data["hosts"] == ["h1", "h2"] and link.rank is None
    assert link.data["small_ok"] is True and link.data["large_ok"] is False and link.data["hang_ts_ns"] == 50
    assert summary.data["pairs"] == 3 and summary.data["bad"] == 1


def test_round_names_unprobeable_pairs_instead_of_passing_them() -> None:
    history = History.from_events([start(0, "h1"), start(1, "h2"), start(2, "h4")])  # h4: no address
    probe = LinkProbe(
        history,
        transport_of=lambda host: Scripted(host, {}, []),  # type: ignore[return-value,arg-type]
        address_of={"h1": "10.0.0.11", "h2": "10.0.0.12"}.get,
    )
    found = probe.round()
    assert [(r.a.host, r.b.host, r.verdict) for r in found.results] == [("h1", "h2", "ok")]
    [summary] = found.events
    assert summary.data["errors"] == ["host h4 (ranks 2) has no address to probe"]


def test_transport_failure_is_an_error_verdict_never_a_link() -> None:
    history = History.from_events([start(0, "h1"), start(1, "h2")])
    probe = LinkProbe(
        history,
        transport_of=lambda host: Scripted(host, {}, []),  # type: ignore[return-value,arg-type]
        address_of={"h1": "10.0.0.11", "h2": "unreachable"}.get,
    )
    found = probe.round()
    [result] = found.results
    assert result.verdict == "error" and "connection refused" in (result.error or "")
    assert [e.kind for e in found.events] == [RUNNER_LINK_PROBE]


def test_listen_probes_once_per_all_waiting_hang() -> None:
    history = History.from_events([start(0, "h1"), start(1, "h2")])
    calls: list[tuple[str, list[str]]] = []
    probe = _probe(history, {"h1": {"10.0.0.12": (2, 0)}}, calls)
    assert probe.listen(_hang("stopped")) == []  # a culprit rank: no link to look for
    assert probe.listen(Event(ts_ns=1, kind="detect.peer_lost", source="target", data={})) == []
    assert [e.kind for e in probe.listen(_hang())] == [DETECT_LINK, RUNNER_LINK_PROBE]
    assert probe.listen(_hang()) == []  # the same hang reported again
    assert [e.kind for e in probe.listen(_hang(since=99))] == [DETECT_LINK, RUNNER_LINK_PROBE]  # a new hang
    assert len(calls) == 2


def test_one_host_is_no_link() -> None:
    history = History.from_events([start(0, None), start(1, None)])
    found = _probe(history, {}, []).round()
    assert found.results == [] and found.events[0].data["pairs"] == 0
    assert found.events[0].data["errors"] == ["the ranks run on 1 host(s): no link between hosts to probe"]


def test_probe_argv_is_an_argv_with_the_script_constant() -> None:
    argv = probe_argv(Scripted("h1", {}, []), "10.0.0.12")  # type: ignore[arg-type]
    assert argv[:2] == ["python3", "-c"] and argv[3:] == ["10.0.0.12", f"{SMALL_BYTES},{LARGE_BYTES}", "2", "1.0"]


# -- the checks on specific histories (every property also in tests/unit/test_check_safety.py) --------------------


def _judge(run: LinkRun, **params: object) -> tuple[str, str]:
    result = link_named(History.from_events(run.events()), LinkNamedParams(fault=FAULT, **params), run.scenario)
    return result.status, result.reason


def test_link_named_passes_with_latency_and_fails_on_the_wrong_pair() -> None:
    run = LinkRun()
    result = link_named(History.from_events(run.events()), LinkNamedParams(fault=FAULT, small_ok=True), run.scenario)
    assert result.status == "pass" and result.measured == pytest.approx(5.1)  # hang at +3 s, probes 0.1 s + 2 s
    status, reason = _judge(run.but(named=wrong_pair(run)))
    assert status == "fail" and "['h1', 'h3']" in reason
    assert _judge(run, within=4.0)[0] == "fail"


def test_link_named_is_unknown_for_a_fault_without_peers() -> None:
    run = LinkRun()
    scenario = SimpleNamespace(faults=[SimpleNamespace(name=FAULT, params=SimpleNamespace(rank=1))])
    result = link_named(History.from_events(run.events()), LinkNamedParams(fault=FAULT), scenario)
    assert result.status == "unknown" and "no link fault" in result.reason


def test_peer_matching() -> None:
    side = Side("h3", "10.0.0.13", ("spares",))
    assert peer_matches("host:h3", side) and peer_matches("group:all", side) and peer_matches("group:spares", side)
    assert peer_matches("10.0.0.0/24", side) and peer_matches("10.0.0.13", side)
    assert not peer_matches("host:h1", side) and not peer_matches("group:trainers", side)
    assert not peer_matches("10.0.1.0/24", side)
    ev = LinkRun().events()
    [link] = [e for e in ev if e.kind == "detect.link"]
    assert hits(link, "h2", ["host:h1"]) and hits(link, "h1", ["host:h2"])
    assert not hits(link, "h3", ["group:all"])  # the fault's own host is on neither end


def test_stalled_during_passes_a_stall_and_fails_steps() -> None:
    run = LinkRun()
    ok = stalled_during(History.from_events(run.events()), StalledParams(fault=FAULT), None)
    assert ok.status == "pass" and ok.measured == pytest.approx(7.0)  # 10 s fault - 2 s grace - 1 s heal slack
    bad = stalled_during(History.from_events(run.but(steps_during=1).events()), StalledParams(fault=FAULT), None)
    assert bad.status == "fail" and "kept training" in bad.reason


def test_the_report_timeline_labels_a_link_by_its_rank_pair() -> None:
    from chaos.report.timeline import _detect_label

    [link] = [e for e in LinkRun().events() if e.kind == "detect.link"]
    assert _detect_label(link) == "link r0-r1"
    hang = Event(ts_ns=1, kind="detect.hang", source="runner", rank=2, data={"culprit_rank": 2})
    assert _detect_label(hang) == "hang r2"
