"""Helpers shared by the built-in checks: finding fault ops, ordering events, citing them as evidence, and the
check's result with its fixed fields (:func:`verdict_of`) and, for a value held to a maximum, its pass or fail
(:func:`at_most`).

Everything here is a pure function of a :class:`~chaos.history.timeline.History` (or of events), so checks stay
testable offline. Evidence strings follow one shape, ``"<kind> <what> at +<seconds since start>s"``, for
example ``"fault.applied kill-rank1 (op 3) at +12.301s"``, so a reader can find the event in the timeline.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial

from pydantic import BaseModel

from chaos.checks.base import CheckResult
from chaos.event_kinds import FAULT_APPLIED, FAULT_FAILED, FAULT_HEALED, FAULT_NOT_FIRED, TARGET_START, TARGET_STEP
from chaos.history.timeline import Event, History
from chaos.spec.serving import REPLICA_RANKS, ServingTarget

MAX_EVIDENCE = 20
"""Evidence lists are cut to this many lines (plus a "... N more" line) so reports stay readable."""


def _content_key(event: Event) -> tuple[int, str, int, int, str, str]:
    # A total order on event content: History sorts by ts only (stably), so two events with the same
    # ts_ns would otherwise keep their input order and a check could depend on how events were fed in.
    return (
        event.ts_ns,
        event.kind,
        0 if event.rank is None else 1,
        event.rank if event.rank is not None else 0,
        event.source,
        json.dumps(event.data, sort_keys=True, default=str),
    )


def ordered(events: Iterable[Event]) -> list[Event]:
    """``events`` sorted by time, ties broken by content, so results never depend on input order."""
    return sorted(events, key=_content_key)


def events_of(history: History, pattern: str) -> list[Event]:
    """Events whose kind matches the glob ``pattern``, in :func:`ordered` order."""
    return ordered(history.of(pattern))


def origin_ns(history: History) -> int:
    """The timeline's zero: the first event's timestamp (0 for an empty history)."""
    events = history.events
    return events[0].ts_ns if events else 0


def seconds(delta_ns: int) -> float:
    """Nanoseconds as float seconds."""
    return delta_ns / 1e9


def fmt_offset(history: History, ts_ns: int) -> str:
    """``ts_ns`` as an offset from the history's first event, e.g. ``+12.301s``."""
    return f"+{seconds(ts_ns - origin_ns(history)):.3f}s"


def fmt_seconds(value: float) -> str:
    """A duration for reasons and bounds, e.g. ``2.5s`` (no trailing zeros beyond what is needed)."""
    return f"{value:.3f}".rstrip("0").rstrip(".") + "s"


def attempt_of(event: Event) -> int:
    """The restart attempt an event belongs to; events without one belong to the first attempt (0)."""
    attempt = event.get_int("attempt")
    return 0 if attempt is None else attempt


def step_of(event: Event) -> int | None:
    """``data.step`` as an int, or None."""
    return event.get_int("step")


def describe(event: Event) -> str:
    """The few fields that identify an event in a sentence (fault name and op, rank, step, attempt)."""
    parts: list[str] = []
    fault = event.get_str("fault")
    if fault is not None:
        op = event.data.get("op")
        parts.append(fault if op is None else f"{fault} (op {op})")
    if event.rank is not None:
        parts.append(f"rank {event.rank}")
    step = step_of(event)
    if step is not None:
        parts.append(f"step {step}")
    if event.get_int("attempt") is not None:
        parts.append(f"attempt {attempt_of(event)}")
    detector = event.get_str("detector")
    if detector is not None:
        parts.append(f"by {detector}")
    code = event.get_int("code")
    if code is not None:
        parts.append(f"code {code}")
    return " ".join(parts)


def cite(history: History, event: Event, note: str = "") -> str:
    """One evidence line for ``event``: ``"<kind> <describe> at +<offset>s[; note]"``."""
    what = describe(event)
    text = (
        f"{event.kind} {what} at {fmt_offset(history, event.ts_ns)}"
        if what
        else (f"{event.kind} at {fmt_offset(history, event.ts_ns)}")
    )
    return f"{text}; {note}" if note else text


def capped(lines: Sequence[str], limit: int = MAX_EVIDENCE) -> list[str]:
    """``lines`` cut to ``limit`` entries plus a count of the rest, so a Poisson storm stays readable."""
    if len(lines) <= limit:
        return list(lines)
    return [*lines[:limit], f"... {len(lines) - limit} more"]


def label(check: str, fault: str | None = None) -> str:
    """The result name: ``check[fault]`` when a fault is named (the scenario loader's default label)."""
    return check if fault is None else f"{check}[{fault}]"


Verdict = Callable[..., CheckResult]
"""A ``CheckResult`` with the check's fixed fields (check, name, bound, unit) already bound: :func:`verdict_of`."""


