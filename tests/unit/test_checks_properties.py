"""Property tests of the built-in checks on simulated training runs with kills, checkpoints and resumes.

The simulator is a small model of a torchrun job: W ranks step in lockstep (all ranks report a step at the
same instant, so timestamps tie), rank 0 checkpoints every K steps, a kill after some step restarts every
rank in a new attempt that resumes from the latest checkpoint and recomputes from there. It also reports the
ground truth (steps recomputed per restart) the checks must agree with.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, cast

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from chaos.checks.base import CheckResult
from chaos.history.timeline import Event, History
from chaos.plugins.registry import checks

MS = 1_000_000
FAULT = "kill-rank"


def judge(check: str, events: list[Event], **params: Any) -> CheckResult:
    spec = checks()[check]
    return spec.evaluate(History.from_events(events), spec.Params.model_validate(params), cast(Any, None))


@dataclass
class Run:
    """A simulated run's events plus the ground truth the checks are judged against."""

    events: list[Event]
    world: int
    batch: int
    interval: int
    total: int
    kills: int
    recomputed: list[int] = field(default_factory=list)  # per restart: highest step reached before - resume
    final_resume: int = 0  # the step the last attempt resumed from (0 when never restarted)
    final_attempt: int = 0

    @property
    def max_recomputed(self) -> int:
        return max(self.recomputed, default=0)


def samples_of(step: int, rank: int, world: int, batch: int) -> list[int]:
    """A correct sampler: disjoint ids for every (step, rank)."""
    base = ((step - 1) * world + rank) * batch
    return list(range(base, base + batch))


@st.composite
def runs(draw: st.DrawFn, *, min_kills: int = 0) -> Run:
    world = draw(st.integers(1, 3))
    batch = draw(st.integers(1, 3))
    total = draw(st.integers(5, 30))
    interval = draw(st.integers(1, 8))
    kills = draw(st.integers(min_kills, 3))
    # Steps completed by each attempt before its kill (0 allowed: killed right after resuming).
    progress = [draw(st.integers(0, total)) for _ in range(kills)]
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))  # gaps only; hypothesis still shrinks the shape

    t = 1_000 * MS
    events: list[Event] = [Event(ts_ns=t, kind="runner.start")]
    run = Run(events=events, world=world, batch=batch, interval=interval, total=total, kills=kills)

    def tick() -> int:
        nonlocal t
        t += rng.randint(1, 900) * MS
        return t

    def reported(now: int, kind: str, rank: int, **data: Any) -> None:
        """One line of the job's own (``source="target"``) at ``now``."""
        events.append(Event(ts_ns=now, kind=kind, rank=rank, source="target", data=data))

    def attempt_start(attempt: int, resume: int | None) -> None:
        now = tick()
        if attempt:
            reported(now, "target.restart", 0, attempt=attempt)
        for rank in range(world):
            reported(now, "target.start", rank, pid=100 * attempt + rank, attempt=attempt, world_size=world)
            if resume is not None:
                reported(now, "target.resume", rank, step=resume, attempt=attempt, path=f"/ckpt/{resume}")

    def do_step(step: int, attempt: int) -> None:
        now = tick()
        for rank in range(world):
            samples = cast(Any, samples_of(step, rank, world, batch))
            reported(now, "target.step", rank, step=step, loss=1.0 / step, attempt=attempt, samples=samples)
        if step % interval == 0:
            reported(now, "target.checkpoint", 0, step=step, path=f"/ckpt/{step}", attempt=attempt)

    checkpoint, reached, position, attempt = 0, 0, 0, 0
    attempt_start(0, None)
    for op, done in enumerate(progress, start=1):
        # This attempt runs from its resume point for `done` steps, capped so the job is not yet finished.
        stop = min(position + done, total - 1)
        for step in range(position + 1, stop + 1):
            do_step(step, attempt)
            if step % interval == 0:
                checkpoint = step
        reached = max(reached, stop)
        events.append(
            Event(
                ts_ns=tick(),
                kind="fault.applied",
                rank=world - 1,
                data={"fault": FAULT, "op": op, "injector": "process"},
            )
        )
        events.append(
            Event(
                ts_ns=tick(),
                kind="detect.worker_exit",
                rank=world - 1,
                source="log",
                data={"detector": "torchrun", "message": "exitcode -9"},
            )
        )
        attempt += 1
        run.recomputed.append(reached - checkpoint)
        position = checkpoint
        attempt_start(attempt, checkpoint)
    for step in range(position + 1, total + 1):
        do_step(step, attempt)
    events.append(
        Event(
            ts_ns=tick(),
            kind="target.digest",
            rank=0,
            source="target",
            data={"digest": "f" * 64, "step": total, "attempt": attempt},
        )
    )
    events.append(Event(ts_ns=tick(), kind="target.exit", data={"code": 0}))
    run.final_resume = position
    run.final_attempt = attempt
    return run


def mutate_steps(run: Run, attempt: int, change: Any) -> list[Event]:
    """Events with every target.step of ``attempt`` passed through ``change`` (None drops it)."""
    out = []
    for event in run.events:
        if event.kind == "target.step" and event.get_int("attempt") == attempt:
            changed = change(event)
            if changed is not None:
                out.append(changed)
        else:
            out.append(event)
    return out


PROPS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------------------------------------------------
# lost_work_at_most


