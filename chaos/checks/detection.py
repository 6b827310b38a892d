"""``detected_within``: every applied op of a fault is followed, within a bound, by a detection about THAT op.

A detection is an event matching ``by`` (default ``detect.*``) strictly after the op and no later than the fault's
next op; what the op hit is :func:`chaos.checks._evidence.fault_target`. A detection counts when:

1. it localizes (``culprit_rank``; with a null culprit, the ranks it lists) to a rank the op hit. A localization
   to nobody or to other ranks never counts, and fails the check when it is the first detection after the op;
2. else it names what the op hit: a rank, the hit process (``host`` and ``pid``), a replica, or the host hit whole;
3. else it is group-level (``group_kinds``: raised on each survivor) and the op hit a training rank of the job;
4. else, in a job without ranks, it names no subject at all (it speaks for the whole job).

``rank:`` replaces rules 2 to 4 with "reported on that rank". Why these rules, and what each built-in detector
names: ``docs/design/detection-check.md``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Literal

from pydantic import Field, model_validator

from chaos.checks import _evidence as ev
from chaos.checks.base import CheckResult, register_check
from chaos.checks.latency import FaultBound, fault_latencies
from chaos.event_kinds import DETECT_PEER_LOST, TARGET_STEP
from chaos.history.timeline import Event, History

if TYPE_CHECKING:
    from chaos.spec.scenario import Scenario

CHECK_DETECTED_WITHIN = "detected_within"
DEFAULT_KINDS = "detect.*"
GROUP_KINDS = ("detect.collective_*", DETECT_PEER_LOST)
"""Detection kinds the process group raises on each surviving rank: their rank is the reporter, not the culprit."""
IGNORED_SHOWN = 3  # detections cited per op that were not evidence about it

Relation = Literal["names", "group", "job", "wrong", "unrelated"]
COUNTED: tuple[Relation, ...] = ("names", "group", "job")


class DetectedWithinParams(FaultBound):
    """Parameters of ``detected_within``: ``within`` bounds the time from each fault.applied to the first
    detection that is evidence about it (the rule is in :mod:`chaos.checks.detection`)."""

    by: str | None = Field(
        default=None,
        min_length=1,
        description="glob over event kinds that count as a detection (e.g. detect.peer_lost); null: detect.*",
    )
    event: str | None = Field(
        default=None, min_length=1, description="the former name of by, still accepted; give one of the two"
    )
    group_kinds: list[str] = Field(
        default_factory=lambda: list(GROUP_KINDS),
        description="globs of detection kinds a detector raises for the whole process group (a survivor's "
        "collective timeout): they count for any fault that hit a rank of the job, whichever rank reports them",
    )
    rank: int | None = Field(
        default=None,
        ge=0,
        description="count only detections reported on this rank (instead of those naming what the fault hit); "
        "null: the default evidence rule",
    )
    exclusive: bool = Field(
        default=False,
        description="with rank: the FIRST matching detection after the fault must be on that rank (right culprit)",
    )
    within_steps: int | None = Field(
        default=None,
        ge=0,
        description="also bound the training steps from the fault to the detection (the highest target.step "
        "at the fault vs the detection's own step, else the highest step at the detection)",
    )

    @model_validator(mode="after")
    def _one_glob(self) -> DetectedWithinParams:
        if self.by is not None and self.event is not None:
            raise ValueError(f"give by or its former name event, not both (by: {self.by!r}, event: {self.event!r})")
        return self

    @property
    def kinds(self) -> str:
        """The detection glob in force: ``by``, else ``event``, else ``detect.*``."""
        return self.by or self.event or DEFAULT_KINDS


def _listed_ranks(event: Event) -> set[int]:
    """The ranks a detection lists (``ranks``, ``odd_ranks``)."""
    ranks: set[int] = set()
    for key in ("ranks", "odd_ranks"):
        listed = event.data.get(key)
        if isinstance(listed, list):
            ranks.update(item for item in listed if isinstance(item, int) and not isinstance(item, bool))
    return ranks


def _subject_ranks(event: Event, group: bool) -> set[int]:
    """The ranks a detection says it is about (not counting ``culprit_rank``, judged apart)."""
    ranks = _listed_ranks(event)
    if event.rank is not None and not group:  # a group-level detection's rank is its reporter
        ranks.add(event.rank)
    peer = event.get_int("peer")  # the trainer's peer is an address (a string); a rank number names a rank
    if peer is not None:
        ranks.add(peer)
    return ranks


def _names_a_subject(event: Event) -> bool:
    """True when ``event`` says which part of a job it is about (rule 4 of the module docstring)."""
    keys = ("culprit_rank", "ranks", "odd_ranks", "peer", "pid", "backend", "replica", "replicas")
    return event.rank is not None or any(event.data.get(key) is not None for key in keys)


def ranked_job(history: History) -> bool:
    """True when some ``target.*`` event carries a rank: the job has ranks, so rule 4 does not apply."""
    return any(e.rank is not None for e in history.of("target.*"))


def relation(
    event: Event, target: ev.FaultTarget, group_kinds: list[str], *, ranked: bool = True
) -> tuple[Relation, str]:
    """How ``event`` (a detection after the op) relates to the op that hit ``target``, with a note for evidence:
    ``names`` (rules 1-2 of the module docstring), ``group`` (rule 3), ``job`` (rule 4, only when not
    ``ranked``), ``wrong`` (a localization naming nobody or another rank) or ``unrelated``."""
    if "culprit_rank" in event.data:
        culprit = event.get_int("culprit_rank")
        if culprit is not None:
            if culprit in target.ranks:
                return "names", f"localized to rank {culprit}"
            return "wrong", f"localized to rank {culprit}, not {target.describe()}"
        among = _listed_ranks(event)
        if among & target.ranks:
            return "names", f"no single culprit, but it lists rank {min(among & target.ranks)}"
        blamed = "nobody" if not among else "ranks " + ", ".join(str(r) for r in sorted(among))
        return "wrong", f"localized to {blamed}, not {target.describe()}"
    group = any(event.matches(pattern) for pattern in group_kinds)
    named = _subject_ranks(event, group)
    if named & target.ranks:
        return "names", f"names rank {min(named & target.ranks)}"
    pid = event.get_int("pid")
    if pid is not None and (ev.host_of(event), pid) in target.processes:
        return "names", f"names pid {pid} on {ev.host_of(event)}"
    for key in ("replica", "backend"):
        replica = event.get_str(key)
        if replica is not None and replica in target.replicas:
            return "names", f"names replica {replica}"
    listed = event.data.get("replicas")  # several replicas lost at once (torchft's quorum, say)
    if isinstance(listed, list) and set(target.replicas) & {r for r in listed if isinstance(r, str)}:
        return "names", f"names replica {min(set(target.replicas) & {r for r in listed if isinstance(r, str)})}"
    if target.hosts and not named and ev.host_of(event) in target.hosts:
        return "names", f"from host {ev.host_of(event)}, which the fault hit"
    if group and target.ranks:
        return "group", "group-level detection from the job the fault hit"
    if not ranked and not _names_a_subject(event):
        return "job", "names no part of a job without ranks: speaks for the whole job"
    said = [f"rank {r}" for r in sorted(named)]
    said += [f"{key} {value}" for key in ("replica", "backend") if (value := event.get_str(key)) is not None]
    if not said and event.rank is not None:
        said.append(f"reported on rank {event.rank}")
    return "unrelated", f"names {', '.join(said) or 'nothing the fault hit'}, not {target.describe()}"


@register_check(CHECK_DETECTED_WITHIN, DetectedWithinParams)
def detected_within(history: History, p: DetectedWithinParams, scenario: Scenario) -> CheckResult:
    """every applied op of a fault is followed, within a time bound, by a detection naming what it hit

    Worst detection latency over the fault's applied ops, in seconds.

    For each ``fault.applied`` of ``fault``: latency = the first detection that counts as evidence about it
    (module docstring; with ``rank``: the first matching detection reported on that rank) minus the applied
    timestamp. ``pass`` when every op has one and the worst latency is ``<= within``; ``fail`` when an op has
    none (the evidence cites later detections that were about something else), one is too slow, the first
    detection after an op localized it to nobody or the wrong rank, or ``exclusive``/``within_steps`` fail;
    ``unknown`` when the fault was never applied (a fault that silently failed to fire cannot pass).
    """
    found = fault_latencies(history, CHECK_DETECTED_WITHIN, p.fault, p.within)
    ops = found.ops
    matching = ev.events_of(history, p.kinds)
    steps = ev.events_of(history, TARGET_STEP)
    ranked = ranked_job(history)
    undetected: list[tuple[Event, str, list[tuple[Event, str]]]] = []
    for index, op in enumerate(ops):
        target = ev.fault_target(history, op, scenario)
        # The window closes at the fault's next op: a detection after it may be about that op, so it never
        # stands in for an earlier op that went undetected.
        closes = ops[index + 1].ts_ns if index + 1 < len(ops) else None
        if p.rank is not None and not target.ranks:
            # The scenario names the rank: a localization is judged against it when nothing else is known.
            target = replace(target, ranks=frozenset({p.rank}))
        if p.rank is not None:
            where = f"{p.kinds!r} on rank {p.rank}"
        else:
            group = " or comes from its process group" if target.ranks else ""
            where = f"{p.kinds!r} that names {target.describe()}{group}"
        if closes is not None:
            where += f" before the next op at {ev.fmt_offset(history, closes)}"
        # Strictly after: an event at the very same instant cannot have been caused by the fault.
        after = [e for e in matching if op.ts_ns < e.ts_ns and (closes is None or e.ts_ns <= closes)]
        related = [(e, *relation(e, target, p.group_kinds, ranked=ranked)) for e in after]
        if p.rank is not None:
            tied = [e for e, rel, _ in related if e.rank == p.rank and rel != "wrong"]
        else:
            tied = [e for e, rel, _ in related if rel in COUNTED]
        first = tied[0] if tied else None
        counted = {id(e) for e in tied}
        ignored = [
            (e, note) for e, _, note in related if id(e) not in counted and (first is None or e.ts_ns < first.ts_ns)
        ]
        if related and related[0][1] == "wrong":
            earliest, _, note = related[0]
            found.evidence.append(ev.cite(history, earliest, f"first detection after the fault, {note}"))
            found.problems.append(f"the first {p.kinds!r} after {ev.describe(op)} {note}")
        if first is None:
            undetected.append((op, where, ignored))
            found.evidence.append(ev.cite(history, op, f"no event matching {where} after it"))
            found.evidence.extend(ev.cite(history, e, f"ignored: {note}") for e, note in ignored[:IGNORED_SHOWN])
            continue
        latency = ev.seconds(first.ts_ns - op.ts_ns)
        found.evidence.append(ev.cite(history, op))
        found.evidence.extend(ev.cite(history, e, f"ignored: {note}") for e, note in ignored[:IGNORED_SHOWN])
        why = next(note for e, _, note in related if e is first)
        found.evidence.append(
            ev.cite(history, first, f"{ev.fmt_seconds(latency)} after {ev.describe(op) or op.kind}; {why}")
        )
        if p.exclusive and p.rank is not None:
            earliest = after[0]
            if earliest.rank != p.rank:
                found.evidence.append(ev.cite(history, earliest, "first detection, on another rank"))
                found.problems.append(
                    f"the first {p.kinds!r} after {ev.describe(op)} named rank {earliest.rank}, not {p.rank}"
                )
        if p.within_steps is not None:
            at_fault = _highest_step(steps, op.ts_ns)
            at_detection = first.get_int("step")
            if at_detection is None:
                at_detection = _highest_step(steps, first.ts_ns)
            taken = max(0, (at_detection or 0) - (at_fault or 0))
            found.evidence.append(
                f"{taken} step(s) from the fault (step {at_fault}) to the detection (step {at_detection})"
            )
            if taken > p.within_steps:
                found.problems.append(f"detection of {ev.describe(op)} came {taken} steps later, over {p.within_steps}")
        found.add(latency, op)

    if undetected:
        missed_op, where, ignored = undetected[0]
        found.missed = (
            f"{len(undetected)} of {len(ops)} op(s) of {p.fault!r} were never detected: no event matching "
            f"{where} after {ev.describe(missed_op)} at {ev.fmt_offset(history, missed_op.ts_ns)}"
        )
        if ignored:
            first_ignored, note = ignored[0]
            found.missed += (
                f"; {len(ignored)} later detection(s) were about something else, e.g. {first_ignored.kind} "
                f"at {ev.fmt_offset(history, first_ignored.ts_ns)} ({note})"
            )
    return found.judge(
        too_slow=lambda latency, op: f"detection of {ev.describe(op)} took {ev.fmt_seconds(latency)}",
        passed=f"all {len(ops)} op(s) of {p.fault!r} detected",
        worst_op=ev.describe,
    )


def _highest_step(steps: list[Event], before_ns: int) -> int | None:
    """The highest ``target.step`` reported at or before ``before_ns`` (None before the first step)."""
    reached = [step for e in steps if e.ts_ns <= before_ns and (step := e.get_int("step")) is not None]
    return max(reached) if reached else None
