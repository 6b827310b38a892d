"""The check safety suite: the project's mutation test of its own judges ("no false passes").

For EVERY registered check, :data:`TABLE` holds hypothesis strategies of histories in which the check's property
holds (the verdict must be ``pass``) and, per way of breaking it, histories that violate it (the verdict must be
``fail``, or ``unknown`` where the history cannot tell, as each :class:`Violation` says). A check registered
without an entry fails :func:`test_every_registered_check_has_an_entry`, so a new judge cannot ship untested.
:func:`rejections` lists, per check, the violations it is shown to reject.

Training histories come from the simulator in ``test_checks_properties`` (W ranks in lockstep, checkpoints,
kills of rank W-1 with a ``detect.worker_exit``, restarts that resume from the last checkpoint); serving ones
from the load builders in ``test_serving_checks``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, cast

import pytest
from checkpoint_histories import CHECKPOINT
from hang_histories import HANG
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from link_histories import FAULT as LFAULT
from link_histories import LinkRun, link_runs, wrong_pair
from rendezvous_histories import RENDEZVOUS
from replica_histories import FAULT as RFAULT
from replica_histories import ReplicaRun
from rollback_histories import ROLLBACK
from slurm_histories import FAULT as SFAULT
from slurm_histories import SlurmRun, slurm_runs
from storage_histories import STORAGE_RECOVERY
from stream_histories import STREAMS
from test_checks_properties import FAULT, Run, mutate_steps, runs
from test_serving_checks import FLIP, KILL, RATE, SECOND, _events, bitflip, kill_events, load, scenario
from test_serving_checks import ev as sev

from chaos.checks.base import CheckResult, Status
from chaos.checks.progress import GAP_SLACK_S
from chaos.history.timeline import Event, History
from chaos.plugins.registry import checks
from injectors.process.faults import KillParams

MS = 1_000_000
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))


@dataclass(frozen=True)
class Case:
    """One history to judge, with the check's params and the scenario (None, or a stand-in)."""

    events: list[Event]
    params: dict[str, Any] = field(default_factory=dict)
    scenario: Any = None


@dataclass(frozen=True)
class Violation:
    """One way of breaking a check's property, the histories that do it, and the verdict they must get."""

    what: str
    cases: st.SearchStrategy[Case]
    expect: Status = "fail"


@dataclass(frozen=True)
class Entry:
    holds: st.SearchStrategy[Case]
    violations: tuple[Violation, ...]


def judge(check: str, case: Case) -> CheckResult:
    spec = checks()[check]
    return spec.evaluate(History.from_events(case.events), spec.Params.model_validate(case.params), case.scenario)


def at(event: Event, ts_ns: int) -> Event:
    return event.model_copy(update={"ts_ns": ts_ns})


def edited(event: Event, **data: Any) -> Event:
    return event.model_copy(update={"data": {**event.data, **data}})


def kinds(events: list[Event], kind: str) -> list[Event]:
    return [e for e in events if e.kind == kind]


# ---------------------------------------------------------------------------------------------------------
# training: detection, recovery, lost work, completion, progress (the simulator)

KILLED = runs(min_kills=1)


@dataclass(frozen=True)
class Sim:
    """A simulated run as the check sees it: the events and the scenario they are judged under."""

    run: Run
    events: list[Event]
    scenario: Any = None


def recorded(run: Run, by_runner: bool) -> Sim:
    """``run`` with its fault.applied events as the in-job agent records them (on the killed rank) or, when
    ``by_runner``, as the runner does (no rank, ``host: local``; the scenario's kill params name the rank)."""
    if not by_runner:
        return Sim(run, run.events)
    events = [
        e.model_copy(update={"rank": None, "data": {**e.data, "host": "local"}}) if e.kind == "fault.applied" else e
        for e in run.events
    ]
    fault = SimpleNamespace(name=FAULT, params=KillParams(rank=run.world - 1))
    return Sim(run, events, SimpleNamespace(faults=[fault]))


SIMS = st.tuples(KILLED, st.booleans()).map(lambda a: recorded(*a))


def detection_of(sim: Sim, op: Event) -> Event:
    """The simulator's detect.worker_exit that follows ``op``."""
    return next(e for e in kinds(sim.events, "detect.worker_exit") if e.ts_ns > op.ts_ns)


@st.composite
def one_op(draw: st.DrawFn) -> tuple[Sim, Event, Event]:
    """A run with kills, one of its ops, and that op's own detection."""
    sim = draw(SIMS)
    op = draw(st.sampled_from(kinds(sim.events, "fault.applied")))
    return sim, op, detection_of(sim, op)


def _other_rank(sim: Sim) -> int:
    """A rank other than the killed one (W-1): rank 0, or rank 1 in a world of one."""
    return sim.run.world % max(sim.run.world, 2)


def _replaced(sim: Sim, old: Event, *new: Event) -> Case:
    return Case([e for e in sim.events if e is not old] + list(new), DETECTED, sim.scenario)


def _worst_detection(sim: Sim) -> float:
    return max((detection_of(sim, op).ts_ns - op.ts_ns) / SECOND for op in kinds(sim.events, "fault.applied"))


def _mislocalized(sim: Sim, op: Event, nobody: bool) -> Case:
    culprit = None if nobody else _other_rank(sim)
    wrong = Event(ts_ns=op.ts_ns + 1, kind="detect.sdc", rank=0, data={"culprit_rank": culprit})
    return Case([*sim.events, wrong], DETECTED, sim.scenario)


DETECTED = {"fault": FAULT, "within": "1h"}
DETECTED_WITHIN = Entry(
    holds=SIMS.map(lambda sim: Case(sim.events, DETECTED, sim.scenario)),
    violations=(
        Violation(
            "an op is never followed by a detection (the next op's detection does not stand in for it)",
            one_op().map(lambda t: _replaced(t[0], t[2])),
        ),
        Violation(
            "the only detection after an op is a straggler warning naming another rank",
            one_op().map(
                lambda t: _replaced(
                    t[0], t[2], Event(ts_ns=t[2].ts_ns, kind="detect.straggler", rank=_other_rank(t[0]))
                )
            ),
        ),
        Violation(
            "the first detection after an op localizes it to nobody or to another rank",
            st.tuples(one_op(), st.booleans()).map(lambda a: _mislocalized(a[0][0], a[0][1], a[1])),
        ),
        Violation(
            "an op's only detection comes at the very instant of the fault",
            one_op().map(lambda t: _replaced(t[0], t[2], at(t[2], t[1].ts_ns))),
        ),
        Violation(
            "a detection comes later than the bound",
            SIMS.map(lambda sim: Case(sim.events, {"fault": FAULT, "within": _worst_detection(sim) / 2}, sim.scenario)),
        ),
        Violation(
            "the fault never applied",
            SIMS.map(lambda sim: Case([e for e in sim.events if e.kind != "fault.applied"], DETECTED, sim.scenario)),
            expect="unknown",
        ),
    ),
)


