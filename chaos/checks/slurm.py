"""Slurm checks: the reliability loop of seed 000 judged from what Slurm itself showed.

They read the events the ``slurm`` target records by polling Slurm (one per observed change, the first
observation too): ``slurm.job`` {``job_id``, ``state``, ``reason``, ``nodes``, ``restarts``, ``exit_code``} and
``slurm.node`` {``node``, ``state`` (base state plus flags joined by ``+``: ``IDLE+DRAIN``), ``reason``}; node
names are inventory host names, so the node a fault hit is its ``fault.applied`` ``host``.

- ``node_drained_within {fault, within, by}``: after each applied op, the node it hit shows DRAIN (a
  ``DRAIN``/``DRAINING``/``DRAINED`` flag) within ``within``; with ``by: health_check`` the drain's reason must
  be the health check's (``mlchaos-hc: ...``).
- ``requeued_within {fault, within}``: the job running on the hit node when the op applied is interrupted
  (REQUEUED, NODE_FAIL, any state but RUNNING, or a higher ``restarts``) and RUNNING again under the SAME
  job id within ``within`` of the op (a new job id would be a resubmission, not a requeue).
- ``no_repeat_failure_on_bad_node {fault?}``: no later attempt of that job (a RUNNING ``slurm.job`` with nodes,
  after its interruption) includes the hit node while it is bad: from the op until the fault is healed, and
  while it is drained or down from a drain/down that began after the op. Without ``fault`` every applied op
  counts.

Never vacuous: a fault that never applied, an op without a host, a node or job Slurm was not seen to show at
or before the op, a node already drained when the op hit, a history that ends before the bound, a job that never
ran again: ``unknown``, naming what was missing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from chaos.checks._evidence import (
    LOCAL_HOST,
    capped,
    cite,
    events_of,
    fault_ops,
    fmt_offset,
    fmt_seconds,
    host_of,
    missing_fault_reason,
    seconds,
    verdict_of,
)
from chaos.checks.base import CheckParams, CheckResult, register_check
from chaos.checks.latency import FaultBound, fault_latencies
from chaos.event_kinds import FAULT_HEALED, SLURM_JOB, SLURM_NODE
from chaos.history.timeline import Event, History

if TYPE_CHECKING:
    from chaos.spec.scenario import Scenario

HEALTH_CHECK_PREFIX = "mlchaos-hc:"
CHECK_DRAINED = "node_drained_within"
CHECK_REQUEUED = "requeued_within"
CHECK_NO_REPEAT = "no_repeat_failure_on_bad_node"


# -- reading slurm.* events ------------------------------------------------------------------------------------


def node_flags(event: Event) -> set[str]:
    """The words of a ``slurm.node`` state: ``IDLE+DRAIN`` -> {IDLE, DRAIN}."""
    return {word.strip().upper() for word in (event.get_str("state") or "").split("+") if word.strip()}


def is_drained(event: Event) -> bool:
    return any(word.startswith("DRAIN") for word in node_flags(event))


def is_bad(event: Event) -> bool:
    """Drained or down: no job should start there."""
    return is_drained(event) or "DOWN" in node_flags(event)


def node_events(history: History, node: str) -> list[Event]:
    return [e for e in events_of(history, SLURM_NODE) if e.get_str("node") == node]


def job_events(history: History, job_id: int | None = None) -> list[Event]:
    return [e for e in events_of(history, SLURM_JOB) if job_id is None or e.get_int("job_id") == job_id]


def job_nodes(event: Event) -> list[str]:
    nodes = event.data.get("nodes")
    return [n for n in nodes if isinstance(n, str)] if isinstance(nodes, list) else []


def _state(event: Event) -> str:
    return (event.get_str("state") or "").upper()


def _restarts(event: Event) -> int:
    return event.get_int("restarts") or 0


def _end(history: History) -> int:
    return history.events[-1].ts_ns if history.events else 0


def _op_host(op: Event) -> str | None:
    host = host_of(op)
    return None if host == LOCAL_HOST else host


@dataclass(frozen=True)
class HitJob:
    """The job running on the op's node when the op applied (its latest ``slurm.job`` at or before the op)."""

    job_id: int
    at_op: Event