def verdict_of(check: str, fault: str | None = None, *, bound: str | None = None, unit: str = "") -> Verdict:
    """``CheckResult`` bound to the check ``check`` (of ``fault``): its name (:func:`label`), ``bound`` and
    ``unit``; the check adds status, reason, measured and evidence when it judges (and may override the rest)."""
    return partial(CheckResult, check=check, name=label(check, fault), bound=bound, unit=unit)


def at_most(verdict: Verdict, measured: float, most: float, reason: str, over: str, evidence: list[str]) -> CheckResult:
    """``pass`` when ``measured`` <= ``most``, else ``fail``: ``reason``, followed on a fail by ``", over the
    <over>"`` (e.g. ``0.05 bound``); ``evidence`` as given (the caller caps it)."""
    ok = measured <= most
    return verdict(
        status="pass" if ok else "fail",
        measured=measured,
        evidence=evidence,
        reason=reason + ("" if ok else f", over the {over}"),
    )


def applied_ops(history: History, fault: str) -> list[Event]:
    """Every ``fault.applied`` event of the fault named ``fault``, in time order (one per applied op)."""
    return [e for e in events_of(history, FAULT_APPLIED) if e.get_str("fault") == fault]


def fault_ops(history: History, fault: str | None) -> list[Event]:
    """:func:`applied_ops` of ``fault``; with None, every ``fault.applied`` of any fault, in time order."""
    return applied_ops(history, fault) if fault is not None else events_of(history, FAULT_APPLIED)


def healed_at(history: History, op: Event, by: str) -> int | None:
    """When ``op`` healed: the time of the first ``fault.healed`` of its fault after it whose ``by`` field (``"op"``:
    the op id, ``"host"``) is ``op``'s, or is absent on either; None when it never healed."""
    mine = op.get_str(by)
    for healed in events_of(history, FAULT_HEALED):
        if healed.ts_ns <= op.ts_ns or healed.get_str("fault") != op.get_str("fault"):
            continue
        if mine is None or healed.get_str(by) in (None, mine):
            return healed.ts_ns
    return None


def missing_fault_reason(history: History, fault: str) -> str:
    """Why a check about ``fault`` cannot judge: it never applied; says whether it failed or what else fired."""
    reason = f"fault {fault!r} was never applied: no fault.applied event names it"
    failed = [e for e in events_of(history, FAULT_FAILED) if e.get_str("fault") == fault]
    if failed:
        error = failed[0].get_str("error") or failed[0].get_str("message")
        reason += f"; it failed {len(failed)} time(s)" + (f" ({error})" if error else "")
    waiting = [e for e in events_of(history, FAULT_NOT_FIRED) if e.get_str("fault") == fault]
    if waiting:  # the trigger never came: why, and what would make it come (chaos.run.triggers)
        reason += f"; it never fired: {waiting[0].get_str('reason')}"
    others = sorted({name for e in events_of(history, FAULT_APPLIED) if (name := e.get_str("fault"))})
    if others:
        # A typo in the check's fault name is the commonest cause; listing what did fire makes it obvious.
        reason += f"; faults that were applied: {', '.join(others)}"
    return reason


def step_events(history: History) -> list[Event]:
    """All ``target.step`` events that carry an integer step, in time order."""
    return [e for e in events_of(history, TARGET_STEP) if step_of(e) is not None]


def first_step_hit(history: History, op: Event) -> int:
    """The first step whose state the fault ``op`` may have changed: the op's own step for an in-job fault (it
    fires inside that step, so that step's end state already holds its effect), else the step after the highest
    ``target.step`` reported by the op's time."""
    own = step_of(op)
    if own is not None:
        return own
    reached = [s for e in step_events(history) if e.ts_ns <= op.ts_ns and (s := step_of(e)) is not None]
    return max(reached, default=0) + 1


# ---------------------------------------------------------------------------------------------------------
# What a fault op hit: the subject that evidence about it must name.

LOCAL_HOST = "local"
"""The harness's own host: the ``host`` of a fault applied here, and of every event that carries no ``host``
(only events from remote hosts are tagged with one)."""


def host_of(event: Event) -> str:
    """``data.host``, or :data:`LOCAL_HOST` when the event carries none."""
    return event.get_str("host") or LOCAL_HOST