def _high_before(run: Run, op: Event) -> int:
    return max(e.get_int("step") or 0 for e in kinds(run.events, "target.step") if e.ts_ns <= op.ts_ns)


def _stepped_first(run: Run) -> bool:
    first = min(e.ts_ns for e in kinds(run.events, "fault.applied"))
    return any(e.ts_ns <= first for e in kinds(run.events, "target.step"))


def _worst_recovery(run: Run) -> float:
    worst = 0.0
    for op in kinds(run.events, "fault.applied"):
        high = _high_before(run, op)
        past = min(
            e.ts_ns for e in kinds(run.events, "target.step") if e.ts_ns > op.ts_ns and (e.get_int("step") or 0) > high
        )
        worst = max(worst, (past - op.ts_ns) / SECOND)
    return worst


def _never_past(run: Run, op: Event) -> list[Event]:
    high = _high_before(run, op)
    return [
        e
        for e in run.events
        if not (e.kind == "target.step" and e.ts_ns > op.ts_ns and (e.get_int("step") or 0) > high)
    ]


RECOVERABLE = KILLED.filter(_stepped_first)


@st.composite
def stuck(draw: st.DrawFn) -> Case:
    """After one op, no step beyond the highest step reached before it (replays only)."""
    run = draw(RECOVERABLE)
    return Case(_never_past(run, draw(st.sampled_from(kinds(run.events, "fault.applied")))), RECOVERED)


@st.composite
def hit_inside_a_step(draw: st.DrawFn) -> Case:
    """An op fired by the job's agent inside step S+1 (its data.step; trigger.phase): afterwards steps reach S+1
    (a peer finishing the step the fault hit, or a replay) and never go beyond it."""
    run = draw(RECOVERABLE)
    op = draw(st.sampled_from(kinds(run.events, "fault.applied")))
    hit = _high_before(run, op) + 1
    kept: list[Event] = []
    finished = False
    for e in run.events:
        if e is op:
            kept.append(edited(e, step=hit))
        elif e.kind == "target.step" and e.ts_ns > op.ts_ns:
            if not finished:  # the first step after it: a peer finishing the step the fault hit
                kept.append(edited(e, step=hit))
                finished = True
            elif (e.get_int("step") or 0) <= hit:
                kept.append(e)
        else:
            kept.append(e)
    return Case(kept, RECOVERED)


RECOVERED = {"fault": FAULT, "within": "1d"}
RECOVERED_WITHIN = Entry(
    holds=RECOVERABLE.map(lambda run: Case(run.events, RECOVERED)),
    violations=(
        Violation(
            "after an op training only replays steps and never passes its pre-fault highest step",
            stuck(),
        ),
        Violation(
            "a fault fired inside a step (trigger.phase): only a peer finishing that step follows, never beyond it",
            hit_inside_a_step(),
        ),
        Violation(
            "progress past the pre-fault step comes later than the bound",
            RECOVERABLE.map(lambda run: Case(run.events, {"fault": FAULT, "within": _worst_recovery(run) / 2})),
        ),
        Violation(
            "the fault never applied",
            RECOVERABLE.map(lambda run: Case([e for e in run.events if e.kind != "fault.applied"], RECOVERED)),
            expect="unknown",
        ),
    ),
)


def _from_scratch(run: Run) -> list[Event]:
    """The final attempt keeps claiming its checkpoint in target.resume but trains from step 1 again."""
    shift = run.final_resume
    return mutate_steps(run, run.final_attempt, lambda e: edited(e, step=(e.get_int("step") or 0) - shift))


LOST_WORK = Entry(
    holds=KILLED.map(lambda run: Case(run.events, {"steps": run.interval})),
    violations=(
        Violation(
            "a restart recomputes more steps than the bound",
            KILLED.filter(lambda run: run.max_recomputed >= 1).map(
                lambda run: Case(run.events, {"steps": run.max_recomputed - 1})
            ),
        ),
        Violation(
            "a restart claims its checkpoint in target.resume but trains again from step 1",
            KILLED.filter(lambda run: run.final_resume >= 1).map(
                lambda run: Case(_from_scratch(run), {"steps": run.max_recomputed})
            ),
        ),
        Violation(
            "no fault applied, so no work could have been lost",
            runs().map(lambda run: Case([e for e in run.events if e.kind != "fault.applied"], {"steps": 0})),
            expect="unknown",
        ),
        Violation(
            "no step was recorded",
            KILLED.map(lambda run: Case([e for e in run.events if e.kind != "target.step"], {"steps": 100})),
            expect="unknown",
        ),
    ),
)


def _last_exit(run: Run, **data: Any) -> list[Event]:
    return [edited(e, **data) if e.kind == "target.exit" else e for e in run.events]


def _stopped(run: Run) -> list[Event]:
    """The harness stopped the job (``runner.stop``) just before its (clean-looking) last exit."""
    last = run.events[-1]
    stop = Event(ts_ns=last.ts_ns - 1, kind="runner.stop", data={"reason": "max_duration 60s reached"})
    return [*run.events, stop]


# completes: another helper is teaching it to tell "the job failed" from "the harness stopped it" (runner.stop);
# these generators pin the contract in the tree today and will be extended with it.
COMPLETES = Entry(
    holds=runs().map(lambda run: Case(run.events)),
    violations=(
        Violation(
            "the job's last exit code is not 0",
            st.tuples(runs(), st.integers(-64, 255).filter(bool)).map(lambda a: Case(_last_exit(a[0], code=a[1]))),
        ),
        Violation(
            "a clean exit is followed by a failed one (the last exit counts)",
            st.tuples(runs(), st.integers(1, 255)).map(
                lambda a: Case(
                    [*a[0].events, Event(ts_ns=a[0].events[-1].ts_ns + MS, kind="target.exit", data={"code": a[1]})]
                )
            ),
        ),
        Violation("the harness stopped the job before it finished", runs().map(lambda run: Case(_stopped(run)))),
        Violation(
            "the job's end was never recorded",
            runs().map(lambda run: Case([e for e in run.events if e.kind != "target.exit"])),
            expect="unknown",
        ),
        Violation(
            "the last target.exit carries no code",
            runs().map(lambda run: Case(_last_exit(run, code=None))),
            expect="unknown",
        ),
    ),
)


def watched(timeout: float | None) -> Any:
    """A scenario stand-in: ``progress`` reads only ``safety.no_progress_timeout``."""
    return SimpleNamespace(safety=SimpleNamespace(no_progress_timeout=timeout))


@st.composite
def stalled(draw: st.DrawFn) -> Case:
    """Every event after one step (the last one too: then the stall is before the exit) shifted later by more
    than the timeout and its slack, and nothing recorded."""
    run = draw(runs())
    cut = draw(st.sampled_from(sorted({e.ts_ns for e in kinds(run.events, "target.step")})))
    gap = round(draw(st.floats(60.0 + GAP_SLACK_S + 0.01, 600.0)) * SECOND)
    return Case([e if e.ts_ns <= cut else at(e, e.ts_ns + gap) for e in run.events], {}, watched(60.0))