def job_hit(history: History, op: Event, host: str) -> HitJob | None:
    latest: dict[int, Event] = {}
    for event in job_events(history):
        job_id = event.get_int("job_id")
        if job_id is not None and event.ts_ns <= op.ts_ns:
            latest[job_id] = event
    hit = [e for e in latest.values() if _state(e) == "RUNNING" and host in job_nodes(e)]
    if not hit:
        return None
    first = min(hit, key=lambda e: e.get_int("job_id") or 0)
    return HitJob(first.get_int("job_id") or 0, first)


def interruption(history: History, hit: HitJob, op: Event) -> Event | None:
    """The first ``slurm.job`` of the hit job after the op that shows the attempt ended: any state but RUNNING,
    or a higher ``restarts`` (polling can miss the REQUEUED in between)."""
    base = _restarts(hit.at_op)
    for event in job_events(history, hit.job_id):
        if event.ts_ns > op.ts_ns and (_state(event) != "RUNNING" or _restarts(event) > base):
            return event
    return None


def later_attempts(history: History, hit: HitJob, op: Event) -> list[Event]:
    """RUNNING ``slurm.job`` events with nodes of the hit job from its interruption on (attempts after the op);
    when Slurm's restart count is known, only those of a later attempt (a count above the hit attempt's)."""
    stop = interruption(history, hit, op)
    if stop is None:
        return []
    before = hit.at_op.get_int("restarts")
    return [
        e
        for e in job_events(history, hit.job_id)
        if e.ts_ns >= stop.ts_ns
        and _state(e) == "RUNNING"
        and job_nodes(e)
        and (before is None or (e.get_int("restarts") or 0) > before)
    ]


def _cite_node(history: History, event: Event) -> str:
    reason = event.get_str("reason")
    about = f"{event.get_str('node')} {event.get_str('state')}" + (f" ({reason})" if reason else "")
    return f"slurm.node {about} at {fmt_offset(history, event.ts_ns)}"


def _cite_job(history: History, event: Event) -> str:
    nodes = ",".join(job_nodes(event)) or "-"
    about = f"job {event.get_int('job_id')} {event.get_str('state')} restarts {_restarts(event)} nodes {nodes}"
    return f"slurm.job {about} at {fmt_offset(history, event.ts_ns)}"


# -- node_drained_within -----------------------------------------------------------------------------------------


class NodeDrainedParams(FaultBound):
    """``within`` bounds the time from each fault.applied to a ``slurm.node`` event showing its node DRAIN."""

    by: Literal["any", "health_check"] = Field(
        default="any", description="health_check: the drain's reason must start with 'mlchaos-hc:'"
    )