@PROPS
@given(runs(min_kills=1))
def test_lost_work_measures_exactly_the_recomputed_steps(run: Run) -> None:
    result = judge("lost_work_at_most", run.events, steps=run.interval)
    # Resuming from the latest checkpoint can never redo a whole interval or more.
    assert result.status == "pass", result
    assert result.measured == float(run.max_recomputed)
    assert run.max_recomputed < run.interval
    if run.max_recomputed > 0:
        tight = judge("lost_work_at_most", run.events, steps=run.max_recomputed - 1)
        assert tight.status == "fail"
        assert judge("lost_work_at_most", run.events, steps=run.max_recomputed).status == "pass"


@PROPS
@given(runs())
def test_lost_work_without_restart_is_zero_or_unknown(run: Run) -> None:
    assume(run.kills == 0)
    assert judge("lost_work_at_most", run.events, steps=0).status == "unknown"  # no fault fired at all
    slow = Event(ts_ns=run.events[-1].ts_ns - 1, kind="fault.applied", data={"fault": "slow", "op": 9})
    result = judge("lost_work_at_most", [*run.events, slow], steps=0)
    assert result.status == "pass" and result.measured == 0.0


# ---------------------------------------------------------------------------------------------------------
# exactly_once


@PROPS
@given(runs(), st.booleans())
def test_exactly_once_passes_on_correctly_resumed_lineage(run: Run, drop_checkpoints: bool) -> None:
    events = [e for e in run.events if not (drop_checkpoints and e.kind == "target.checkpoint")]
    result = judge("exactly_once", events)
    assert result.status == "pass", result
    assert result.measured == float(run.total * run.world * run.batch)


@PROPS
@given(runs(min_kills=1), st.booleans())
def test_exactly_once_fails_when_resumed_attempt_repeats_samples(run: Run, drop_checkpoints: bool) -> None:
    # The final attempt commits steps resume+1..total; make its first step re-train another committed step's
    # samples (the resume step's, as a loader restarted one batch behind would, or the next one's).
    first = run.final_resume + 1
    other = run.final_resume if run.final_resume >= 1 else first + 1
    assume(other <= run.total)
    donor = {e.rank: e.data["samples"] for e in run.events if e.kind == "target.step" and e.get_int("step") == other}
    events = mutate_steps(
        run,
        run.final_attempt,
        lambda e: (
            e.model_copy(update={"data": {**e.data, "samples": donor[e.rank]}}) if e.get_int("step") == first else e
        ),
    )
    events = [e for e in events if not (drop_checkpoints and e.kind == "target.checkpoint")]
    result = judge("exactly_once", events)
    assert result.status == "fail", result
    assert "trained more than once" in result.reason


@PROPS
@given(runs(min_kills=1), st.booleans())
def test_exactly_once_fails_when_resumed_attempt_skips_a_step(run: Run, drop_checkpoints: bool) -> None:
    first = run.final_resume + 1
    assume(first + 1 <= run.total)  # the attempt must still commit something after the skipped step
    events = mutate_steps(run, run.final_attempt, lambda e: None if e.get_int("step") == first else e)
    events = [e for e in events if not (drop_checkpoints and e.kind == "target.checkpoint")]
    result = judge("exactly_once", events)
    assert result.status == "fail", result
    assert f"missing step(s) {first}" in result.reason


# ---------------------------------------------------------------------------------------------------------
# detected_within, recovered_within and the never-vacuous rule


@PROPS
@given(
    runs(),
    st.lists(st.sampled_from(["detect.worker_exit", "detect.collective_timeout", "target.restart"]), max_size=5),
    st.floats(0, 1e6),
)
def test_detected_within_is_unknown_without_fault_applied(run: Run, extra: list[str], within: float) -> None:
    events = [e for e in run.events if e.kind != "fault.applied"]
    events += [Event(ts_ns=run.events[-1].ts_ns + i, kind=kind, rank=0) for i, kind in enumerate(extra)]
    for params in ({}, {"rank": 0}, {"event": "*"}):
        result = judge("detected_within", events, fault=FAULT, within=within, **params)
        assert result.status == "unknown" and "never applied" in result.reason
        assert judge("recovered_within", events, fault=FAULT, within=within).status == "unknown"


@PROPS
@given(runs(min_kills=1))
def test_detection_and_recovery_pass_with_generous_bounds(run: Run) -> None:
    detected = judge("detected_within", run.events, fault=FAULT, within="1h")
    assert detected.status == "pass" and detected.measured is not None and 0 < float(detected.measured) < 1
    recovered = judge("recovered_within", run.events, fault=FAULT, within="1d")
    if recovered.status == "unknown":
        # Only possible when a kill landed before the first step.
        assert "before any target.step" in recovered.reason
        return
    assert recovered.status == "pass", recovered
    assert recovered.measured is not None
    too_tight = judge("recovered_within", run.events, fault=FAULT, within=float(recovered.measured) * 0.99)
    assert too_tight.status == "fail"


# ---------------------------------------------------------------------------------------------------------
# order invariance


@PROPS
@given(runs(), st.randoms(use_true_random=False))
def test_results_do_not_depend_on_event_input_order(run: Run, rnd: random.Random) -> None:
    shuffled = list(run.events)
    rnd.shuffle(shuffled)
    golden = Event(ts_ns=run.events[0].ts_ns, kind="runner.golden", data={"digest": "f" * 64, "step": run.total})
    cases: list[tuple[str, dict[str, Any]]] = [
        ("detected_within", {"fault": FAULT, "within": 1}),
        ("recovered_within", {"fault": FAULT, "within": 5}),
        ("lost_work_at_most", {"steps": 1}),
        ("exactly_once", {}),
        ("matches_golden", {}),
        ("completes", {}),
    ]
    for check, params in cases:
        assert judge(check, [*run.events, golden], **params) == judge(check, [golden, *shuffled], **params)
