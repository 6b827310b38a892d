"""Link checks: the silent large-packet drop story (Aegis) judged from the history.

``link_named`` {fault, small_ok, within}: every applied op of a link fault (one whose params carry ``peers``:
``drop_large_packets``, ``partition``, ``packet_loss``, ``flap``) is named by a ``detect.link`` (the link probe,
:mod:`chaos.detect.link_probe`) whose probes were SENT while that op was in force (its ``started_ns`` after the
``fault.applied`` and no later than that op's ``fault.healed``), and whose pair of hosts is one the op hit: one
side is the op's host, the other matches one of the fault's peers (``host:NAME`` by name, ``group:all`` any
other host, ``group:NAME`` by the inventory groups the probe recorded, an address or CIDR by the address).
Verdicts, per op:

- ``fail`` when a detect.link in the window names a pair the op did not hit (whoever acts on it swaps the
  wrong cable), when the pair is right but the probe's signature contradicts ``small_ok`` (``true``: the small
  probe must have passed and the large one failed, the silent drop; ``false``: both failed, a dead link), when
  a probe round ran in the window and found every link fine (it looked and missed), or when the first naming
  detection came later than ``within``;
- ``unknown`` when the fault never applied, is no link fault, or no probe round ran in the window (no
  ``all_waiting`` hang was reported, or every probe errored): nothing shows the link was or was not found;
- ``pass`` otherwise; measured: the worst time from an op's ``fault.applied`` to its first naming detect.link.

``stalled_during`` {fault, grace}: the job made no step progress while each op was in force: no ``target.step``
from ``grace`` after the ``fault.applied`` (a step whose collective finished just before the fault may still
report) until 1 s before its ``fault.healed`` (:data:`HEAL_SLACK_NS`), and the job neither exited nor restarted in that window (a crash is no
stall). ``unknown`` when the fault never applied or never healed, the window is empty (the fault was shorter
than ``grace``), or the job reported no step before the fault since it last exited or restarted (then silence
proves nothing: a job that had ended, or was still loading after a restart, was not there to stall).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pydantic import Field

from chaos.checks import _evidence as ev
from chaos.checks.base import CheckParams, CheckResult, register_check
from chaos.event_kinds import DETECT_LINK, RUNNER_LINK_PROBE, TARGET_EXIT, TARGET_RESTART
from chaos.history.timeline import Event, History
from chaos.spec.units import Duration

if TYPE_CHECKING:
    from chaos.spec.scenario import Scenario

CHECK_LINK_NAMED = "link_named"
CHECK_STALLED = "stalled_during"
HEAL_SLACK_NS = 1_000_000_000
"""``stalled_during`` stops looking this long before ``fault.healed``: the heal takes effect when the host's rule
goes, which is before the heal command (an SSH round trip) returns and the runner records the event."""


class LinkNamedParams(CheckParams):
    """Parameters of ``link_named`` (module docstring)."""

    fault: str = Field(description="name of the scenario's link fault (one with peers) whose ops must be named")
    small_ok: bool | None = Field(
        default=None,
        description="true: the naming probe must show small packets passing and large ones dropped (the silent "
        "drop: pings green); false: both dropped (a dead link); null: either",
    )
    within: Duration | None = Field(
        default=None, description="largest allowed time from each fault.applied to its naming detect.link; null: none"
    )


class StalledParams(CheckParams):
    """Parameters of ``stalled_during`` (module docstring)."""

    fault: str = Field(description="name of the scenario fault during whose every op the job must not step")
    grace: Duration = Field(
        default=2.0, ge=0, description="steps reported this soon after fault.applied were in flight before it"
    )


@dataclass(frozen=True)
class Side:
    """One end of a probed pair as the detect.link records it."""

    host: str
    address: str
    groups: tuple[str, ...]


def sides(link: Event) -> tuple[Side, Side] | None:
    """The two ends a detect.link names (None when it does not name two hosts)."""
    hosts, addresses, groups = link.data.get("hosts"), link.data.get("addresses"), link.data.get("groups")
    if not isinstance(hosts, list) or len(hosts) != 2 or not all(isinstance(h, str) for h in hosts):
        return None
    addrs = addresses if isinstance(addresses, list) and len(addresses) == 2 else ["", ""]
    grps = groups if isinstance(groups, list) and len(groups) == 2 else [[], []]
    made = [
        Side(
            str(h),
            a if isinstance(a, str) else "",
            tuple(x for x in g if isinstance(x, str)) if isinstance(g, list) else (),
        )
        for h, a, g in zip(hosts, addrs, grps, strict=True)
    ]
    return made[0], made[1]


def peer_matches(peer: str, side: Side) -> bool:
    """Whether the fault's ``peer`` (as written in the scenario) stands for ``side``'s host."""
    kind, _, name = peer.partition(":")
    if kind == "host" and name:
        return side.host == name
    if kind == "group" and name:
        return name == "all" or name in side.groups
    try:
        return ipaddress.ip_address(side.address) in ipaddress.ip_network(peer, strict=False)
    except ValueError:
        return False


def hits(link: Event, host: str, peers: Sequence[str]) -> bool:
    """Whether ``link`` names a pair the op hit: one end ``host`` (the op's), the other one of ``peers``."""
    ends = sides(link)
    if ends is None or ends[0].host == ends[1].host:
        return False
    a, b = ends
    return (a.host == host and any(peer_matches(p, b) for p in peers)) or (
        b.host == host and any(peer_matches(p, a) for p in peers)
    )


def probed_at(event: Event) -> int:
    """When the probes behind ``event`` were sent (``started_ns``), else the event's own time."""
    started = event.get_int("started_ns")
    return started if started is not None else event.ts_ns


def _listed(value: object) -> list[object]:
    return list(value) if isinstance(value, list) else []


def _pair(link: Event) -> str:
    hosts, ranks = link.data.get("hosts"), link.data.get("ranks")
    return f"hosts {hosts} (ranks {ranks})"


def _signature(link: Event, small_ok: bool | None) -> str | None:
    """Why ``link``'s probes contradict the expected signature, or None when they fit it."""
    small, large = link.data.get("small_ok") is True, link.data.get("large_ok") is True
    if large:
        return "its large probe passed: it names no broken link"
    if small_ok is True and not small:
        return "its small probe failed too: a dead link, not a silent large-packet drop"
    if small_ok is False and small:
        return "its small probe passed: a large-packet drop, not a dead link"
    return None


@dataclass
class _Findings:
    """What a link check found over a fault's ops: evidence lines, definite failures, and why some op cannot be
    judged."""

    evidence: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    unknowns: list[str] = field(default_factory=list)

    def judge(
        self, verdict: ev.Verdict, passed: str, measured: float, failed_measured: float | None = None
    ) -> CheckResult:
        """``fail`` naming every failure, else ``unknown`` naming every op not judged, else ``pass`` (reason
        ``passed``); evidence capped."""
        evidence = ev.capped(self.evidence)
        if self.failures:
            return verdict(status="fail", reason="; ".join(self.failures), evidence=evidence, measured=failed_measured)
        if self.unknowns:
            return verdict(status="unknown", reason="; ".join(self.unknowns), evidence=evidence)
        return verdict(status="pass", reason=passed, evidence=evidence, measured=measured)


@register_check(CHECK_LINK_NAMED, LinkNamedParams)
def link_named(history: History, p: LinkNamedParams, scenario: Scenario | None) -> CheckResult:
    """each op of a link fault is named by a detect.link probed during it, for a host pair the op hit

    Worst time from each op to its naming detect.link, in seconds (rules in the module docstring)."""
    bound = "named" if p.within is None else f"<= {ev.fmt_seconds(p.within)}"
    verdict = ev.verdict_of(CHECK_LINK_NAMED, p.fault, bound=bound, unit="s")
    ops = ev.applied_ops(history, p.fault)
    if not ops:
        return verdict(status="unknown", reason=ev.missing_fault_reason(history, p.fault))
    fault_params = ev.fault_params(scenario, p.fault)
    peers = getattr(fault_params, "peers", None)
    if not isinstance(peers, list) or not peers:
        not_link = f"fault {p.fault!r} has no peers in the scenario: it is no link fault, so no pair can be judged"
        return verdict(status="unknown", reason=not_link)
    links = ev.events_of(history, DETECT_LINK)
    rounds = ev.events_of(history, RUNNER_LINK_PROBE)
    found = _Findings()
    worst = 0.0
    for op in ops:
        host = ev.host_of(op)
        opened, closes = op.ts_ns, ev.healed_at(history, op, by="host")

        def inside(event: Event, opened: int = opened, closes: int | None = closes) -> bool:
            return opened < probed_at(event) and (closes is None or probed_at(event) <= closes)

        during = [e for e in links if inside(e)]
        found.evidence.append(ev.cite(history, op, f"on {host}, peers {', '.join(peers)}"))
        wrong = [e for e in during if not hits(e, host, peers)]
        right = [e for e in during if hits(e, host, peers)]
        for link in wrong:
            found.failures.append(
                f"{_pair(link)} named during {ev.describe(op)}, which hit {host} <-> {', '.join(peers)}"
            )
            found.evidence.append(ev.cite(history, link, f"WRONG pair {_pair(link)}"))
        fitting = [e for e in right if _signature(e, p.small_ok) is None]
        for link in right:
            if (why := _signature(link, p.small_ok)) is not None:
                found.evidence.append(ev.cite(history, link, f"{_pair(link)}: {why}"))
                if not fitting:
                    found.failures.append(f"{_pair(link)}: {why}")
        if fitting:
            first = fitting[0]
            latency = ev.seconds(first.ts_ns - op.ts_ns)
            worst = max(worst, latency)
            found.evidence.append(
                ev.cite(history, first, f"names {_pair(first)}, {ev.fmt_seconds(latency)} after the fault")
            )
            if p.within is not None and latency > p.within:
                found.failures.append(
                    f"{ev.describe(op)} named after {ev.fmt_seconds(latency)} > {ev.fmt_seconds(p.within)}"
                )
            continue
        if right:
            continue  # named, but with the wrong signature: a failure recorded above
        looked = [r for r in rounds if inside(r)]
        clean = [
            r for r in looked if r.get_int("bad") == 0 and (r.get_int("pairs") or 0) > 0 and not r.data.get("errors")
        ]
        if clean:
            found.failures.append(
                f"a link probe ran during {ev.describe(op)} and found every link fine: it missed the link"
            )
            found.evidence.extend(
                ev.cite(history, r, f"{r.data.get('pairs')} pair(s) probed, none bad") for r in clean[:3]
            )
        elif looked:
            errors = [str(x) for r in looked for x in _listed(r.data.get("errors"))]
            found.unknowns.append(
                f"the link probe during {ev.describe(op)} could not judge: {'; '.join(errors[:3]) or 'no pair to probe'}"
            )
            found.evidence.extend(ev.cite(history, r) for r in looked[:3])
        else:
            found.unknowns.append(
                f"no link probe ran while {ev.describe(op)} was in force (no all_waiting detect.hang?)"
            )
    named = f"every op of {p.fault!r} ({len(ops)}) named by a detect.link for a host pair it hit"
    return found.judge(verdict, named, worst, failed_measured=worst or None)


@register_check(CHECK_STALLED, StalledParams)
def stalled_during(history: History, p: StalledParams, scenario: Scenario | None) -> CheckResult:
    """the job reported no training step (and did not exit or restart) while each op of a fault was in force

    Longest stalled window judged, in seconds (rules in the module docstring)."""
    verdict = ev.verdict_of(CHECK_STALLED, p.fault, bound="0 steps", unit="s")
    ops = ev.applied_ops(history, p.fault)
    if not ops:
        return verdict(status="unknown", reason=ev.missing_fault_reason(history, p.fault))
    steps = ev.step_events(history)
    ends = ev.events_of(history, TARGET_EXIT) + ev.events_of(history, TARGET_RESTART)
    found = _Findings()
    longest = 0.0
    for op in ops:
        closes = ev.healed_at(history, op, by="host")
        opens = op.ts_ns + round(p.grace * 1e9)
        before = [s for s in steps if s.ts_ns < op.ts_ns]
        found.evidence.append(ev.cite(history, op))
        if closes is None:
            found.unknowns.append(f"{ev.describe(op)} never healed: its window has no end")
            continue
        if closes - HEAL_SLACK_NS <= opens:
            found.unknowns.append(f"{ev.describe(op)} lasted no longer than the grace of {ev.fmt_seconds(p.grace)}")
            continue
        if not before:
            found.unknowns.append(f"the job reported no step before {ev.describe(op)}: its silence proves no stall")
            continue
        gone = ev.ordered(e for e in ends if before[-1].ts_ns < e.ts_ns <= op.ts_ns)
        if gone:
            found.unknowns.append(
                f"the job {'exited' if gone[-1].kind == TARGET_EXIT else 'restarted'} before {ev.describe(op)} and "
                "reported no step since: its silence proves no stall"
            )
            found.evidence.append(ev.cite(history, gone[-1]))
            continue
        found.evidence.append(ev.cite(history, before[-1], "last step before the fault"))
        closes -= HEAL_SLACK_NS  # the rule is gone before the heal command returns and fault.healed is recorded
        stepped = [s for s in steps if opens <= s.ts_ns < closes]
        ended = [e for e in ends if op.ts_ns < e.ts_ns <= closes]
        if stepped:
            found.failures.append(f"{len(stepped)} step event(s) during {ev.describe(op)}: the job kept training")
            found.evidence.extend(ev.cite(history, s, "stepped during the fault") for s in stepped[:3])
        if ended:
            found.failures.append(f"the job exited or restarted during {ev.describe(op)}: a crash, not a stall")
            found.evidence.extend(ev.cite(history, e) for e in ended[:3])
        if not stepped and not ended:
            longest = max(longest, ev.seconds(closes - opens))
            found.evidence.append(
                f"no step from +{ev.seconds(opens - ev.origin_ns(history)):.3f}s to {ev.fmt_offset(history, closes)}"
            )
    why = f"no step while any of the {len(ops)} op(s) of {p.fault!r} was in force (after {ev.fmt_seconds(p.grace)})"
    return found.judge(verdict, why, longest)