@register_check(CHECK_DRAINED, NodeDrainedParams)
def node_drained_within(history: History, p: NodeDrainedParams, scenario: Scenario | None) -> CheckResult:
    """after each applied op of a fault, Slurm shows the node it hit DRAIN within a time bound

    Worst time from an op to its node's DRAIN (see the module docstring)."""
    found = fault_latencies(history, CHECK_DRAINED, p.fault, p.within)
    for op in found.ops:
        host = _op_host(op)
        if host is None:
            found.cannot_judge(f"{cite(history, op)} names no host: which node it hit is unknown")
            continue
        seen = node_events(history, host)
        if not seen:
            found.cannot_judge(f"no slurm.node event shows node {host}: the target never observed it")
            continue
        before = [e for e in seen if e.ts_ns <= op.ts_ns]
        if not before:
            # A drain first seen after the op may have begun before it: only a sighting at or before the op shows
            # the node was not drained already.
            found.cannot_judge(f"no slurm.node event showed {host} before {cite(history, op)}: its state is unknown")
            continue
        if is_drained(before[-1]):
            found.cannot_judge(
                f"{host} was already drained when {cite(history, op)}: {_cite_node(history, before[-1])}"
            )
            continue
        drains = [e for e in seen if e.ts_ns > op.ts_ns and is_drained(e)]
        if p.by == "health_check":
            others = [e for e in drains if not (e.get_str("reason") or "").startswith(HEALTH_CHECK_PREFIX)]
            drains = [e for e in drains if e not in others]
            found.evidence += [f"not by the health check: {_cite_node(history, e)}" for e in others[:2]]
        if drains:
            found.add(seconds(drains[0].ts_ns - op.ts_ns), op)
            found.evidence.append(f"{cite(history, op)} on {host} -> {_cite_node(history, drains[0])}")
        elif _end(history) - op.ts_ns < round(p.within * 1e9):
            found.cannot_judge(
                f"the history ends {fmt_seconds(seconds(_end(history) - op.ts_ns))} after "
                f"{cite(history, op)}, before the {fmt_seconds(p.within)} bound, and {host} is not drained"
            )
        elif found.missed is None:
            what = "drained by the health check" if p.by == "health_check" else "drained"
            last = seen[-1]
            found.missed = f"{host} was never {what} after {cite(history, op)}; last seen {_cite_node(history, last)}"
    return found.judge(
        too_slow=lambda taken, op: f"{_op_host(op)} drained {fmt_seconds(taken)} after {cite(history, op)}",
        passed=f"the node of every op of {p.fault!r} drained",
    )


# -- requeued_within ---------------------------------------------------------------------------------------------


class RequeuedParams(FaultBound):
    """``within`` bounds the time from each fault.applied to its job RUNNING again under the same job id."""


@register_check(CHECK_REQUEUED, RequeuedParams)
def requeued_within(history: History, p: RequeuedParams, scenario: Scenario | None) -> CheckResult:
    """the job a fault hit is requeued and RUNNING again under the same job id within a time bound

    Worst time from an op to its job's next attempt RUNNING (see the module docstring)."""
    found = fault_latencies(history, CHECK_REQUEUED, p.fault, p.within)
    bound_ns = round(p.within * 1e9)
    for op in found.ops:
        host = _op_host(op)
        hit = job_hit(history, op, host) if host is not None else None
        if hit is None:
            where = f"on {host}" if host is not None else "(the op names no host)"
            found.cannot_judge(f"no slurm.job showed a job RUNNING {where} when {cite(history, op)}")
            continue
        stop = interruption(history, hit, op)
        again = later_attempts(history, hit, op)
        ran_out = _end(history) - op.ts_ns < bound_ns
        if again:
            # A later attempt under the same id: requeued, whatever the interrupted attempt's own end state was
            # (a requeue on RequeueExit ends the attempt FAILED in accounting, then REQUEUED, then RUNNING).
            found.add(seconds(again[0].ts_ns - op.ts_ns), op)
            found.evidence += [_cite_job(history, e) for e in (stop, again[0]) if e is not None]
        elif stop is not None and _state(stop) in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY"):
            if found.missed is None:
                found.missed = (
                    f"job {hit.job_id} was not requeued after {cite(history, op)}: {_cite_job(history, stop)}"
                )
        elif ran_out:
            found.cannot_judge(
                f"the history ends before the {fmt_seconds(p.within)} bound after {cite(history, op)} "
                f"and job {hit.job_id} is not RUNNING again"
            )
        elif found.missed is None:
            state = (
                _cite_job(history, stop)
                if stop is not None
                else f"still its attempt of {_cite_job(history, hit.at_op)}"
            )
            found.missed = f"job {hit.job_id} never ran again under its id after {cite(history, op)}: last {state}"
    return found.judge(
        too_slow=lambda taken, op: f"the job ran again {fmt_seconds(taken)} after {cite(history, op)}",
        passed=f"the job of every op of {p.fault!r} ran again under its job id",
    )


