"""Link diagnosis after an all-waiting hang: which pair of hosts passes small packets but not large ones.

When the hang watcher (:mod:`chaos.detect.hang_watch`) reports ``detect.hang`` with reason ``all_waiting`` (every
rank inside the same collective, none behind or elsewhere), no rank is at fault: the collective's bytes are
not arriving. The field's commonest cause (Aegis) is a link that silently drops packets over ~1 KB (an MTU
hole, a bad optic) while heartbeats and pings, all small, stay green. :class:`LinkProbe` then probes, for
every pair of hosts that carry ranks, from one host to the other THROUGH THAT HOST'S TRANSPORT: one ICMP echo
round of :data:`SMALL_BYTES` and one of :data:`LARGE_BYTES` payload with the don't-fragment bit set (what
``ping -s 56`` and ``ping -M do -s 1400`` send), all pairs at once. The prober is a constant Python script run
as ``python -c SCRIPT ADDRESS SIZES COUNT TIMEOUT`` (argv, no shell; it needs only python3 on the host, no
``ping`` binary): an unprivileged ICMP datagram socket where the host allows one, else a raw socket (root).

Each pair whose large probe got no answer is reported as ``detect.link`` (source runner; the contract in
``/tmp/mv/contracts.md``): ``{detector: "link_probe", ranks: [a, b], hosts: [ha, hb], addresses, groups,
small_ok, large_ok, small_bytes, large_bytes, verdict, probes, started_ns, probe_s, hang_ts_ns}`` where
``verdict`` is ``large_dropped`` (small passed: the silent drop) or ``down`` (nothing passed). Every round
also records ``runner.link_probe`` ``{pairs, bad, errors, started_ns, probe_s, hang_ts_ns, results}``: a
round that found every link fine is evidence too (the ``link_named`` check fails a run whose probe looked
during the fault and saw nothing). The probe is a listener of the hang watch (:meth:`LinkProbe.listen`, wired by
the orchestrator when a target has ``hang_watch``): it runs on the watch's listener thread, so the runner's
loop keeps polling, once per hang (keyed by the hang's ``hung_since_ns``/``seq``), never two rounds at once.

The pure parts (:func:`rank_hosts`, :func:`pairs`, :func:`verdict`, :func:`parse_probe`) take plain values.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import combinations
from typing import Literal

from pydantic import JsonValue

from chaos.cluster.base import Transport, TransportError, host_python
from chaos.cluster.hosts import HostSet
from chaos.detect.hang_watch import HangWatch
from chaos.event_kinds import DETECT_HANG, DETECT_LINK, RUNNER_LINK_PROBE, TARGET_START
from chaos.history.timeline import Event, History, now_ns

ALL_WAITING = "all_waiting"
DETECTOR = "link_probe"
SMALL_BYTES = 56  # ICMP payload, as `ping -s 56`: an 84-byte IP packet, what a health check sends
LARGE_BYTES = 1400  # a 1428-byte IP packet: what a collective's full-size TCP segments look like
COUNT = 2  # echoes per size: one lost echo on a healthy link does not read as a drop
TIMEOUT_S = 1.0  # for the answers, as `ping -W 1`
MAX_PARALLEL = 16  # pairs probed at once

Verdict = Literal["ok", "large_dropped", "down", "flaky", "error"]
BAD: tuple[Verdict, ...] = ("large_dropped", "down")
"""Verdicts reported as ``detect.link``: the large probe never came back (a collective cannot cross)."""

# The prober, run on the source host. argv: ADDRESS SIZES(comma list) COUNT TIMEOUT_S. Sends COUNT echoes of
# each size at once, then waits up to TIMEOUT_S for the answers. Prints one JSON list: per size {size, sent,
# received, rtt_ms, error}. Exit 0 whenever it could probe (the answers say the rest).
SCRIPT = r"""
import json, os, select, socket, struct, sys, time
addr, sizes, count, timeout = sys.argv[1], [int(s) for s in sys.argv[2].split(",")], int(sys.argv[3]), float(sys.argv[4])
def csum(b):
    b += b"\0" * (len(b) % 2)
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b)); s = (s >> 16) + (s & 0xFFFF); s += s >> 16
    return ~s & 0xFFFF
def opened():
    try:
        return socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP), False
    except OSError:
        return socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP), True