def _no_progress(run: Run) -> list[Event]:
    end = run.events[-1].ts_ns
    return [
        *run.events,
        Event(ts_ns=end + 1, kind="runner.no_progress", data={"seconds": 61.0, "step": run.total}),
        Event(ts_ns=end + 2, kind="runner.end", data={"reason": "no progress: no target.step for 60s"}),
    ]


PROGRESS = Entry(
    holds=runs().map(lambda run: Case(run.events, {}, watched(60.0))),
    violations=(
        Violation(
            "the runner ended the run for lack of progress",
            runs().map(lambda run: Case(_no_progress(run), {}, watched(60.0))),
        ),
        Violation("steps stopped for longer than the timeout, though no runner.no_progress was recorded", stalled()),
        Violation(
            "nobody watched (no_progress_timeout: null)",
            runs().map(lambda run: Case(run.events, {}, watched(None))),
            expect="unknown",
        ),
    ),
)


# ---------------------------------------------------------------------------------------------------------
# training: lineage and silent data corruption


def _repeated(run: Run) -> list[Event]:
    """The final attempt's first step re-trains the samples of another committed step."""
    first = run.final_resume + 1
    other = run.final_resume if run.final_resume >= 1 else first + 1
    donor = {e.rank: e.data["samples"] for e in kinds(run.events, "target.step") if e.get_int("step") == other}
    return mutate_steps(
        run, run.final_attempt, lambda e: edited(e, samples=donor[e.rank]) if e.get_int("step") == first else e
    )


def _skipped(run: Run) -> list[Event]:
    first = run.final_resume + 1
    return mutate_steps(run, run.final_attempt, lambda e: None if e.get_int("step") == first else e)


EXACTLY_ONCE = Entry(
    holds=runs().map(lambda run: Case(run.events)),
    violations=(
        Violation(
            "a resumed attempt re-trains samples another committed step already trained",
            runs().filter(lambda run: (run.final_resume or 2) <= run.total).map(lambda run: Case(_repeated(run))),
        ),
        Violation(
            "a committed step is missing from the lineage",
            runs().filter(lambda run: run.final_resume + 2 <= run.total).map(lambda run: Case(_skipped(run))),
        ),
        Violation(
            "no step reports the samples it trained",
            runs().map(
                lambda run: Case([edited(e, samples=None) if e.kind == "target.step" else e for e in run.events])
            ),
            expect="unknown",
        ),
    ),
)

DIGEST = "f" * 64  # the simulator's final digest
OTHER_DIGESTS = st.text("0123456789abcdef", min_size=64, max_size=64).filter(lambda d: d != DIGEST)


def with_golden(run: Run, digest: str = DIGEST) -> list[Event]:
    golden = Event(ts_ns=run.events[0].ts_ns, kind="runner.golden", data={"digest": digest, "step": run.total})
    return [golden, *run.events]


def rank_off(run: Run, digest: str) -> list[Event]:
    """Every rank reports the golden digest at the end but the highest one, which reports ``digest``."""
    last = run.events[-1].ts_ns

    def reported(rank: int) -> Event:
        final = DIGEST if rank < run.world - 1 else digest
        data = {"digest": final, "step": run.total, "attempt": run.final_attempt}
        return Event(ts_ns=last - 1, kind="target.digest", rank=rank, source="target", data=cast(Any, data))

    return [*with_golden(run), *(reported(r) for r in range(1, run.world))]


# matches_golden / step_blocked / sdc_detected: another helper is changing them (every rank's digest, masked
# faults); these generators pin the contract in the tree today and will be extended with it.
MATCHES_GOLDEN = Entry(
    holds=runs().map(lambda run: Case(with_golden(run))),
    violations=(
        Violation(
            "the final digest differs from the golden run's",
            st.tuples(runs(), OTHER_DIGESTS).map(lambda a: Case(with_golden(a[0], a[1]))),
        ),
        Violation(
            "a rank other than 0 ends with another digest",
            st.tuples(runs().filter(lambda run: run.world > 1), OTHER_DIGESTS).map(lambda a: Case(rank_off(*a))),
        ),
        Violation(
            "the golden run's digest was not recorded", runs().map(lambda run: Case(run.events)), expect="unknown"
        ),
        Violation(
            "the job never reported its final digest",
            runs().map(lambda run: Case([e for e in with_golden(run) if e.kind != "target.digest"])),
            expect="unknown",
        ),
    ),
)

STEP_BLOCKED = Entry(
    holds=KILLED.map(lambda run: Case(with_golden(run), {"fault": FAULT})),
    violations=(
        Violation(
            "the fault fired and a corrupted update reached the model (final digest != golden)",
            st.tuples(KILLED, OTHER_DIGESTS).map(lambda a: Case(with_golden(a[0], a[1]), {"fault": FAULT})),
        ),
        Violation(
            "the fault fired and one rank other than 0 ends with a corrupted model",
            st.tuples(KILLED.filter(lambda run: run.world > 1), OTHER_DIGESTS).map(
                lambda a: Case(rank_off(*a), {"fault": FAULT})
            ),
        ),
        Violation(
            "the fault never fired (a clean model then proves nothing)",
            KILLED.map(lambda run: Case([e for e in with_golden(run) if e.kind != "fault.applied"], {"fault": FAULT})),
            expect="unknown",
        ),
    ),
)

SDC = "flip"


@dataclass(frozen=True)
class Corruption:
    """An in-job fault on ``rank`` at ``step`` of a ``world``-rank run; ``within`` is the steps a detection may lag."""

    events: list[Event]
    world: int
    rank: int
    step: int
    within: int

    def detection(self, delay: int, **data: Any) -> Event:
        """A checksum detection ``delay`` steps after the fault, reported on the faulted rank."""
        return Event(
            ts_ns=when(self.step + delay) + 20 * MS,
            kind="detect.sdc",
            rank=self.rank,
            data={"detector": "checksum", "step": self.step + delay, **data},
        )

    def case(self, *extra: Event) -> Case:
        return Case([*self.events, *extra], {"fault": SDC, "within_steps": self.within})


def when(step: int) -> int:
    """Step ``step`` is reported at step x 0.1 s."""
    return step * 100 * MS


@st.composite
def corruption(draw: st.DrawFn) -> Corruption:
    world = draw(st.integers(2, 4))
    rank, step, within = draw(st.integers(0, world - 1)), draw(st.integers(2, 40)), draw(st.integers(0, 3))
    events = [
        Event(ts_ns=when(s), kind="target.step", rank=r, data={"step": s})
        for s in range(1, step + 6)
        for r in range(world)
    ]
    applied = {"fault": SDC, "op": f"{SDC}#1", "injector": "grad_corrupt", "step": step}
    events.append(Event(ts_ns=when(step) + 10 * MS, kind="fault.applied", rank=rank, source="target", data=applied))
    return Corruption(events, world, rank, step, within)