# -- no_repeat_failure_on_bad_node -------------------------------------------------------------------------------


class NoRepeatParams(CheckParams):
    """``fault``: the fault whose nodes must not run the job again while bad (null: every applied fault)."""

    fault: str | None = Field(default=None, description="the fault whose hit nodes are judged; null: every fault")


def bad_windows(history: History, op: Event, host: str) -> list[tuple[int, int, str]]:
    """When ``host`` is bad because of ``op``: [op, its heal (or the end)) and every drained/down stretch that
    began after the op, as (start, end, why)."""
    end = _end(history) + 1
    healed = [
        e.ts_ns
        for e in events_of(history, FAULT_HEALED)
        if e.data.get("op") == op.data.get("op") and e.get_str("fault") == op.get_str("fault") and e.ts_ns > op.ts_ns
    ]
    windows = [(op.ts_ns, min(healed) if healed else end, f"fault {op.get_str('fault')} active")]
    start: Event | None = None
    for event in node_events(history, host):
        if event.ts_ns <= op.ts_ns:
            continue
        if is_bad(event) and start is None:
            start = event
        elif not is_bad(event) and start is not None:
            windows.append((start.ts_ns, event.ts_ns, _cite_node(history, start)))
            start = None
    if start is not None:
        windows.append((start.ts_ns, end, _cite_node(history, start)))
    return windows


@register_check(CHECK_NO_REPEAT, NoRepeatParams)
def no_repeat_failure_on_bad_node(history: History, p: NoRepeatParams, scenario: Scenario | None) -> CheckResult:
    """no later attempt of the job a fault hit runs on the node it hit while that node is bad

    ``fail`` when a later attempt lands on a bad node; ``unknown`` when no op, no job hit, or no later
    attempt can be judged; ``pass`` with every later attempt's nodes as evidence."""
    verdict = verdict_of(CHECK_NO_REPEAT, p.fault, bound="0 repeats")
    ops = fault_ops(history, p.fault)
    if not ops:
        reason = missing_fault_reason(history, p.fault) if p.fault else "no fault was applied"
        return verdict(status="unknown", reason=reason)
    evidence: list[str] = []
    undecided: list[str] = []
    repeats: list[str] = []
    judged = 0
    for op in ops:
        host = _op_host(op)
        hit = job_hit(history, op, host) if host is not None else None
        if host is None or hit is None:
            where = host if host is not None else "the op's node (it names no host)"
            undecided.append(f"no slurm.job showed a job RUNNING on {where} when {cite(history, op)}")
            continue
        attempts = later_attempts(history, hit, op)
        if not attempts:
            undecided.append(f"job {hit.job_id} never ran again after {cite(history, op)}")
            continue
        judged += 1
        windows = bad_windows(history, op, host)
        for attempt in attempts:
            if host not in job_nodes(attempt):
                evidence.append(f"{_cite_job(history, attempt)}: avoids {host}")
                continue
            why = [w for start, stop, w in windows if start <= attempt.ts_ns < stop]
            if why:
                repeats.append(f"{_cite_job(history, attempt)} on {host} while bad ({'; '.join(why)})")
            else:
                evidence.append(f"{_cite_job(history, attempt)}: on {host} after it was healed and resumed")
    if repeats:
        return verdict(
            status="fail",
            measured=float(len(repeats)),
            reason=f"a later attempt ran on a bad node: {repeats[0]}",
            evidence=capped(repeats + evidence),
        )
    if undecided:
        return verdict(status="unknown", reason="; ".join(undecided), evidence=capped(evidence))
    return verdict(
        status="pass",
        measured=0.0,
        reason=f"no later attempt of the job(s) hit by {judged} op(s) ran on a node while it was bad",
        evidence=capped(evidence),
    )
