"""``rerendezvous_within``: after a fault, the torchrun agents either met again in a new rendezvous round within a
bound and training resumed (``outcome: recovered``), or all gave up cleanly within it (``outcome: gave_up``).
``params: {fault: F, within: DURATION, outcome: recovered | gave_up}``.

Evidence: ``target.rendezvous`` (an agent's ``Rendezvous complete for workers`` line, per host ``data.host``),
``target.step``, ``target.node_exit`` (one agent's exit, multi-node) or ``target.exit``, and
``detect.rendezvous_error`` (an agent's ``Rendezvous...Error`` line); see :mod:`chaos.history.torch_signatures`.

The clock starts at F's FIRST ``fault.applied`` (t0); the nodes are the hosts whose agents completed a round
before t0. ``recovered`` passes when every one of them completed a round after t0, the last of them at most
``within`` after t0 (measured: that time, the re-rendezvous time), and a rank reported a step after it; it fails
when one never did, did later, or nothing trained after. ``gave_up`` passes when no new round completed on every
node, every node's agent exited non-zero at most ``within`` after t0, and an agent named a rendezvous error
(measured: the last exit); it fails on a new round, a late or missing exit (a hung agent), or exits without a
rendezvous error. Both are ``unknown`` when F never applied or no round completed before t0 (the agents' INFO
lines were not read: a single-node target, ``signatures:`` without ``torchrun_rendezvous``, or ``LOGLEVEL`` set
below INFO in the target's ``env``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from chaos.checks import _evidence as ev
from chaos.checks.base import CheckParams, CheckResult, register_check
from chaos.checks.latency import LatencyResult, latency_result
from chaos.event_kinds import DETECT_RENDEZVOUS_ERROR, TARGET_EXIT, TARGET_NODE_EXIT, TARGET_RENDEZVOUS
from chaos.history.timeline import Event, History
from chaos.spec.units import Duration

if TYPE_CHECKING:
    from chaos.spec.scenario import Scenario

CHECK_RERENDEZVOUS = "rerendezvous_within"
_NO_ROUNDS = (
    "no rendezvous round completed before the fault, so the re-rendezvous cannot be timed: the agents' INFO lines "
    "(target.rendezvous) were not read (a multi-node torchrun target logs them unless its env sets LOGLEVEL, or "
    "signatures: leaves out torchrun_rendezvous)"
)


class RerendezvousParams(CheckParams):
    """Parameters of ``rerendezvous_within``."""

    fault: str = Field(description="name of the scenario fault whose first fault.applied starts the clock")
    within: Duration = Field(gt=0, description="largest allowed time from the fault to the new round (or the give-up)")
    outcome: Literal["recovered", "gave_up"] = Field(
        default="recovered",
        description="recovered: every node met again in a new round and training resumed; gave_up: every agent "
        "exited with a rendezvous error instead",
    )


def _firsts(events: list[Event], after_ns: int) -> dict[str, Event]:
    """Per host, the first of ``events`` after ``after_ns``."""
    found: dict[str, Event] = {}
    for event in events:
        if event.ts_ns > after_ns:
            found.setdefault(ev.host_of(event), event)
    return found


@register_check(CHECK_RERENDEZVOUS, RerendezvousParams)
def rerendezvous_within(history: History, p: RerendezvousParams, scenario: Scenario) -> CheckResult:
    """after a fault the agents met again in a new rendezvous round within a bound and resumed (or all gave up cleanly)

    See the module docstring."""
    result = latency_result(CHECK_RERENDEZVOUS, p.fault, p.within)
    op = next(iter(ev.applied_ops(history, p.fault)), None)  # the first op starts the clock
    if op is None:
        return result("unknown", ev.missing_fault_reason(history, p.fault), [])
    rounds = ev.events_of(history, TARGET_RENDEZVOUS)
    nodes = sorted({ev.host_of(r) for r in rounds if r.ts_ns <= op.ts_ns})
    if not nodes:
        return result("unknown", _NO_ROUNDS, [ev.cite(history, op)])
    evidence = [ev.cite(history, op, f"nodes of the round in force: {', '.join(nodes)}")]
    rejoined = {host: event for host, event in _firsts(rounds, op.ts_ns).items() if host in nodes}
    evidence += [ev.cite(history, rejoined[host], f"{host} joined a new round") for host in sorted(rejoined)]
    missing = [host for host in nodes if host not in rejoined]
    if p.outcome == "gave_up":
        return _gave_up(history, p, op, nodes, missing, evidence, result)
    if missing:
        return result("fail", f"{', '.join(missing)} never joined a new rendezvous round after {p.fault}", evidence)
    last = max(rejoined.values(), key=lambda e: e.ts_ns)
    took = ev.seconds(last.ts_ns - op.ts_ns)
    if took > p.within:
        bound = ev.fmt_seconds(p.within)
        return result(
            "fail", f"the new round completed {ev.fmt_seconds(took)} after {p.fault}, over {bound}", evidence, took
        )
    resumed = [s for s in ev.step_events(history) if s.ts_ns > last.ts_ns]
    if not resumed:
        return result(
            "fail",
            f"the agents met again {ev.fmt_seconds(took)} after {p.fault} but no rank trained after",
            evidence,
            took,
        )
    evidence.append(ev.cite(history, resumed[0], "the first step after the new round"))
    return result(
        "pass", f"every node met again {ev.fmt_seconds(took)} after {p.fault} and training resumed", evidence, took
    )


def _gave_up(
    history: History,
    p: RerendezvousParams,
    op: Event,
    nodes: list[str],
    missing: list[str],
    evidence: list[str],
    result: LatencyResult,
) -> CheckResult:
    """``outcome: gave_up``: no new round on every node; every node's agent exited non-zero within the bound; an
    agent named a rendezvous error."""
    if not missing:
        return result("fail", f"every node met again in a new round after {p.fault}: the job did not give up", evidence)
    exits = _firsts(ev.events_of(history, TARGET_NODE_EXIT) + ev.events_of(history, TARGET_EXIT), op.ts_ns)
    evidence += [ev.cite(history, exits[host], f"{host}'s agent exited") for host in sorted(exits) if host in nodes]
    hung = [host for host in nodes if host not in exits]
    if hung:
        return result(
            "fail", f"the agent on {', '.join(hung)} never exited after {p.fault}: not a clean give-up", evidence
        )
    clean = [host for host in nodes if (exits[host].get_int("code") or 0) == 0]
    if clean:
        return result("fail", f"the agent on {', '.join(clean)} exited 0: the job did not give up", evidence)
    took = max(ev.seconds(exits[host].ts_ns - op.ts_ns) for host in nodes)
    errors = [e for e in ev.events_of(history, DETECT_RENDEZVOUS_ERROR) if e.ts_ns > op.ts_ns]
    if not errors:
        return result("fail", "the agents exited without a rendezvous error: not a clear give-up", evidence, took)
    evidence.append(ev.cite(history, errors[0], errors[0].get_str("error") or ""))
    if took > p.within:
        bound = ev.fmt_seconds(p.within)
        return result(
            "fail", f"the agents gave up {ev.fmt_seconds(took)} after {p.fault}, over {bound}", evidence, took
        )
    return result(
        "pass", f"every agent gave up with a rendezvous error {ev.fmt_seconds(took)} after {p.fault}", evidence, took
    )


__all__ = ["CHECK_RERENDEZVOUS", "RerendezvousParams", "rerendezvous_within"]