rounds = {}
for size in sizes:  # every echo of every size leaves at once: the round costs one timeout, not count x sizes
    s, raw = opened()
    s.setsockopt(socket.IPPROTO_IP, 10, 2)  # IP_MTU_DISCOVER = IP_PMTUDISC_DO: never fragment (ping -M do)
    r = rounds[s] = {"size": size, "raw": raw, "ident": (os.getpid() * 7 + size) & 0xFFFF, "sent": {}, "got": set(), "rtts": [], "error": None}
    for seq in range(count):
        body = bytes((seq + size + i) & 0xFF for i in range(size))
        head = struct.pack("!BBHHH", 8, 0, 0, r["ident"], seq)
        try:
            s.sendto(struct.pack("!BBHHH", 8, 0, csum(head + body), r["ident"], seq) + body, (addr, 0))
            r["sent"][seq] = (time.monotonic(), body)
        except OSError as exc:  # EPERM from a DROP in OUTPUT, EMSGSIZE past a known path MTU: this echo is lost
            r["error"] = f"{type(exc).__name__}: {exc}"
deadline = time.monotonic() + timeout
while time.monotonic() < deadline and any(len(r["got"]) < len(r["sent"]) for r in rounds.values()):
    ready, _, _ = select.select(list(rounds), [], [], max(0.0, deadline - time.monotonic()))
    for s in ready:
        r, data = rounds[s], s.recv(65535)
        if r["raw"]:
            data = data[(data[0] & 15) * 4:]
        if len(data) < 8:
            continue
        kind, _, _, rid, seq = struct.unpack("!BBHHH", data[:8])
        if kind == 0 and seq in r["sent"] and seq not in r["got"] and (rid == r["ident"] or not r["raw"]) and data[8:] == r["sent"][seq][1]:
            r["got"].add(seq); r["rtts"].append((time.monotonic() - r["sent"][seq][0]) * 1000)
out = []
for s, r in rounds.items():
    s.close()
    out.append({"size": r["size"], "sent": count, "received": len(r["got"]), "rtt_ms": round(min(r["rtts"]), 3) if r["rtts"] else None, "error": r["error"]})
print(json.dumps(out))
"""


@dataclass(frozen=True)
class Endpoint:
    """A host that carries ranks: its name, address, the ranks on it (lowest first) and inventory groups."""

    host: str
    address: str
    ranks: tuple[int, ...]
    groups: tuple[str, ...] = ()

    @property
    def rank(self) -> int:
        """The rank that stands for this host in a pair (its lowest)."""
        return self.ranks[0]


@dataclass(frozen=True)
class Outcome:
    """One size's echo round: answers received of sent, best round trip, and why sending failed (if it did)."""

    size: int
    sent: int
    received: int
    rtt_ms: float | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.received > 0

    def to_json(self) -> dict[str, JsonValue]:
        return {
            "size": self.size,
            "sent": self.sent,
            "received": self.received,
            "rtt_ms": self.rtt_ms,
            "error": self.error,
        }


@dataclass(frozen=True)
class PairResult:
    """The probe of one pair, from ``a``'s host to ``b``'s address: the verdict and what it rests on."""

    a: Endpoint
    b: Endpoint
    verdict: Verdict
    small: Outcome | None
    large: Outcome | None
    error: str | None = None
    seconds: float = 0.0

    def summary(self) -> dict[str, JsonValue]:
        probes: list[JsonValue] = [o.to_json() for o in (self.small, self.large) if o is not None]
        return {
            "ranks": [self.a.rank, self.b.rank],
            "hosts": [self.a.host, self.b.host],
            "verdict": self.verdict,
            "error": self.error,
            "seconds": round(self.seconds, 3),
            "probes": probes,
        }


# -- pure parts ---------------------------------------------------------------------------------------------------


def rank_hosts(events: Iterable[Event]) -> dict[int, str]:
    """Each rank's host now: the ``host`` of its latest ``target.start`` (events without one ran on ``local``)."""
    latest: dict[int, tuple[int, str]] = {}
    for event in events:
        if event.kind != TARGET_START or event.rank is None:
            continue
        host = event.get_str("host") or "local"
        if event.rank not in latest or event.ts_ns >= latest[event.rank][0]:
            latest[event.rank] = (event.ts_ns, host)
    return {rank: host for rank, (_, host) in sorted(latest.items())}


def endpoints(
    ranks: Mapping[int, str], addresses: Mapping[str, str], groups: Mapping[str, Sequence[str]] | None = None
) -> tuple[list[Endpoint], list[str]]:
    """The hosts carrying ``ranks`` (rank -> host) that have an address, ordered by their lowest rank, and one
    problem line per host that has none (it cannot be probed, so it is named, not silently left out)."""
    by_host: dict[str, list[int]] = {}
    for rank, host in sorted(ranks.items()):
        by_host.setdefault(host, []).append(rank)
    found, problems = [], []
    for host, on_host in by_host.items():
        address = addresses.get(host)
        if not address:
            problems.append(f"host {host} (ranks {', '.join(map(str, on_host))}) has no address to probe")
            continue
        found.append(Endpoint(host, address, tuple(on_host), tuple((groups or {}).get(host, ()))))
    return sorted(found, key=lambda e: e.rank), problems


