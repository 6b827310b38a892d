"""Hand-made histories of the silent large-packet drop story, for ``link_named`` and ``stalled_during``.

Three hosts h1..h3 (10.0.0.11..13) run ranks 0..2. The job steps every 0.1 s; at ``fault_at`` a
``drop_large_packets`` fault on ``hit`` towards ``peers`` applies and the job stops stepping (its collectives
stall) until the heal ``duration`` later, then steps again. ``hang_after`` after the fault the hang watcher
reports ``all_waiting`` and the link probe sends its echoes 0.1 s later; it reports one ``detect.link`` per
pair in ``named`` (default: every pair the fault hit) with ``small_ok``. :meth:`LinkRun.but` makes the
variations that break a property.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Any

from hypothesis import strategies as st

from chaos.history.timeline import Event
from injectors.network.faults import DropLargeParams

SECOND = 1_000_000_000
FAULT = "mtu-hole"
HOSTS = {"h1": 0, "h2": 1, "h3": 2}
ADDRESS = {"h1": "10.0.0.11", "h2": "10.0.0.12", "h3": "10.0.0.13"}
GROUPS = {"h1": ["trainers"], "h2": ["trainers"], "h3": ["spares"]}


def ns(t: float) -> int:
    return round(t * SECOND)


def peer_hosts(hit: str, peers: tuple[str, ...]) -> list[str]:
    """The hosts ``peers`` stand for, seen from ``hit`` (what the injector would resolve)."""
    out = []
    for host in HOSTS:
        if host == hit:
            continue
        for peer in peers:
            kind, _, name = peer.partition(":")
            if (kind == "host" and name == host) or (kind == "group" and (name == "all" or name in GROUPS[host])):
                out.append(host)
                break
            if peer == ADDRESS[host]:
                out.append(host)
                break
    return out


def link(
    t: float, a: str, b: str, *, small_ok: bool = True, large_ok: bool = False, started: float | None = None
) -> Event:
    first, second = sorted((a, b), key=HOSTS.__getitem__)
    data: dict[str, Any] = {
        "detector": "link_probe",
        "ranks": [HOSTS[first], HOSTS[second]],
        "hosts": [first, second],
        "addresses": [ADDRESS[first], ADDRESS[second]],
        "groups": [GROUPS[first], GROUPS[second]],
        "small_ok": small_ok,
        "large_ok": large_ok,
        "small_bytes": 56,
        "large_bytes": 1400,
        "verdict": "large_dropped" if small_ok else "down",
        "probes": [],
        "started_ns": ns(started if started is not None else t - 2),
        "probe_s": 2.0,
        "hang_ts_ns": None,
    }
    return Event(ts_ns=ns(t), kind="detect.link", source="runner", data=data)


@dataclass(frozen=True)
class LinkRun:
    hit: str = "h2"
    peers: tuple[str, ...] = ("host:h1",)
    fault_at: float = 5.0
    duration: float = 10.0
    with_fault: bool = True
    healed: bool = True
    hang_after: float | None = 3.0  # None: no all_waiting hang, so no probe round
    named: tuple[tuple[str, str], ...] | None = None  # None: every pair the fault hit
    small_ok: bool = True
    probe_offset: float = 0.0  # probes sent this much later than hang + 0.1 s (push it past the heal)
    steps_during: int = 0  # steps the job still reports in the middle of the fault
    steps_before: bool = True
    crash_during: bool = False
    exited_before: float | None = None  # the job exits this long before the fault and reports nothing after

    def but(self, **changes: Any) -> LinkRun:
        return replace(self, **changes)

    @property
    def scenario(self) -> SimpleNamespace:
        return SimpleNamespace(faults=[SimpleNamespace(name=FAULT, params=DropLargeParams(peers=list(self.peers)))])

    def pairs_hit(self) -> list[tuple[str, str]]:
        return [(self.hit, other) for other in peer_hosts(self.hit, self.peers)]

    def events(self) -> list[Event]:
        ev: list[Event] = []
        for host, rank in HOSTS.items():
            ev.append(
                Event(
                    ts_ns=ns(0.5),
                    kind="target.start",
                    source="target",
                    rank=rank,
                    data={"host": host, "pid": 100 + rank},
                )
            )
        end = self.fault_at + self.duration + 5.0
        if self.exited_before is not None:
            end = self.fault_at - self.exited_before
            ev.append(Event(ts_ns=ns(end), kind="target.exit", source="runner", data={"code": 0}))
        t, step = 1.0, 1
        while ns(t) < ns(end):  # in nanoseconds: a step at the exit's own instant would be a step after it
            stalled = self.fault_at <= t < self.fault_at + self.duration
            if (self.steps_before or t >= self.fault_at) and not stalled:
                ev.extend(
                    Event(ts_ns=ns(t), kind="target.step", source="target", rank=r, data={"step": step})
                    for r in HOSTS.values()
                )
                step += 1
            t = round(t + 0.1, 6)
        for i in range(self.steps_during):
            at = self.fault_at + self.duration * (i + 1) / (self.steps_during + 1)
            ev.append(Event(ts_ns=ns(at), kind="target.step", source="target", rank=0, data={"step": 10_000 + i}))
        if self.crash_during:
            ev.append(
                Event(
                    ts_ns=ns(self.fault_at + self.duration / 2), kind="target.exit", source="target", data={"code": 1}
                )
            )
        if not self.with_fault:
            return ev
        fault = {"fault": FAULT, "op": "mtu-hole#1", "injector": "drop_large_packets", "host": self.hit}
        ev.append(Event(ts_ns=ns(self.fault_at), kind="fault.applied", data=dict(fault)))
        if self.healed:
            ev.append(Event(ts_ns=ns(self.fault_at + self.duration), kind="fault.healed", data=dict(fault)))
        if self.hang_after is None:
            return ev
        hang_at = self.fault_at + self.hang_after
        ev.append(
            Event(
                ts_ns=ns(hang_at),
                kind="detect.hang",
                source="runner",
                data={"detector": "flight_recorder", "culprit_rank": None, "reason": "all_waiting"},
            )
        )
        sent = hang_at + 0.1 + self.probe_offset
        named = self.pairs_hit() if self.named is None else list(self.named)
        for a, b in named:
            ev.append(link(sent + 2.0, a, b, small_ok=self.small_ok, started=sent))
        ev.append(
            Event(
                ts_ns=ns(sent + 2.0),
                kind="runner.link_probe",
                source="runner",
                data={"pairs": 3, "bad": len(named), "errors": [], "started_ns": ns(sent), "probe_s": 2.0},
            )
        )
        return ev


@st.composite
def link_runs(draw: st.DrawFn) -> LinkRun:
    """A run where the properties hold: the job stalls during the fault and the probe names a pair it hit."""
    hit = draw(st.sampled_from(list(HOSTS)))
    others = [h for h in HOSTS if h != hit]
    peers = draw(
        st.sampled_from(
            [("group:all",), (f"host:{others[0]}",), (ADDRESS[others[1]],), (f"host:{others[0]}", ADDRESS[others[1]])]
        )
    )
    duration = draw(st.floats(6.0, 20.0))
    return LinkRun(
        hit=hit,
        peers=peers,
        fault_at=draw(st.floats(2.0, 10.0)),
        duration=duration,
        hang_after=draw(st.floats(2.5, duration - 3.0)),
    )


def wrong_pair(run: LinkRun) -> tuple[tuple[str, str], ...]:
    """A pair the fault did not hit: between two hosts that are not (fault host, peer)."""
    hit = set(run.pairs_hit())
    pairs = [(a, b) for a in HOSTS for b in HOSTS if a < b]
    return tuple(p for p in pairs if p not in hit and (p[1], p[0]) not in hit)[:1]