@st.composite
def caught(draw: st.DrawFn) -> Case:
    """A corruption detected within its bound, naming the faulted rank."""
    fault = draw(corruption())
    return fault.case(fault.detection(draw(st.integers(0, fault.within)), culprit_rank=fault.rank))


SDC_DETECTED = Entry(
    holds=caught(),
    violations=(
        Violation("no detection at all", corruption().map(lambda f: f.case())),
        Violation(
            "the detection comes more than within_steps steps late",
            corruption().map(lambda f: f.case(f.detection(f.within + 1, culprit_rank=f.rank))),
        ),
        Violation(
            "the detection localizes the corruption to another rank",
            corruption().map(lambda f: f.case(f.detection(0, culprit_rank=(f.rank + 1) % f.world))),
        ),
        Violation(
            "the detection's localization names nobody",
            corruption().map(lambda f: f.case(f.detection(0, culprit_rank=None))),
        ),
        Violation(
            "the only detection precedes the fault",
            corruption().map(lambda f: f.case(at(f.detection(0, culprit_rank=f.rank), when(f.step)))),
        ),
        Violation(
            "the fault never applied",
            corruption().map(lambda f: Case([e for e in f.events if e.kind != "fault.applied"], {"fault": SDC})),
            expect="unknown",
        ),
    ),
)


@st.composite
def alarms(draw: st.DrawFn, *, golden: list[str], early: bool) -> Case:
    """A fault at 10 s, detections after it, a golden run that raised ``golden``; one more before it if ``early``."""
    kinds_after = draw(
        st.lists(st.sampled_from(["detect.sdc", "detect.sdc_retry", "detect.collective_error"]), max_size=4)
    )
    events = [Event(ts_ns=0, kind="runner.golden", data={"digest": DIGEST, "detections": cast(Any, golden)})]
    events.append(Event(ts_ns=10 * SECOND, kind="fault.applied", data={"fault": SDC, "op": 1}))
    events += [Event(ts_ns=11 * SECOND + i, kind=kind, rank=0) for i, kind in enumerate(kinds_after)]
    if early:
        events.append(
            Event(ts_ns=draw(st.integers(1, 10 * SECOND - 1)), kind="detect.sdc", rank=draw(st.integers(0, 3)))
        )
    return Case(events)


NO_FALSE_POSITIVES = Entry(
    holds=alarms(golden=["detect.collective_error"], early=False),
    violations=(
        Violation("the golden (fault-free) run raised an alarm", alarms(golden=["detect.sdc"], early=False)),
        Violation("an alarm came before the first fault", alarms(golden=[], early=True)),
        Violation(
            "the golden run's detections were not recorded",
            alarms(golden=[], early=False).map(lambda c: Case([e for e in c.events if e.kind != "runner.golden"])),
            expect="unknown",
        ),
    ),
)


# ---------------------------------------------------------------------------------------------------------
# serving (the load builders): a constant 50 req/s load; request i is sent at i / 50 s

Outcome = tuple[int | str, str | None]
OUTCOMES = st.lists(
    st.tuples(st.sampled_from([200, 200, 200, 503, 500, "timeout"]), st.sampled_from(["primary", "fallback"])),
    min_size=5,
    max_size=120,
)


def is_ok(status: int | str) -> bool:
    return isinstance(status, int) and 200 <= status < 400


def served(outcome: Callable[[float], Outcome], *extra: Event, duration: float = 20.0, **kw: Any) -> list[Event]:
    return [*load(outcome, duration=duration, **kw), *extra]


def kill_at(t: float) -> Event:
    return sev(t, "fault.applied", "runner", fault=KILL, op="op-1", injector="kill", host="local")


@st.composite
def failover(draw: st.DrawFn) -> tuple[float, float]:
    """(apply time, seconds until the fallback answers)."""
    return draw(st.floats(2.0, 8.0)), draw(st.floats(0.2, 4.0))


def switched(t0: float, delay: float, back: float | None = None) -> Callable[[float], Outcome]:
    def outcome(t: float) -> Outcome:
        if t < t0 or (back is not None and t >= back):
            return 200, "primary"
        return (503, "gateway") if t < t0 + delay else (200, "fallback")

    return outcome


def share_case(outcomes: list[Outcome], **params: Any) -> Case:
    return Case(_events(outcomes), params, scenario())


def bad_share(outcomes: list[Outcome]) -> float:
    return sum(not is_ok(s) for s, _ in outcomes) / len(outcomes)


def fallback_of(outcomes: list[Outcome]) -> float:
    ok = [b for s, b in outcomes if is_ok(s)]
    return sum(b == "fallback" for b in ok) / len(ok)


def _quantile(latencies: list[float], q: float) -> float:
    """The nearest-rank quantile, as the check defines it."""
    ordered = sorted(latencies)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


@st.composite
def latencies(draw: st.DrawFn) -> tuple[list[float], float]:
    values = draw(st.lists(st.floats(0.001, 0.9), min_size=3, max_size=60))
    return values, draw(st.sampled_from([0.5, 0.9, 0.99, 1.0]))


def latency_case(values: list[float], q: float, bound: float) -> Case:
    events = load(lambda t: (200, "primary"), duration=len(values) / RATE, latency=lambda t: values[round(t * RATE)])
    return Case(events, {"q": q, "max": bound}, scenario())


@st.composite
def blocks(draw: st.DrawFn) -> list[str]:
    """Ok answers in alternating runs of 3..30 requests (primary first): len(runs) - 1 real switches."""
    sizes = draw(st.lists(st.integers(3, 30), min_size=2, max_size=8))
    return [("primary", "fallback")[i % 2] for i, size in enumerate(sizes) for _ in range(size)]


def flap_case(backends: list[str], limit: int) -> Case:
    return Case(_events([(200, b) for b in backends]), {"max_switches": limit}, scenario(reference=False))


def switches_of(backends: list[str]) -> int:
    return sum(a != b for a, b in zip(backends, backends[1:], strict=False))


FAILBACK_REF = 9.5  # kill_events(): serving.backend_up of the primary
KILLED_LOAD = kill_events()  # the kill at 5 s, the primary's replica_start at 7 s and backend_up at 9.5 s


def back_at(t_back: float | None) -> Callable[[float], Outcome]:
    return lambda t: (200, "fallback") if 5.0 <= t and (t_back is None or t < t_back) else (200, "primary")