def pairs(found: Sequence[Endpoint]) -> list[tuple[Endpoint, Endpoint]]:
    """Every unordered pair of distinct hosts, the one with the lower rank first (it is the prober). Ranks on
    one host talk through its loopback and are no link; two endpoints of one host (a caller's error) are one."""
    unique = {e.host: e for e in sorted(found, key=lambda e: e.rank, reverse=True)}  # lowest rank wins
    ordered = sorted(unique.values(), key=lambda e: e.rank)
    return list(combinations(ordered, 2))


def verdict(small: Outcome | None, large: Outcome | None) -> Verdict:
    """What one pair's two echo rounds say: ``large_dropped`` (small answered, large not: the silent drop),
    ``down`` (neither), ``ok`` (both), ``flaky`` (only large: loss, not a size limit), ``error`` (a round is
    missing or sent nothing, so it proves nothing)."""
    if small is None or large is None or small.sent <= 0 or large.sent <= 0:
        return "error"
    if small.ok:
        return "ok" if large.ok else "large_dropped"
    return "flaky" if large.ok else "down"


def parse_probe(stdout: str, sizes: Sequence[int]) -> tuple[Outcome | None, ...]:
    """The prober's JSON output as one :class:`Outcome` per size in ``sizes`` (None where it is missing or
    malformed: such a round proves nothing)."""
    try:
        rows = json.loads(stdout.strip().splitlines()[-1]) if stdout.strip() else []
    except (ValueError, IndexError):
        rows = []
    found: dict[int, Outcome] = {}
    for row in rows if isinstance(rows, list) else []:
        try:
            outcome = Outcome(
                int(row["size"]), int(row["sent"]), int(row["received"]), row.get("rtt_ms"), row.get("error")
            )
        except (TypeError, KeyError, ValueError):
            continue
        found[outcome.size] = outcome
    return tuple(found.get(size) for size in sizes)


def link_data(result: PairResult, started_ns: int, probe_s: float, hang: Event | None) -> dict[str, JsonValue]:
    """The ``detect.link`` data of a bad pair (the contract's fields plus where and when it was seen)."""
    probes: list[JsonValue] = [o.to_json() for o in (result.small, result.large) if o is not None]
    groups: list[JsonValue] = [list(result.a.groups), list(result.b.groups)]
    return {
        "detector": DETECTOR,
        "ranks": [result.a.rank, result.b.rank],
        "hosts": [result.a.host, result.b.host],
        "addresses": [result.a.address, result.b.address],
        "groups": groups,
        "small_ok": result.small is not None and result.small.ok,
        "large_ok": result.large is not None and result.large.ok,
        "small_bytes": SMALL_BYTES,
        "large_bytes": LARGE_BYTES,
        "verdict": result.verdict,
        "probes": probes,
        "started_ns": started_ns,
        "probe_s": round(probe_s, 3),
        "hang_ts_ns": hang.ts_ns if hang is not None else None,
    }


# -- probing ------------------------------------------------------------------------------------------------------


def probe_argv(transport: Transport, address: str, sizes: Sequence[int] = (SMALL_BYTES, LARGE_BYTES)) -> list[str]:
    """The prober's argv on ``transport``'s host (its inventory python)."""
    return [host_python(transport), "-c", SCRIPT, address, ",".join(map(str, sizes)), str(COUNT), repr(TIMEOUT_S)]


def probe_pair(transport: Transport, a: Endpoint, b: Endpoint) -> PairResult:
    """Probe ``b``'s address from ``a``'s host through ``transport`` (``a``'s); never raises."""
    began = time.monotonic()
    budget = TIMEOUT_S + 20.0  # the answers plus interpreter start and an SSH round trip
    try:
        done = transport.run(probe_argv(transport, b.address), timeout=budget)
    except TransportError as exc:
        return PairResult(a, b, "error", None, None, f"cannot probe from {a.host}: {exc}", time.monotonic() - began)
    small, large = parse_probe(done.stdout, (SMALL_BYTES, LARGE_BYTES))
    error = None if done.ok else f"prober exited {done.returncode} on {a.host}: {done.stderr.strip()[-300:]}"
    return PairResult(a, b, verdict(small, large), small, large, error, time.monotonic() - began)


def probe_all(
    couples: Sequence[tuple[Endpoint, Endpoint]], transport_of: Callable[[str], Transport]
) -> list[PairResult]:
    """Probe every pair at once (up to :data:`MAX_PARALLEL`), each from its first host; results in order."""
    if not couples:
        return []

    def one(couple: tuple[Endpoint, Endpoint]) -> PairResult:
        a, b = couple
        try:
            transport = transport_of(a.host)
        except Exception as exc:  # an unknown host or a transport that cannot open: named, never raised
            return PairResult(a, b, "error", None, None, f"no transport to {a.host}: {exc}")
        return probe_pair(transport, a, b)

    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(couples)), thread_name_prefix="mlchaos-link") as pool:
        return list(pool.map(one, couples))


