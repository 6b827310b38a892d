"""``culprit_named``: the hang a fault caused was pinned on the rank the fault hit (``params: {fault: F}``,
optional ``within``).

For every ``fault.applied`` op of fault F: the rank it hit (:func:`chaos.checks._evidence.fault_target`: the op's
own rank, or its params' ``rank``; exactly one rank, else the op cannot be judged) and the FIRST ``detect.hang``
(:mod:`chaos.detect.hang_watch`) strictly after the op and before F's next op whose episode began while the op held
(its ``hung_since_ns``, else its own time, at or before the op's ``fault.healed``; any time when it never
healed): a hang that began after the heal is another episode, not this fault's. The op passes when that
detection names exactly that rank (``culprit_rank`` = the rank and ``culprit_ranks`` = [the rank]) and, with
``within``, came at most ``within`` seconds after the op. It fails when the detection names another rank,
several ranks, or nobody (``all_waiting``: whoever acts on it looks at the wrong place), or when the first
``detect.hang`` after the op, of whatever episode, came later than ``within``. It is ``unknown`` when F never
fired, hit no single rank, or no ``detect.hang`` of its episode followed it (no hang watch: the target needs
``hang_watch:``; or no recorder: the job does not attach the agent). The check: fail when an op fails, else
unknown when an op is unknown, else pass; measured: the slowest op's time to the naming detection (s).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from chaos.checks import _evidence as ev
from chaos.checks.base import CheckParams, CheckResult, register_check
from chaos.checks.latency import latency_result
from chaos.event_kinds import DETECT_HANG
from chaos.history.timeline import Event, History
from chaos.spec.units import Duration

if TYPE_CHECKING:
    from chaos.spec.scenario import Scenario

CHECK_CULPRIT_NAMED = "culprit_named"


class CulpritNamedParams(CheckParams):
    """Parameters of ``culprit_named``."""

    fault: str = Field(description="name of the scenario fault whose every applied op must be pinned on its rank")
    within: Duration | None = Field(
        default=None, gt=0, description="largest allowed time from each fault.applied to the detect.hang; null: any"
    )


def _names(detection: Event) -> list[int]:
    listed = detection.data.get("culprit_ranks")
    ranks = [r for r in listed if isinstance(r, int)] if isinstance(listed, list) else []
    culprit = detection.get_int("culprit_rank")
    return sorted(set(ranks) | ({culprit} if culprit is not None else set()))


def _began(detection: Event) -> int:
    """When the hang ``detection`` reports began (``hung_since_ns``), else the detection's own time."""
    since = detection.get_int("hung_since_ns")
    return since if since is not None else detection.ts_ns


@register_check(CHECK_CULPRIT_NAMED, CulpritNamedParams)
def culprit_named(history: History, p: CulpritNamedParams, scenario: Scenario) -> CheckResult:
    """every hang a fault caused is pinned (detect.hang) on exactly the rank the fault hit

    See the module docstring."""
    result = latency_result(CHECK_CULPRIT_NAMED, p.fault, p.within)
    ops = ev.applied_ops(history, p.fault)
    if not ops:
        return result("unknown", ev.missing_fault_reason(history, p.fault), [])
    hangs = ev.events_of(history, DETECT_HANG)
    failed: list[str] = []
    unknown: list[str] = []
    evidence: list[str] = []
    worst: float | None = None
    for index, op in enumerate(ops):
        end = ops[index + 1].ts_ns if index + 1 < len(ops) else None
        hit = ev.fault_target(history, op, scenario).ranks
        if len(hit) != 1:
            unknown.append(f"op {op.get_str('op')} hit {len(hit)} ranks ({sorted(hit)}): one rank is needed")
            evidence.append(ev.cite(history, op))
            continue
        (rank,) = hit
        after = [h for h in hangs if h.ts_ns > op.ts_ns and (end is None or h.ts_ns < end)]
        evidence.append(ev.cite(history, op, f"hit rank {rank}"))
        latency = ev.seconds(after[0].ts_ns - op.ts_ns) if after else 0.0
        if p.within is not None and latency > p.within:
            # Nothing was named within the bound, whichever episode the first later detection belongs to.
            worst = latency if worst is None else max(worst, latency)
            evidence.append(ev.cite(history, after[0], f"the first detect.hang, {ev.fmt_seconds(latency)} after"))
            failed.append(
                f"no hang was named within {ev.fmt_seconds(p.within)} of op {op.get_str('op')} on rank {rank}"
            )
            continue
        # A detection whose hang began after the heal is a later episode (another fault's, or the job's own):
        # taking it for this op's would credit the watch with a hang it never saw.
        healed = ev.healed_at(history, op, by="op")
        ours = [h for h in after if healed is None or _began(h) <= healed]
        if after and not ours:
            unknown.append(
                f"the {len(after)} detect.hang(s) after op {op.get_str('op')} on rank {rank} all began after its "
                "heal: later episodes, not the hang it caused"
            )
            evidence.extend(ev.cite(history, h, "began after the heal") for h in after[:3])
            continue
        if not ours:
            unknown.append(
                f"no detect.hang after op {op.get_str('op')} on rank {rank}: without a hang watch "
                "(target hang_watch:) or a job that attaches the agent (its flight recorder) nobody was named"
            )
            continue
        first = ours[0]
        latency = ev.seconds(first.ts_ns - op.ts_ns)
        worst = latency if worst is None else max(worst, latency)
        named = _names(first)
        reason = first.get_str("reason") or "?"
        evidence.append(
            ev.cite(history, first, f"named {named or 'nobody'} ({reason}) after {ev.fmt_seconds(latency)}")
        )
        if named != [rank]:
            failed.append(
                f"the hang after op {op.get_str('op')} on rank {rank} was pinned on {named or 'nobody'} ({reason})"
            )
        elif p.within is not None and latency > p.within:
            failed.append(f"rank {rank} was named after {ev.fmt_seconds(latency)}, over {ev.fmt_seconds(p.within)}")
    if failed:
        return result("fail", "; ".join(failed), evidence, worst)
    if unknown:
        return result("unknown", "; ".join(unknown), evidence, worst)
    return result("pass", f"every hang of {p.fault} ({len(ops)} op(s)) was pinned on the rank it hit", evidence, worst)


__all__ = ["CHECK_CULPRIT_NAMED", "CulpritNamedParams", "culprit_named"]