def premium_case(failed: int, shed: bool, bound: float) -> Case:
    """Window 10..15 s: every 4th request is premium (63 of them); ``failed`` of those fail (their i // 4 runs
    over 63 consecutive values, so ``% 63`` picks exactly ``failed``); the others are shed (503) if ``shed``."""

    def outcome(i: int) -> Outcome:
        t, premium = i / RATE, i % 4 == 0
        if premium:
            return (503, "gateway") if 10 <= t < 15 and (i // 4) % 63 < failed else (200, "primary")
        return (503, "gateway") if shed and 10 <= t < 15 and i % 2 else (200, "primary")

    events = load(lambda t: (200, "primary"), priority=lambda i: "premium" if i % 4 == 0 else "free")
    events = [
        edited(e, status=outcome(i)[0], backend=outcome(i)[1]) if (i := e.get_int("i")) is not None else e
        for e in events
    ]
    return Case(events, {"start": 10, "end": 15, "max_error_rate": bound}, scenario())


WRONG = scenario(faults=((FLIP, None),))
SERVING: dict[str, Entry] = {
    "error_rate": Entry(
        holds=OUTCOMES.map(lambda o: share_case(o, max=bad_share(o))),
        violations=(
            Violation(
                "more requests failed than the bound allows",
                OUTCOMES.filter(lambda o: bad_share(o) > 0).map(lambda o: share_case(o, max=bad_share(o) - 1 / len(o))),
            ),
            Violation(
                "the fault whose window is judged never applied",
                OUTCOMES.map(lambda o: share_case(o, fault=KILL, max=1.0)),
                expect="unknown",
            ),
        ),
    ),
    "latency": Entry(
        holds=latencies().map(lambda a: latency_case(a[0], a[1], _quantile(a[0], a[1]))),
        violations=(
            Violation(
                "the quantile is above the bound",
                latencies()
                .filter(lambda a: _quantile(*a) > 0.002)
                .map(lambda a: latency_case(a[0], a[1], _quantile(*a) - 0.001)),
            ),
            Violation(
                "the stack stopped answering: every request timed out",
                # load() records a timeout at the client's 1 s timeout, as the generator does
                st.integers(5, 60).map(
                    lambda n: Case(
                        load(lambda t: ("timeout", None), duration=n / RATE), {"q": 0.5, "max": 0.5}, scenario()
                    )
                ),
            ),
        ),
    ),
    "failover_within": Entry(
        holds=failover().map(
            lambda f: Case(served(switched(*f), kill_at(f[0])), {"fault": KILL, "within": f[1] + 0.1}, scenario())
        ),
        violations=(
            Violation(
                "no other backend ever answers after the fault",
                failover().map(
                    lambda f: Case(
                        served(switched(f[0], 100.0), kill_at(f[0])), {"fault": KILL, "within": "1h"}, scenario()
                    )
                ),
            ),
            Violation(
                "the first fallback answer comes later than the bound",
                failover().map(
                    lambda f: Case(
                        served(switched(*f), kill_at(f[0])), {"fault": KILL, "within": f[1] / 2 - 0.03}, scenario()
                    )
                ),
            ),
            Violation(
                "the fault never applied",
                failover().map(lambda f: Case(served(switched(*f)), {"fault": KILL, "within": "1h"}, scenario())),
                expect="unknown",
            ),
        ),
    ),
    "fallback_share": Entry(
        holds=OUTCOMES.filter(lambda o: any(is_ok(s) for s, _ in o)).map(
            lambda o: share_case(o, min=fallback_of(o), max=fallback_of(o))
        ),
        violations=(
            Violation(
                "fewer answers came from the fallback than min",
                OUTCOMES.filter(lambda o: any(is_ok(s) for s, _ in o) and fallback_of(o) < 1).map(
                    lambda o: share_case(o, min=min(1.0, fallback_of(o) + 1e-6))
                ),
            ),
            Violation(
                "more answers came from the fallback than max",
                OUTCOMES.filter(lambda o: any(is_ok(s) for s, _ in o) and fallback_of(o) > 0).map(
                    lambda o: share_case(o, max=fallback_of(o) - 1e-6)
                ),
            ),
            Violation(
                "nothing answered, so no share can be told",
                st.integers(5, 50).map(lambda n: share_case([(503, "gateway")] * n, min=0.5)),
                expect="unknown",
            ),
        ),
    ),
    "failback_within": Entry(
        holds=st.floats(FAILBACK_REF, 15.0).map(
            lambda b: Case(
                served(back_at(b), *KILLED_LOAD),
                {"fault": KILL, "since": "backend_up", "within": b - FAILBACK_REF + 0.1},
                scenario(),
            )
        ),
        violations=(
            Violation(
                "traffic never comes back to the primary",
                st.just(
                    Case(
                        served(back_at(None), *KILLED_LOAD),
                        {"fault": KILL, "since": "backend_up", "within": "1h"},
                        scenario(),
                    )
                ),
            ),
            Violation(
                "traffic comes back later than the bound",
                st.floats(FAILBACK_REF + 0.5, 15.0).map(
                    lambda b: Case(
                        served(back_at(b), *KILLED_LOAD),
                        {"fault": KILL, "since": "backend_up", "within": (b - FAILBACK_REF) / 2},
                        scenario(),
                    )
                ),
            ),
            Violation(
                "the fault never applied",
                st.just(Case(served(back_at(12.0)), {"fault": KILL, "within": "1h"}, scenario())),
                expect="unknown",
            ),
        ),
    ),
    "no_flapping": Entry(
        holds=blocks().map(lambda b: flap_case(b, switches_of(b))),
        violations=(
            Violation(
                "traffic switched backends more often than allowed",
                blocks().map(lambda b: flap_case(b, switches_of(b) - 1)),
            ),
            Violation(
                "traffic alternates request by request",
                st.integers(20, 100).map(lambda n: flap_case([("primary", "fallback")[i % 2] for i in range(n)], 2)),
            ),
            Violation(
                "fewer than two answers name a backend",
                st.integers(1, 30).map(lambda n: Case(_events([(503, "gateway")] * n), {}, scenario(reference=False))),
                expect="unknown",
            ),
        ),
    ),
    "wrong_answers_detected": Entry(
        holds=st.floats(5.05, 15.0).map(lambda d: Case(bitflip(d), {"fault": FLIP}, WRONG)),
        violations=(
            Violation("the corruption is never detected", st.just(Case(bitflip(None), {"fault": FLIP}, WRONG))),
            Violation(
                "the detection comes later than the bound",
                st.floats(16.0, 19.0).map(lambda d: Case(bitflip(d), {"fault": FLIP}, WRONG)),
            ),
            Violation(
                "the only detection names another backend",
                st.floats(5.05, 15.0).map(
                    lambda d: Case(
                        [edited(e, backend="fallback") if e.kind == "detect.wrong_answer" else e for e in bitflip(d)],
                        {"fault": FLIP},
                        WRONG,
                    )
                ),
            ),
            Violation(
                "the fault never applied",
                st.floats(5.05, 15.0).map(
                    lambda d: Case([e for e in bitflip(d) if e.kind != "fault.applied"], {"fault": FLIP}, WRONG)
                ),
                expect="unknown",
            ),
        ),
    ),
    "priority_preserved": Entry(
        holds=st.integers(0, 10).map(lambda n: premium_case(n, shed=True, bound=n / 63)),
        violations=(
            Violation(
                "the priority's error rate is over the bound while others are shed",
                st.integers(1, 20).map(lambda n: premium_case(n, shed=True, bound=(n - 1) / 63)),
            ),
            Violation(
                "nothing else was shed, so preserving the priority was never tested",
                st.integers(0, 10).map(lambda n: premium_case(n, shed=False, bound=0.5)),
                expect="unknown",
            ),
        ),
    ),
}

# ---------------------------------------------------------------------------------------------------------
# ranks_agree: W ranks, an in-job fault on one of them, the consistency guard every E steps (reported one step
# late, as the pipelined guard does) and each rank's final digest


@dataclass(frozen=True)
class Replicas:
    world: int
    rank: int  # the faulted rank
    step: int  # the fault's step
    every: int
    steps: int

    def fault(self) -> Event:
        return Event(
            ts_ns=when(self.step), kind="fault.applied", rank=self.rank, data={"fault": SDC, "step": self.step}
        )

    def check(self, step: int, **data: Any) -> Event:
        # reported at the end of the next step
        fields: dict[str, Any] = {"step": step, "agree": True, "digest": DIGEST[:32], "odd_ranks": [], **data}
        return Event(ts_ns=when(step + 1) + 1, kind="guard.consistency", rank=0, data=fields)

    def checks(self) -> list[Event]:
        return [self.check(s) for s in range(self.every, self.steps + 1, self.every)]

    def finals(self, digest: str = DIGEST, odd: int | None = None) -> list[Event]:
        return [
            Event(
                ts_ns=when(self.steps + 2),
                kind="target.digest",
                rank=r,
                data={"digest": digest if r != odd else "0" * 64},
            )
            for r in range(self.world)
        ]

    def case(self, *events: Event) -> Case:
        return Case([self.fault(), *events])


@st.composite
def replicas(draw: st.DrawFn) -> Replicas:
    world = draw(st.integers(2, 4))
    every = draw(st.integers(1, 10))
    step = draw(st.integers(1, 40))
    steps = draw(st.integers(step + every, step + 4 * every))  # at least one check after the fault
    return Replicas(world, draw(st.integers(0, world - 1)), step, every, steps)


def _divergence(r: Replicas) -> Event:
    step = -(-r.step // r.every) * r.every  # the first check at or after the fault
    data = {"step": step, "odd_ranks": [r.rank], "culprit_rank": r.rank, "groups": [[r.rank]]}
    return Event(ts_ns=when(step + 1) + 2, kind="detect.divergence", rank=r.rank, data=cast(Any, data))


RANKS_AGREE = Entry(
    holds=replicas().flatmap(
        lambda r: st.sampled_from([r.case(*r.checks()), r.case(*r.finals()), r.case(*r.checks(), *r.finals())])
    ),
    violations=(
        Violation("the guard detected a divergence", replicas().map(lambda r: r.case(*r.checks(), _divergence(r)))),
        Violation(
            "a rank held non-finite parameters",
            replicas().map(
                lambda r: r.case(
                    *r.checks(),
                    *r.finals(),
                    Event(ts_ns=when(r.step) + 1, kind="detect.nonfinite", rank=r.rank, data={"step": r.step}),
                )
            ),
        ),
        Violation("one rank finished with another model", replicas().map(lambda r: r.case(*r.finals(odd=r.rank)))),
        Violation(
            "a guard check disagreed, without its detection",
            replicas().map(lambda r: r.case(r.check(r.steps, agree=False, odd_ranks=[r.rank]))),
        ),
        Violation(
            "no evidence after the fault: only a check that hashed the state before it, one rank's digest",
            replicas().filter(lambda r: r.step > 1).map(lambda r: r.case(r.check(r.step - 1), r.finals()[0])),
            expect="unknown",
        ),
    ),
)


# ---------------------------------------------------------------------------------------------------------
# replica groups (torchft-like): survivors_progress, rejoined_within, replicas_agree (the simulator in
# replica_histories)


@st.composite
def replica_runs(draw: st.DrawFn) -> ReplicaRun:
    replicas = draw(st.integers(2, 3))
    period = draw(st.sampled_from([0.2, 0.5, 1.0]))
    fault_at = draw(st.floats(3.0, 6.0))
    down = 5 * period + draw(st.floats(0.5, 3.0))  # longer than a survivor's max_stall (3 periods) plus 2
    back = fault_at + down
    return ReplicaRun(replicas, draw(st.integers(0, replicas - 1)), period, fault_at, back, back + 5.0)


def _replica_case(run: ReplicaRun, **params: Any) -> Case:
    return Case(run.events(), params, run.scenario())


def _stall(run: ReplicaRun) -> dict[str, Any]:
    return {"fault": RFAULT, "max_stall": 3 * run.period}


def _within(run: ReplicaRun) -> dict[str, Any]:
    assert run.back_at is not None
    return {"fault": RFAULT, "within": run.back_at - run.fault_at + run.period + 0.5}


SURVIVORS_PROGRESS = Entry(
    holds=replica_runs().map(lambda r: _replica_case(r, **_stall(r))),
    violations=(
        Violation(
            "a survivor died while the faulted replica was down",
            replica_runs().map(lambda r: _replica_case(r.but(survivor_dies_at=r.fault_at + r.period), **_stall(r))),
        ),
        Violation(
            "a survivor stalled past max_stall while the faulted replica was down",
            replica_runs().map(
                lambda r: _replica_case(r.but(survivor_stalls=(r.fault_at, r.fault_at + 4.5 * r.period)), **_stall(r))
            ),
        ),
        Violation(
            "the fault never applied",
            replica_runs().map(lambda r: _replica_case(r.but(applied=False), **_stall(r))),
            expect="unknown",
        ),
    ),
)

REJOINED_WITHIN = Entry(
    holds=replica_runs().map(lambda r: _replica_case(r, **_within(r))),
    violations=(
        Violation(
            "the replica came back after the bound",
            replica_runs().map(lambda r: _replica_case(r, fault=RFAULT, within=(r.back_at or 0) - r.fault_at - 1.0)),
        ),
        Violation(
            "the replica restarted from scratch instead of healing from a peer",
            replica_runs().map(lambda r: _replica_case(r.but(from_scratch=True), **_within(r))),
        ),
        Violation(
            "the replica never came back",
            replica_runs().map(lambda r: _replica_case(r.but(back_at=None), **_within(r))),
        ),
        Violation(
            "the replica had committed nothing before the fault: its first commit is a first join, not a rejoin",
            replica_runs().map(lambda r: _replica_case(r.but(victim_joined=False), **_within(r))),
            expect="unknown",
        ),
    ),
)

REPLICAS_AGREE = Entry(
    holds=replica_runs().map(lambda r: _replica_case(r, fault=RFAULT)),
    violations=(
        Violation(
            "the rejoined replica kept stale parameters",
            replica_runs().map(lambda r: _replica_case(r.but(stale_digest=True), fault=RFAULT)),
        ),
        Violation(
            "the replica never rejoined: nothing to compare after it",
            replica_runs().map(lambda r: _replica_case(r.but(back_at=None), fault=RFAULT)),
            expect="unknown",
        ),
    ),
)


# ---------------------------------------------------------------------------------------------------------
# restarts_at_most: the launchers' restart counts (workers found in their trees, restart lines, ranks' reports)


@st.composite
def launcher_runs(draw: st.DrawFn) -> tuple[list[Event], int]:
    """Two workers per host on 1-3 hosts over their launchers' rounds (a target.restart with its cause before each
    later round), and the highest restart count of any host (the restarts used: hosts are not added up)."""
    tops = draw(st.lists(st.integers(0, 3), min_size=1, max_size=3))
    events: list[Event] = []
    t = SECOND
    for h, top in enumerate(tops):
        host = f"h{h}"
        for r in range(top + 1):
            if r:
                data: dict[str, Any] = {"restart": r, "host": host, "cause": "rank 1 died of SIGKILL (exitcode -9)"}
                events.append(Event(ts_ns=t, kind="target.restart", source="process_tree", data=data))
            for local in range(2):
                data = {"local_rank": local, "pid": 1000 * h + 10 * r + local, "host": host, "restart": r}
                worker = Event(ts_ns=t, kind="target.worker", source="process_tree", rank=2 * h + local, data=data)
                events.append(worker)
            t += SECOND
    return events, max(tops)


def _unseen_round(events: list[Event], used: int) -> list[Event]:
    """The launcher of h0 logged one more restart whose workers no scan saw: ``L/M attempts left`` precedes
    restart M - L + 1 = used + 1."""
    data: dict[str, Any] = {"state": "FAILED", "attempts_left": 1, "max_restarts": used + 1, "host": "h0"}
    return [*events, Event(ts_ns=events[-1].ts_ns + MS, kind="target.agent_restart", source="torchrun", data=data)]


def _own_report(events: list[Event], used: int) -> list[Event]:
    """A rank reported (target.start) a restart count above every scan's."""
    data: dict[str, Any] = {"pid": 77, "attempt": used + 1, "host": "h0"}
    return [*events, Event(ts_ns=events[-1].ts_ns + MS, kind="target.start", source="target", rank=0, data=data)]


RESTARTS = Entry(
    holds=st.tuples(launcher_runs(), st.integers(0, 2)).map(lambda a: Case(a[0][0], {"restarts": a[0][1] + a[1]})),
    violations=(
        Violation(
            "a launcher used more restarts than allowed",
            launcher_runs().filter(lambda run: run[1] > 0).map(lambda run: Case(run[0], {"restarts": run[1] - 1})),
        ),
        Violation(
            "only the launcher's log shows the restart over the bound (no scan saw that round)",
            launcher_runs().map(lambda run: Case(_unseen_round(*run), {"restarts": run[1]})),
        ),
        Violation(
            "only a rank's own target.start shows the restart over the bound",
            launcher_runs().map(lambda run: Case(_own_report(*run), {"restarts": run[1]})),
        ),
        Violation(
            "nothing shows the launchers' restart count",
            st.integers(0, 3).map(
                lambda n: Case([Event(ts_ns=SECOND, kind="target.step", rank=0, data={"step": 1})], {"restarts": n})
            ),
            expect="unknown",
        ),
    ),
)


# ---------------------------------------------------------------------------------------------------------
# Slurm (the slurm target's slurm.job / slurm.node events; the simulator in slurm_histories): node_drained_within,
# requeued_within, no_repeat_failure_on_bad_node


def _slurm(run: SlurmRun, **params: Any) -> Case:
    return Case(run.events(), {"fault": SFAULT, **params})


def _drain_bound(run: SlurmRun) -> dict[str, Any]:
    return {"within": (run.drain_after or 0) + 0.1, "by": "health_check"}


def _rerun_bound(run: SlurmRun) -> dict[str, Any]:
    return {"within": (run.rerun_after or 0) + 0.1}


def _unbound(run: SlurmRun) -> dict[str, Any]:
    return {}


def _slurm_broken(
    what: str, bound: Callable[[SlurmRun], dict[str, Any]], expect: Status = "fail", **changes: Any
) -> Violation:
    """``what``: Slurm runs with ``changes`` made (a value may be a function of the run), judged with the
    params ``bound(run)`` of the unchanged run."""

    def case(run: SlurmRun) -> Case:
        changed = {key: value(run) if callable(value) else value for key, value in changes.items()}
        return _slurm(run.but(**changed), **bound(run))

    return Violation(what, slurm_runs().map(case), expect)


NODE_DRAINED = Entry(
    holds=slurm_runs().map(lambda r: _slurm(r, **_drain_bound(r))),
    violations=(
        _slurm_broken("the hit node is never drained", lambda r: {"within": 20.5}, drain_after=None),
        _slurm_broken("the drain comes later than the bound", lambda r: {"within": (r.drain_after or 0) / 2}),
        _slurm_broken("another node is drained, not the one the fault hit", _drain_bound, drained_node="h3"),
        _slurm_broken(
            "by: health_check, but the node was drained by someone else",
            _drain_bound,
            drain_reason="operator: looked odd",
        ),
        _slurm_broken("no slurm.node event: the nodes were never observed", _drain_bound, "unknown", node_events=False),
        _slurm_broken(
            "the hit node was first seen after the fault, already drained (maybe before the fault)",
            _drain_bound,
            "unknown",
            seen_before_fault=False,
        ),
        _slurm_broken("the fault never applied", _drain_bound, "unknown", with_fault=False),
    ),
)

REQUEUED = Entry(
    holds=slurm_runs().map(lambda r: _slurm(r, **_rerun_bound(r))),
    violations=(
        _slurm_broken("the job ended FAILED instead of being requeued", _rerun_bound, end_state="FAILED"),
        _slurm_broken("the job is RUNNING again later than the bound", lambda r: {"within": (r.rerun_after or 0) / 2}),
        _slurm_broken("the job was requeued but never ran again", _rerun_bound, rerun_after=None),
        _slurm_broken("only a new job id ran (a resubmission, not a requeue)", _rerun_bound, new_job_id=8),
        _slurm_broken("the fault did not interrupt the job at all", _rerun_bound, requeue_after=None),
        _slurm_broken("no slurm.job event: the job was never observed", _rerun_bound, "unknown", job_events=False),
        _slurm_broken("the fault never applied", _rerun_bound, "unknown", with_fault=False),
    ),
)

NO_REPEAT = Entry(
    holds=st.one_of(
        slurm_runs().map(lambda r: _slurm(r)),
        # back on the hit node only after the fault healed and the node was resumed
        slurm_runs().map(
            lambda r: _slurm(
                r.but(
                    heal_after=(r.rerun_after or 0) - 0.6,
                    resume_after=(r.rerun_after or 0) - 0.5,
                    drain_after=min(r.drain_after or 0, (r.rerun_after or 0) - 0.7),
                    rerun=(r.hit, "h3"),
                )
            )
        ),
    ),
    violations=(
        _slurm_broken(
            "the requeued job lands on the hit node while it is still drained",
            _unbound,
            rerun=lambda r: (r.hit, "h3"),
            heal_after=None,
        ),
        _slurm_broken(
            "the node was never drained (no health check) and the job lands on it while the fault is active",
            _unbound,
            drain_after=None,
            rerun=lambda r: (r.hit, r.survivor),
        ),
        _slurm_broken("the job never ran again", _unbound, "unknown", rerun_after=None),
        _slurm_broken("the fault never applied", _unbound, "unknown", with_fault=False),
    ),
)


def _link(run: LinkRun, **params: Any) -> Case:
    return Case(run.events(), {"fault": LFAULT, **params}, run.scenario)


LINK_NAMED = Entry(
    link_runs().map(lambda r: _link(r, small_ok=True)),
    (
        Violation(
            "the probe names a pair the fault did not hit", link_runs().map(lambda r: _link(r.but(named=wrong_pair(r))))
        ),
        Violation(
            "the probe names the hit pair and a wrong one",
            link_runs().map(lambda r: _link(r.but(named=(*r.pairs_hit(), *wrong_pair(r))))),
        ),
        Violation(
            "the probe saw a dead link, not a silent drop",
            link_runs().map(lambda r: _link(r.but(small_ok=False), small_ok=True)),
        ),
        Violation(
            "a probe round during the fault found every link fine", link_runs().map(lambda r: _link(r.but(named=())))
        ),
        Violation(
            "the probes were sent after the heal",
            link_runs().map(lambda r: _link(r.but(probe_offset=r.duration))),
            "unknown",
        ),
        Violation(
            "no all_waiting hang, so no probe ran", link_runs().map(lambda r: _link(r.but(hang_after=None))), "unknown"
        ),
        Violation("the fault never applied", link_runs().map(lambda r: _link(r.but(with_fault=False))), "unknown"),
    ),
)

STALLED = Entry(
    link_runs().map(_link),
    (
        Violation("the job kept stepping during the fault", link_runs().map(lambda r: _link(r.but(steps_during=2)))),
        Violation("the job crashed during the fault", link_runs().map(lambda r: _link(r.but(crash_during=True)))),
        Violation(
            "the job had exited before the fault: nothing was there to stall",
            link_runs().map(lambda r: _link(r.but(exited_before=0.5))),
            "unknown",
        ),
        Violation(
            "the job reported no step before the fault",
            link_runs().map(lambda r: _link(r.but(steps_before=False))),
            "unknown",
        ),
        Violation("the fault never healed", link_runs().map(lambda r: _link(r.but(healed=False))), "unknown"),
        Violation("the fault never applied", link_runs().map(lambda r: _link(r.but(with_fault=False))), "unknown"),
    ),
)

TABLE: dict[str, Entry] = {
    "detected_within": DETECTED_WITHIN,
    "recovered_within": RECOVERED_WITHIN,
    "lost_work_at_most": LOST_WORK,
    "completes": COMPLETES,
    "progress": PROGRESS,
    "exactly_once": EXACTLY_ONCE,
    "matches_golden": MATCHES_GOLDEN,
    "step_blocked": STEP_BLOCKED,
    "sdc_detected": SDC_DETECTED,
    "no_false_positives": NO_FALSE_POSITIVES,
    **SERVING,
    "ranks_agree": RANKS_AGREE,
    "restarts_at_most": RESTARTS,
    "survivors_progress": SURVIVORS_PROGRESS,
    "rejoined_within": REJOINED_WITHIN,
    "replicas_agree": REPLICAS_AGREE,
    "node_drained_within": NODE_DRAINED,
    "requeued_within": REQUEUED,
    "no_repeat_failure_on_bad_node": NO_REPEAT,
    **{  # restore stragglers and retries, torn and corrupt checkpoints, rollback after a late-detected SDC, hang
        # culprit, streams and the fallback ladder: the cases live in storage_histories, checkpoint_histories,
        # rollback_histories, hang_histories, stream_histories; the rendezvous store's in rendezvous_histories
        name: Entry(holds.map(lambda c: Case(*c)), tuple(Violation(w, v.map(lambda c: Case(*c)), e) for w, v, e in bad))
        for cases in (STORAGE_RECOVERY, CHECKPOINT, ROLLBACK, HANG, STREAMS, RENDEZVOUS)
        for name, (holds, bad) in cases.items()
    },
    "link_named": LINK_NAMED,
    "stalled_during": STALLED,
}


def rejections() -> dict[str, list[str]]:
    """Per check, the violating histories it is shown to reject, with the verdict each must get."""
    return {name: [f"{v.what} -> {v.expect}" for v in entry.violations] for name, entry in sorted(TABLE.items())}


# ---------------------------------------------------------------------------------------------------------
# the tests


def test_every_registered_check_has_an_entry() -> None:
    registered = set(checks())
    missing = sorted(registered - set(TABLE))
    assert not missing, (
        f"registered checks without an entry in the safety suite's TABLE (tests/unit/test_check_safety.py): "
        f"{', '.join(missing)}; add strategies of histories that hold and that violate each one's property"
    )
    assert not set(TABLE) - registered, f"TABLE names unregistered checks: {sorted(set(TABLE) - registered)}"


def test_every_check_can_be_made_to_fail() -> None:
    # "unknown" is no rejection a user sees as a failure of the property: each check must fail on something
    cannot = [name for name, entry in TABLE.items() if not any(v.expect == "fail" for v in entry.violations)]
    assert not cannot, f"checks no violating history makes fail: {cannot}"


@pytest.mark.parametrize("check", sorted(TABLE))
@SETTINGS
@given(data=st.data())
def test_histories_where_the_property_holds_pass(check: str, data: st.DataObject) -> None:
    case = data.draw(TABLE[check].holds)
    result = judge(check, case)
    assert result.status == "pass", (result.reason, result.evidence)


VIOLATIONS = [(name, v) for name, entry in sorted(TABLE.items()) for v in entry.violations]


@pytest.mark.parametrize(("check", "violation"), VIOLATIONS, ids=[f"{n}: {v.what}" for n, v in VIOLATIONS])
@SETTINGS
@given(data=st.data())
def test_histories_that_violate_the_property_never_pass(check: str, violation: Violation, data: st.DataObject) -> None:
    case = data.draw(violation.cases)
    result = judge(check, case)
    assert result.status == violation.expect, (violation.what, result.status, result.reason, result.evidence)