@dataclass(frozen=True)
class FaultTarget:
    """What one applied op of a fault hit, as far as its ``fault.applied`` event and the scenario tell.

    ``ranks``: training ranks hit (a process fault's rank, an in-job fault's rank, or every rank that ran on a
    host hit as a whole); ``processes``: (host, pid) of those ranks when the op was applied, from their latest
    ``target.start``; ``replicas``: serving replicas hit; ``hosts``: hosts hit AS A WHOLE (a network, storage,
    node or container fault, or processes selected by command line), empty for a fault aimed at a process.
    """

    ranks: frozenset[int] = frozenset()
    processes: frozenset[tuple[str, int]] = frozenset()
    replicas: frozenset[str] = frozenset()
    hosts: frozenset[str] = frozenset()

    def describe(self) -> str:
        """E.g. ``rank 1``, ``host h3 (rank 2)``, ``replica primary (rank 0)``, ``pid 42 on local``; ``nothing
        known`` when empty."""
        ranks = ", ".join(str(r) for r in sorted(self.ranks))
        rank_text = f"rank{'s' if len(self.ranks) > 1 else ''} {ranks}" if self.ranks else ""
        if self.hosts:
            where = f"host{'s' if len(self.hosts) > 1 else ''} {', '.join(sorted(self.hosts))}"
        elif self.replicas:
            where = f"replica{'s' if len(self.replicas) > 1 else ''} {', '.join(sorted(self.replicas))}"
        elif rank_text:
            return rank_text
        elif self.processes:
            return "pid " + ", ".join(f"{pid} on {host}" for host, pid in sorted(self.processes))
        else:
            return "nothing known"
        return f"{where} ({rank_text})" if rank_text else where


def fault_params(scenario: object, fault: str) -> BaseModel | None:
    """The params model of the scenario's fault named ``fault``; None when there is no scenario (offline tests
    pass None or a stand-in), no such fault, or the entry carries no params."""
    for spec in getattr(scenario, "faults", None) or ():
        if getattr(spec, "name", None) == fault:
            params = getattr(spec, "params", None)
            return params if isinstance(params, BaseModel) else None
    return None


def _int_field(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def fault_target(history: History, op: Event, scenario: object) -> FaultTarget:
    """What ``op`` (a ``fault.applied`` event) hit.

    Read, in order: the op's own rank (an in-job fault reports where it fired) and any ``rank``/``ranks``/
    ``replica``/``pid`` it carries; then the scenario's params of the fault (``rank``, ``replica``, ``pid`` of a
    process selector, a tensor or gradient fault); on the reference serving stack a replica and its rank
    (``REPLICA_RANKS``) name each other. When none of these names a process the fault hit the op's
    host as a whole (``data.host``, else :data:`LOCAL_HOST`): its ranks are those whose latest ``target.start``
    at or before the op ran there. A rank's process is its latest ``target.start`` pid at or before the op.
    """
    ranks: set[int] = set()
    replicas: set[str] = set()
    pids: set[int] = set()
    host = host_of(op)
    if op.rank is not None:
        ranks.add(op.rank)
    if (rank := op.get_int("rank")) is not None:
        ranks.add(rank)
    listed = op.data.get("ranks")
    if isinstance(listed, list):
        ranks.update(r for item in listed if (r := _int_field(item)) is not None)
    if (replica := op.get_str("replica")) is not None:
        replicas.add(replica)
    if (pid := op.get_int("pid")) is not None:
        pids.add(pid)
    params = fault_params(scenario, op.get_str("fault") or "")
    if params is not None:
        if (rank := _int_field(getattr(params, "rank", None))) is not None:
            ranks.add(rank)
        replica_param = getattr(params, "replica", None)
        if isinstance(replica_param, str):
            replicas.add(replica_param)
        if (pid := _int_field(getattr(params, "pid", None))) is not None:
            pids.add(pid)
    if isinstance(getattr(scenario, "target", None), ServingTarget):
        # The reference serving stack runs each replica's model server as a rank: an in-job fault on rank 0
        # hit the primary, and a fault on the primary hit rank 0.
        replicas |= {name for name, rank in REPLICA_RANKS.items() if rank in ranks}
        ranks |= {REPLICA_RANKS[name] for name in replicas if name in REPLICA_RANKS}
    starts = [e for e in events_of(history, TARGET_START) if e.rank is not None and e.ts_ns <= op.ts_ns]
    latest: dict[int, Event] = {}
    for start in starts:  # time-ordered: the latest start of each rank wins
        if start.rank is not None:
            latest[start.rank] = start
    whole_host = not ranks and not replicas and not pids
    if whole_host:
        ranks = {rank for rank, start in latest.items() if host_of(start) == host}
    else:  # a fault aimed at a pid hit a rank when that pid was the rank's process
        ranks |= {rank for rank, start in latest.items() if host_of(start) == host and start.get_int("pid") in pids}
    processes = {(host, pid) for pid in pids}
    for rank in ranks:
        began = latest.get(rank)
        if began is not None and (pid := began.get_int("pid")) is not None:
            processes.add((host_of(began), pid))
    return FaultTarget(
        ranks=frozenset(ranks),
        processes=frozenset(processes),
        replicas=frozenset(replicas),
        hosts=frozenset({host}) if whole_host else frozenset(),
    )
