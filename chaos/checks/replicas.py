"""Replica-aware checks: a job of replica groups that recover one at a time (torchft), not all together.

The evidence is per replica: every ``target.step`` of a replica group carries ``data.replica`` (the ``roles``
target tags each replica's events with it), and a step counts as COMMITTED unless it says
``committed: false`` (torchft's ``optimizer.step`` may decline to commit a step whose all-reduce failed).
``target.role_exit`` {replica, code, expected} says when a replica's processes died; ``target.digest``
{replica, step, digest} is a replica's parameter digest after a step.

- ``survivors_progress`` {fault, max_stall}: while the replica the fault hit is down (from each apply to that
  replica's first committed step after it), every other replica that was committing before the fault keeps
  committing steps, with no gap longer than ``max_stall``, and does not die.
- ``rejoined_within`` {fault, within}: after each apply, the replica it hit commits a step again within
  ``within``, and its first commit after the fault is at a step no lower than the highest step committed
  before it (it healed from a peer; a replica that restarted from scratch and trains alone has not rejoined, and
  one that had committed nothing before the fault has nothing to rejoin: ``unknown``).
- ``replicas_agree`` {fault?, every?}: at every step two or more replicas reported a digest for (with ``fault``:
  every step after the faulted replica rejoined, the rejoined replica among them), the digests are identical.
  ``every: k`` has the attached agent report a digest after every k-th committed step (the plan file's
  ``digest_every``), so a job with the one ``attach`` line is compared step by step, not only at exit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import Field

from chaos.checks._evidence import (
    applied_ops,
    capped,
    cite,
    events_of,
    fault_target,
    fmt_offset,
    fmt_seconds,
    missing_fault_reason,
    seconds,
    step_of,
    verdict_of,
)
from chaos.checks.base import CheckParams, CheckResult, register_check
from chaos.checks.latency import FaultBound, fault_latencies
from chaos.event_kinds import TARGET_DIGEST, TARGET_STEP
from chaos.event_kinds import TARGET_ROLE_EXIT as ROLE_EXIT
from chaos.history.timeline import Event, History
from chaos.spec.units import Duration

if TYPE_CHECKING:
    from chaos.spec.scenario import Scenario

CHECK_SURVIVORS_PROGRESS = "survivors_progress"
CHECK_REJOINED_WITHIN = "rejoined_within"
CHECK_REPLICAS_AGREE = "replicas_agree"


def commits(history: History) -> dict[str, list[Event]]:
    """Committed ``target.step`` events (integer step, ``committed`` not false) per ``data.replica``, in time
    order; steps that name no replica are left out."""
    out: dict[str, list[Event]] = {}
    for event in events_of(history, TARGET_STEP):
        replica = event.get_str("replica")
        if replica is None or step_of(event) is None or event.data.get("committed") is False:
            continue
        out.setdefault(replica, []).append(event)
    return out


@dataclass(frozen=True)
class _Op:
    """One applied op of the fault, the replicas it hit, and when each was back (first commit after it)."""

    op: Event
    victims: tuple[str, ...]
    high_step: int  # the highest step any replica committed at or before the op (-1: none)
    back: dict[str, Event]  # victim -> its first committed step after the op, when that step is >= high_step


def _ops(history: History, ops: list[Event], scenario: object, done: dict[str, list[Event]]) -> list[_Op]:
    found: list[_Op] = []
    for op in ops:
        victims = tuple(sorted(fault_target(history, op, scenario).replicas))
        before = [e for steps in done.values() for e in steps if e.ts_ns <= op.ts_ns]
        high = max((step_of(e) or 0 for e in before), default=-1)
        back: dict[str, Event] = {}
        for victim in victims:
            # Its FIRST commit after the op decides: a healed replica commits the peers' step; one that restarted
            # from scratch commits low steps first (and may climb past the mark later, alone: still not healed).
            first = next((e for e in done.get(victim, []) if e.ts_ns > op.ts_ns), None)
            if first is not None and (step_of(first) or 0) >= high:
                back[victim] = first
        found.append(_Op(op, victims, high, back))
    return found


def _last_ts(history: History) -> int:
    events = history.events
    return max((e.ts_ns for e in events), default=0)


# ---------------------------------------------------------------------------------------------------------
# survivors_progress


class SurvivorsProgressParams(CheckParams):
    """``fault``: the fault that takes a replica down; ``max_stall``: the longest allowed time without a
    committed step of any one surviving replica while the faulted replica is down."""

    fault: str = Field(description="name of the scenario fault that takes one replica (group) down")
    max_stall: Duration = Field(gt=0, description="longest gap between a survivor's committed steps (e.g. 10s)")


@register_check(CHECK_SURVIVORS_PROGRESS, SurvivorsProgressParams)
def survivors_progress(history: History, p: SurvivorsProgressParams, scenario: Scenario | None) -> CheckResult:
    """while a faulted replica is down, every other replica keeps committing steps (no stall over a bound)

    Worst stall of a survivor, in seconds, over the fault's applied ops.

    For an op applied at T hitting replicas V: the down window runs from T to the last of V's first committed
    step after T (see :func:`_ops`), or to the end of the history when one never came back. The survivors are
    the replicas not in V that committed a step at or before T. For each, its stall is the longest of: T to its
    first commit in the window, the gaps between its commits, its last commit to the window's end (a survivor
    that ended cleanly, code 0 or stopped by the harness, is judged up to that exit). ``fail`` when a survivor
    died with another code inside the window, or a stall exceeds ``max_stall``; ``unknown`` when the fault
    never applied, names no replica, or no other replica was committing steps before it."""
    found = fault_latencies(history, CHECK_SURVIVORS_PROGRESS, p.fault, p.max_stall)
    done = commits(history)
    exits = events_of(history, ROLE_EXIT)
    for item in _ops(history, found.ops, scenario, done):
        op = item.op
        if not item.victims:
            found.cannot_judge(f"{cite(history, op)} names no replica (select one with replica: <role>.<i>)")
            continue
        survivors = sorted(r for r, steps in done.items() if r not in item.victims and steps[0].ts_ns <= op.ts_ns)
        if not survivors:
            found.cannot_judge(
                f"no replica other than {', '.join(item.victims)} committed a step before {cite(history, op)}"
            )
            continue
        returned = [item.back.get(v) for v in item.victims]
        end = max(e.ts_ns for e in returned if e is not None) if all(returned) else _last_ts(history)
        found.evidence.append(cite(history, op, f"down: {', '.join(item.victims)}; survivors: {', '.join(survivors)}"))
        found.evidence += [cite(history, e, "back") for e in returned if e is not None]
        worst: tuple[float, Event] | None = None
        for survivor in survivors:
            died = next((e for e in exits if e.get_str("replica") == survivor and op.ts_ns < e.ts_ns <= end), None)
            stop = end
            if died is not None:
                if died.get_int("code") == 0 or died.data.get("expected") is True:
                    stop = died.ts_ns
                else:
                    found.problems.append(
                        f"survivor {survivor} died while {', '.join(item.victims)} was down: {cite(history, died)}"
                    )
                    found.evidence.append(cite(history, died, "a survivor died"))
                    continue
            times = [op.ts_ns, *(e.ts_ns for e in done[survivor] if op.ts_ns < e.ts_ns <= stop), stop]
            gap, start = max((b - a, a) for a, b in zip(times, times[1:], strict=False))
            stall = seconds(gap)
            if worst is None or stall > worst[0]:
                worst = (stall, op)
            found.evidence.append(
                f"{survivor}: {len(times) - 2} committed step(s) while down, longest gap {fmt_seconds(stall)} "
                f"from {fmt_offset(history, start)}"
            )
        if worst is not None:
            found.add(*worst)
    return found.judge(
        too_slow=lambda taken, op: f"a survivor committed no step for {fmt_seconds(taken)} after {cite(history, op)}",
        passed="every survivor kept committing steps while the faulted replica was down",
    )


# ---------------------------------------------------------------------------------------------------------
# rejoined_within


class RejoinedWithinParams(FaultBound):
    """``within`` bounds the time from each fault.applied to the faulted replica's first committed step at or
    above the highest step committed before the fault."""


@register_check(CHECK_REJOINED_WITHIN, RejoinedWithinParams)
def rejoined_within(history: History, p: RejoinedWithinParams, scenario: Scenario | None) -> CheckResult:
    """after each applied op of a fault, the replica it hit is back committing (healed) steps within a bound

    Worst rejoin time, in seconds, over the fault's applied ops and the replicas each hit.

    ``fail`` when a hit replica never commits a step at or above the pre-fault high-water mark although the
    history runs past the bound (its commits below the mark are cited: it trained from scratch instead of
    healing), or the worst time exceeds ``within``; ``unknown`` when the fault never applied, names no
    replica, came before any commit or before the hit replica's first commit (a first join is no rejoin), or the
    history ends before the bound elapsed without a rejoin."""
    found = fault_latencies(history, CHECK_REJOINED_WITHIN, p.fault, p.within)
    done = commits(history)
    missed: list[str] = []
    last = _last_ts(history)
    for item in _ops(history, found.ops, scenario, done):
        op = item.op
        if not item.victims:
            found.cannot_judge(f"{cite(history, op)} names no replica (select one with replica: <role>.<i>)")
            continue
        if item.high_step < 0:
            found.cannot_judge(f"{cite(history, op)} came before any committed step: nothing to rejoin")
            continue
        found.evidence.append(cite(history, op, f"highest committed step before it: {item.high_step}"))
        for victim in item.victims:
            if not any(e.ts_ns <= op.ts_ns for e in done.get(victim, [])):
                # It never committed before the fault: its first commit after it is a first join, not a rejoin.
                found.cannot_judge(f"{victim} committed no step before {cite(history, op)}: it had not joined yet")
                continue
            back = item.back.get(victim)
            if back is not None:
                taken = seconds(back.ts_ns - op.ts_ns)
                found.evidence.append(cite(history, back, f"{victim} back {fmt_seconds(taken)} after the fault"))
                found.add(taken, op)
                continue
            stale = [e for e in done.get(victim, []) if e.ts_ns > op.ts_ns]
            if stale:  # its first commit after the fault was below the mark: definite, however long the history
                found.evidence.append(cite(history, stale[0], f"{victim} committed below step {item.high_step}"))
                missed.append(
                    f"{victim} never rejoined after {cite(history, op)}: its first commit after it was step "
                    f"{step_of(stale[0])}, below step {item.high_step} (it did not heal from a peer)"
                )
            elif seconds(last - op.ts_ns) < p.within:
                found.cannot_judge(
                    f"the history ends {fmt_seconds(seconds(last - op.ts_ns))} after {cite(history, op)}, "
                    f"before {victim} rejoined and before the {fmt_seconds(p.within)} bound"
                )
            else:
                missed.append(
                    f"{victim} never rejoined after {cite(history, op)}: no committed step of it after the fault"
                )
    if missed:
        found.missed = "; ".join(missed)
    return found.judge(
        too_slow=lambda taken, op: f"a replica took {fmt_seconds(taken)} to rejoin after {cite(history, op)}",
        passed="every replica the fault hit was back committing healed steps",
    )


# ---------------------------------------------------------------------------------------------------------
# replicas_agree


class ReplicasAgreeParams(CheckParams):
    """``fault`` (optional): compare only steps after the replica that fault hit rejoined, that replica
    included; without it, every step two or more replicas reported a digest for."""

    fault: str | None = Field(default=None, description="judge the steps after the replica this fault hit rejoined")
    every: int = Field(
        default=0,
        ge=0,
        le=1_000_000,
        description="have each replica's agent report its training state's digest after every k-th committed step "
        "(k; 0: the job's own digests, or the agent's one at exit). Each digest hashes the model and optimizer "
        "state: BENCHMARKS.md 'State digest' has its cost",
    )


@register_check(
    CHECK_REPLICAS_AGREE,
    ReplicasAgreeParams,
    to_add=(
        "add agent = chaos.agent.attach(model, optimizer, manager=manager, ddp=ddp) and every: k here (a digest "
        "every k-th committed step), or emit target.digest {step, digest} per committed step"
    ),
)
def replicas_agree(history: History, p: ReplicasAgreeParams, scenario: Scenario | None) -> CheckResult:
    """replicas hold identical parameters (target.digest) at every step after the rejoin

    Steps compared, over the ``target.digest`` events that name a replica and a step.

    Digests are compared per step within a round: a replica whose step goes back (a job restarted from scratch)
    begins a new round, so step N of a lost run is never compared with step N of its successor.
    ``fail`` at the first step whose replicas' digests differ (the odd replicas named); ``unknown`` when the
    fault never applied or its replica never rejoined, or no step has digests from two replicas (with a fault:
    two replicas, the rejoined one among them, after its rejoin)."""
    verdict = verdict_of(CHECK_REPLICAS_AGREE, p.fault, unit=" steps")
    digests = [
        e
        for e in events_of(history, TARGET_DIGEST)
        if e.get_str("replica") is not None and step_of(e) is not None and e.get_str("digest") is not None
    ]
    since = 0
    must: set[str] = set()
    evidence: list[str] = []
    if p.fault is not None:
        ops = applied_ops(history, p.fault)
        if not ops:
            return verdict(status="unknown", reason=missing_fault_reason(history, p.fault))
        for item in _ops(history, ops, scenario, commits(history)):
            must |= set(item.victims)
            if not item.victims or len(item.back) < len(item.victims):
                return verdict(status="unknown", reason=f"the replica {cite(history, item.op)} hit never rejoined")
            rejoin = max(item.back.values(), key=lambda e: e.ts_ns)
            since = max(since, rejoin.ts_ns)
            evidence.append(cite(history, rejoin, "rejoined"))
    # A replica whose step goes BACK (the whole job restarted from scratch) starts a new round: step N of one
    # round is not step N of another, so digests are compared only within a round.
    last_step: dict[str, int] = {}
    resets: list[int] = []
    for event in digests:
        replica, step = event.get_str("replica") or "", step_of(event) or 0
        if step < last_step.get(replica, -1):
            resets.append(event.ts_ns)
        last_step[replica] = step
    by_step: dict[tuple[int, int], dict[str, Event]] = {}
    for event in digests:
        if event.ts_ns >= since:
            key = (sum(1 for reset in resets if reset <= event.ts_ns), step_of(event) or 0)
            by_step.setdefault(key, {})[event.get_str("replica") or ""] = event  # the latest wins
    compared = {key: seen for key, seen in by_step.items() if len(seen) >= 2 and must <= set(seen)}
    if not compared:
        what = f" after {', '.join(sorted(must))} rejoined, with it among them" if must else ""
        return verdict(status="unknown", reason=f"no step has digests from two replicas{what}", evidence=evidence)
    for key in sorted(compared):
        seen = compared[key]
        step = key[1]
        groups: dict[str, list[str]] = {}
        for replica, event in seen.items():
            groups.setdefault(event.get_str("digest") or "", []).append(replica)
        if len(groups) > 1:
            # the larger group is the reference; on a tie, the group without the rejoined replica is
            majority = max(groups.values(), key=lambda members: (len(members), not set(members) & must))
            odd = sorted(r for members in groups.values() if members is not majority for r in members)
            evidence += [cite(history, seen[r], f"{r}: {seen[r].get_str('digest')}") for r in sorted(seen)]
            return verdict(
                status="fail",
                reason=f"at step {step} replica(s) {', '.join(odd)} hold other parameters than "
                f"{', '.join(sorted(majority))}",
                measured=float(len(compared)),
                evidence=capped(evidence),
            )
    first, last = min(step for _, step in compared), max(step for _, step in compared)
    evidence.append(
        f"{len(compared)} step(s) compared, {first}..{last}, {len({r for s in compared.values() for r in s})} replicas"
    )
    return verdict(
        status="pass",
        reason=f"identical parameters on every replica at all {len(compared)} compared step(s) ({first}..{last})",
        measured=float(len(compared)),
        evidence=capped(evidence),
    )