@dataclass(frozen=True)
class Round:
    """One probe round: every pair's result and the events that report it (detect.link per bad pair, then
    runner.link_probe)."""

    results: list[PairResult]
    events: list[Event]


@dataclass(eq=False)
class LinkProbe:
    """Probes the links between the job's hosts for each ``all_waiting`` hang and returns what it found.

    :meth:`listen` is a :mod:`chaos.detect.hang_watch` listener (called on the watch's own thread, its events
    join the history at the next poll); ``history`` is read for where the ranks run (``target.start``).
    ``address_of``/``groups_of`` map a host name to its address / inventory groups; ``transport_of`` opens a
    host's transport.
    """

    history: History
    transport_of: Callable[[str], Transport]
    address_of: Callable[[str], str | None]
    groups_of: Callable[[str], Sequence[str]] = lambda _host: ()
    log: Callable[[str], None] = lambda _line: None
    _seen: set[tuple[object, ...]] = field(init=False, default_factory=set)
    _lock: threading.Lock = field(init=False, default_factory=threading.Lock)

    def listen(self, event: Event) -> list[Event]:
        """The events of a round when ``event`` is an ``all_waiting`` ``detect.hang`` not probed before (one
        round per hang episode, never two at once); else none."""
        if event.kind != DETECT_HANG or event.get_str("reason") != ALL_WAITING:
            return []
        key = (event.data.get("hung_since_ns"), event.data.get("seq"))
        with self._lock:
            if key in self._seen:
                return []
            self._seen.add(key)
            return self.round(event).events

    def round(self, hang: Event | None = None) -> Round:
        """Probe every pair of hosts carrying ranks now (see the module docstring); records nothing itself."""
        ranks = rank_hosts(self.history.events)
        hosts = sorted(set(ranks.values()))
        addresses = {h: addr for h in hosts if (addr := self._address(h))}
        found, problems = endpoints(ranks, addresses, {h: tuple(self.groups_of(h)) for h in hosts})
        if len(hosts) < 2:
            problems = [f"the ranks run on {len(hosts)} host(s): no link between hosts to probe"]
        couples = pairs(found)
        started_ns, began = now_ns(), time.monotonic()
        results = probe_all(couples, self.transport_of)
        probe_s = time.monotonic() - began
        bad = [r for r in results if r.verdict in BAD]
        events = []
        for result in bad:
            data = link_data(result, started_ns, probe_s, hang)
            events.append(Event(ts_ns=now_ns(), kind=DETECT_LINK, source="runner", data=data))
            what = "large packets dropped, small ones pass" if result.verdict == "large_dropped" else "link down"
            a, b = result.a, result.b
            self.log(f"link probe: {a.host} (rank {a.rank}) <-> {b.host} (rank {b.rank}): {what}")
        errors: list[JsonValue] = [*problems, *(r.error for r in results if r.error)]
        summaries: list[JsonValue] = [r.summary() for r in results]
        summary: dict[str, JsonValue] = {
            "pairs": len(couples),
            "bad": len(bad),
            "errors": errors,
            "started_ns": started_ns,
            "probe_s": round(probe_s, 3),
            "hang_ts_ns": hang.ts_ns if hang is not None else None,
            "results": summaries,
        }
        events.append(Event(ts_ns=now_ns(), kind=RUNNER_LINK_PROBE, source="runner", data=summary))
        return Round(results, events)

    def _address(self, host: str) -> str | None:
        try:
            return self.address_of(host)
        except Exception:  # no inventory entry: endpoints() names the host as unprobeable
            return None


def for_run(history: History, hosts: HostSet, log: Callable[[str], None]) -> LinkProbe:
    """The run's link probe over its inventory (addresses, groups, transports)."""

    def groups(name: str) -> Sequence[str]:
        inventory = hosts.inventory
        return inventory.host(name).groups if inventory is not None and name in inventory.names() else ()

    return LinkProbe(history, hosts.transport, hosts.address, groups, log)


def attach(watch: HangWatch | None, history: History, hosts: HostSet, log: Callable[[str], None]) -> HangWatch | None:
    """``watch`` with the run's link probe (:func:`for_run`) among its listeners (this run's only: the module-wide
    listener list is left alone); None stays None (no hang watch, no probe)."""
    if watch is not None:
        watch.listeners = [*watch.listeners, for_run(history, hosts, log).listen]
    return watch
