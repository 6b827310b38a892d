"""Cross-rank consistency: did the data-parallel replicas hold the same model?

``ranks_agree`` fails a run whose ranks diverged, even when the job exited 0 and every other check passed: a
flip in one rank's optimizer state can leave that rank's weights wrong (or non-finite, so a guard skips every
later step) while the job finishes normally. Its evidence comes from two places:

- the in-job consistency guard (:mod:`chaos.guards.consistency`): ``guard.consistency`` at each check (with
  ``agree``), ``detect.divergence`` when the ranks split, ``detect.nonfinite`` when a rank's parameters hold
  NaN/Inf;
- each rank's final ``target.digest`` (highest attempt, latest on ties): ranks that finished with different
  models disagree, whatever the guard saw.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from chaos.checks._evidence import (
    capped,
    cite,
    events_of,
    fault_ops,
    first_step_hit,
    missing_fault_reason,
    step_of,
    verdict_of,
)
from chaos.checks.base import CheckParams, CheckResult, register_check
from chaos.checks.lineage import final_digests
from chaos.event_kinds import DETECT_DIVERGENCE as DIVERGENCE
from chaos.event_kinds import DETECT_NONFINITE as NONFINITE
from chaos.event_kinds import GUARD_CONSISTENCY as GUARD_RAN
from chaos.history.timeline import Event, History

if TYPE_CHECKING:
    from chaos.spec.scenario import Scenario

CHECK_RANKS_AGREE = "ranks_agree"


class RanksAgreeParams(CheckParams):
    """Which fault the evidence of agreement must follow (default: the last fault applied in the run)."""

    fault: str | None = Field(
        default=None,
        description="a pass needs evidence (an agreeing guard check, or agreeing final digests) after this "
        "fault's last application; null: after the last fault applied, any fault; failures count anywhere",
    )


def _ints(value: object) -> list[int]:
    return [v for v in value if isinstance(v, int) and not isinstance(v, bool)] if isinstance(value, list) else []


def _ranks_text(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def _divergence_problem(event: Event) -> tuple[str, set[int]]:
    odd = _ints(event.data.get("odd_ranks"))
    step = step_of(event)
    at = f" at step {step}" if step is not None else ""
    if odd:
        listed = event.data.get("tensors")
        tensors = [t for t in listed if isinstance(t, str)] if isinstance(listed, list) else []
        where = f" (in {', '.join(tensors[:4])}{' …' if len(tensors) > 4 else ''})" if tensors else ""
        return f"{_ranks_text(odd)} diverged from the others{at}{where}", set(odd)
    raw = event.data.get("groups")
    groups = [_ints(g) for g in raw] if isinstance(raw, list) else []
    split = " | ".join(",".join(map(str, g)) for g in groups) or "?"
    # Without a majority no rank's model is confirmed by the others: every rank counts as wrong.
    return f"the ranks split{at} with no majority (groups {split})", {r for g in groups for r in g}


def _nonfinite_problem(event: Event) -> tuple[str, set[int]]:
    count = event.get_int("count")
    step = step_of(event)
    what = f"{count} non-finite value(s)" if count is not None else "non-finite values"
    return f"rank {event.rank} held {what} in its parameters" + (f" at step {step}" if step is not None else ""), (
        {event.rank} if event.rank is not None else set()
    )


@register_check(
    CHECK_RANKS_AGREE,
    RanksAgreeParams,
    to_add=(
        "add agent = chaos.agent.attach(model, optimizer, ddp=ddp) on every rank (each reports its digest at "
        "exit), or its consistency guard (guard=Guards(consistency_every=N))"
    ),
)
def ranks_agree(history: History, p: RanksAgreeParams, scenario: Scenario) -> CheckResult:
    """the data-parallel ranks held identical, finite parameters (consistency guard, final digests)

    measured = how many ranks were found wrong: diverged, non-finite, or a final digest off the majority
    (every rank of a split without a majority, since none of them is confirmed by the others).

    ``fail`` when any ``detect.divergence`` or ``detect.nonfinite`` was recorded, any guard check disagreed, or
    the ranks' final digests differ. ``pass`` only with evidence of agreement after the last fault applied (or
    after ``fault``'s last application): an agreeing ``guard.consistency`` check that hashed the state after
    the fault (judged by its step, since the guard reports a check one step late), or final digests from at
    least two ranks that are equal. ``unknown`` without such evidence (one rank, guard off and no digests, or the
    named fault never applied).
    """
    verdict = verdict_of(CHECK_RANKS_AGREE, p.fault, bound="== 0 ranks", unit=" rank(s)")
    ops = fault_ops(history, p.fault)
    if p.fault is not None and not ops:
        return verdict(status="unknown", reason=missing_fault_reason(history, p.fault))
    last = ops[-1] if ops else None
    after_ns = last.ts_ns if last is not None else None

    problems: list[str] = []
    evidence: list[str] = []
    wrong: set[int] = set()
    divergences = events_of(history, DIVERGENCE)
    for event in divergences:
        text, ranks = _divergence_problem(event)
        problems.append(text)
        wrong |= ranks
        evidence.append(cite(history, event, event.get_str("message") or ""))
    for event in events_of(history, NONFINITE):
        text, ranks = _nonfinite_problem(event)
        problems.append(text)
        wrong |= ranks
        evidence.append(cite(history, event))
    checks = events_of(history, GUARD_RAN)
    split = [e for e in checks if e.data.get("agree") is False]
    if split and not divergences:  # the guard saw a split but its detection is missing: still a split
        problems.append(f"the consistency guard saw the ranks disagree at step {step_of(split[0])}")
        evidence.append(cite(history, split[0]))
        wrong |= set(_ints(split[0].data.get("odd_ranks")))

    finals = {rank: event for rank, event in final_digests(history).items() if rank is not None}
    by_digest: dict[str, list[int]] = {}
    for rank, event in finals.items():
        by_digest.setdefault(event.get_str("digest") or "", []).append(rank)
    if len(by_digest) > 1:
        groups = sorted(by_digest.values(), key=lambda g: (-len(g), g[0]))
        majority = groups[0] if len(groups[0]) * 2 > len(finals) else []
        wrong |= {r for g in groups if g is not majority for r in g}
        listed = "; ".join(f"{_ranks_text(g)} {(finals[g[0]].get_str('digest') or '')[:12]}" for g in groups)
        problems.append(f"the ranks finished with different models ({listed})")
        evidence.extend(
            cite(history, finals[r], f"final digest {(finals[r].get_str('digest') or '')[:12]}") for r in finals
        )

    if problems:
        return verdict(
            status="fail",
            measured=float(len(wrong)),
            reason="; ".join(problems),
            evidence=capped(evidence),
        )

    since = "" if after_ns is None else " after the last fault" if p.fault is None else f" after {p.fault!r}"
    # The guard reports a check one step late (its exchange is pipelined), so a check reported after the fault may
    # have hashed the state before it: its step tells.
    first_step = 0 if last is None else first_step_hit(history, last)
    agreeing = [
        e
        for e in checks
        if e.data.get("agree") is True
        and (last is None or (e.ts_ns > last.ts_ns and (s := step_of(e)) is not None and s >= first_step))
    ]
    digested = [e for e in finals.values() if after_ns is None or e.ts_ns > after_ns]
    support: list[str] = []
    if agreeing:
        support.append(f"{len(agreeing)} consistency check(s){since} agreed")
        evidence.extend(cite(history, e, f"digest {(e.get_str('digest') or '')[:12]}") for e in agreeing[-3:])
    if len(digested) >= 2:
        support.append(f"{len(digested)} ranks finished with the same model")
        evidence.extend(cite(history, e) for e in digested)
    if support:
        return verdict(status="pass", measured=0.0, reason="; ".join(support), evidence=capped(evidence))
    reason = (
        f"no evidence that the ranks agree{since}: no agreeing guard.consistency check"
        + ("" if not checks else f" (the {len(checks)} check(s) hashed the state before it)")
        + f", and final digests from {len(digested)} rank(s) (2 needed)"
    )
    return verdict(status="unknown", reason=reason, evidence=capped(evidence))
