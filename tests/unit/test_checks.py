"""Example-based tests of the built-in checks on hand-made histories: pass, fail and unknown for each."""

from __future__ import annotations

from typing import Any, cast

import pytest
from pydantic import BaseModel, ValidationError

from chaos.checks.base import CheckResult
from chaos.checks.detection import DetectedWithinParams
from chaos.history.timeline import Event, History
from chaos.plugins.registry import checks

SECOND = 1_000_000_000


def ev(t: float, kind: str, rank: int | None = None, **data: Any) -> Event:
    """An event ``t`` seconds into the run."""
    source = "runner" if kind.startswith(("fault.", "runner.")) or kind == "target.exit" else "target"
    return Event(ts_ns=round(t * SECOND), kind=kind, rank=rank, source=source, data=data)


def judge(check: str, events: list[Event], **params: Any) -> CheckResult:
    """Run the registered check ``check`` with params validated the way a scenario would validate them."""
    spec = checks()[check]
    return spec.evaluate(History.from_events(events), spec.Params.model_validate(params), cast(Any, None))


def steps(
    first: int,
    last: int,
    *,
    t0: float,
    attempt: int = 0,
    ranks: tuple[int, ...] = (0, 1),
    dt: float = 1.0,
    batch: int = 2,
) -> list[Event]:
    """Steps first..last on every rank, one per ``dt`` seconds from ``t0``, with disjoint per-step samples."""
    out = []
    for i, step in enumerate(range(first, last + 1)):
        for rank in ranks:
            samples = [(step * len(ranks) + rank) * batch + j for j in range(batch)]
            out.append(
                ev(t0 + i * dt, "target.step", rank, step=step, loss=1.0 / step, samples=samples, attempt=attempt)
            )
    return out


def restart(t: float, attempt: int, resume: int, ranks: tuple[int, ...] = (0, 1)) -> list[Event]:
    """A torchrun restart: restart marker on rank 0, then start and resume on every rank."""
    out = [ev(t, "target.restart", 0, attempt=attempt)]
    for rank in ranks:
        out.append(ev(t + 0.1, "target.start", rank, pid=1000 + attempt * 10 + rank, attempt=attempt, world_size=2))
        out.append(ev(t + 0.2, "target.resume", rank, step=resume, attempt=attempt, path=f"/ckpt/step{resume}"))
    return out


def start(t: float = 0.0, ranks: tuple[int, ...] = (0, 1)) -> list[Event]:
    return [ev(t, "runner.start")] + [
        ev(t + 0.1, "target.start", r, pid=100 + r, attempt=0, world_size=len(ranks)) for r in ranks
    ]


def kill(t: float, op: int = 1, fault: str = "kill-rank1") -> Event:
    return ev(t, "fault.applied", 1, fault=fault, op=op, injector="process")


def killed_run() -> list[Event]:
    """Steps 1..10 (checkpoint at 8), kill at 10.5, restart resuming at 8, steps 9..15, clean exit."""
    return [
        *start(),
        *steps(1, 10, t0=1.0),
        ev(8.05, "target.checkpoint", 0, step=8, path="/ckpt/step8", attempt=0),
        kill(10.5),
        ev(11.0, "detect.worker_exit", 1, detector="torchrun", message="worker 1 exited with -9"),
        *restart(15.0, 1, 8),
        *steps(9, 15, t0=20.0, attempt=1),
        ev(26.5, "target.digest", 0, digest="ab" * 32, step=15, attempt=1),
        ev(27.0, "target.exit", code=0),
    ]


# ---------------------------------------------------------------------------------------------------------
# registry and params


def test_all_six_checks_are_registered_with_strict_documented_params() -> None:
    found = checks()
    for name in (
        "detected_within",
        "recovered_within",
        "matches_golden",
        "lost_work_at_most",
        "exactly_once",
        "completes",
    ):
        spec = found[name]
        assert spec.summary
        schema = spec.Params.model_json_schema()
        for field in schema.get("properties", {}).values():
            assert field.get("description"), (name, field)
        with pytest.raises(ValidationError):
            spec.Params.model_validate({"no_such_param": 1})
    assert found["matches_golden"].needs_golden
    assert not found["detected_within"].needs_golden


def test_duration_params_accept_human_units() -> None:
    params = checks()["detected_within"].Params.model_validate({"fault": "f", "within": "2m"})
    assert isinstance(params, DetectedWithinParams) and params.within == 120.0


def test_wrong_params_type_is_unknown_naming_the_type_error() -> None:
    """A check handed another check's params raises inside; that is its bug, so it is unknown (never a pass)."""
    spec = checks()["completes"]
    other = checks()["exactly_once"].Params()
    result = spec.evaluate(History.from_events([]), other, cast(Any, None))
    assert result.status == "unknown" and "TypeError" in result.reason and result.evidence


# ---------------------------------------------------------------------------------------------------------
# detected_within


def test_detected_within_passes_and_cites_events() -> None:
    result = judge("detected_within", killed_run(), fault="kill-rank1", within="10s")
    assert result.status == "pass"
    assert result.measured == pytest.approx(0.5)
    assert result.bound == "<= 10s" and result.unit == "s"
    assert result.name == "detected_within[kill-rank1]" and result.check == "detected_within"
    assert "fault.applied kill-rank1 (op 1) rank 1 at +10.500s" in result.evidence
    assert any(line.startswith("detect.worker_exit rank 1 by torchrun at +11.000s") for line in result.evidence)


def test_detected_within_fails_when_too_slow() -> None:
    result = judge("detected_within", killed_run(), fault="kill-rank1", within="200ms")
    assert result.status == "fail"
    assert result.measured == pytest.approx(0.5)
    assert "over the 0.2s bound" in result.reason


def test_detected_within_fails_when_an_op_goes_undetected() -> None:
    events = [*killed_run(), kill(30.0, op=2)]
    result = judge("detected_within", events, fault="kill-rank1", within=10)
    assert result.status == "fail"
    assert "1 of 2 op(s)" in result.reason and "op 2" in result.reason
    assert result.measured == pytest.approx(0.5)  # the worst of the ops that were detected


def test_detected_within_unknown_without_fault_applied_names_what_fired() -> None:
    events = [e for e in killed_run() if e.kind != "fault.applied"]
    events += [
        ev(5.0, "fault.applied", fault="partition", op=7),
        ev(6.0, "fault.failed", fault="kill-rank1", op=1, error="no such pid"),
    ]
    result = judge("detected_within", events, fault="kill-rank1", within="10s")
    assert result.status == "unknown"
    assert "'kill-rank1' was never applied" in result.reason
    assert "failed 1 time(s) (no such pid)" in result.reason
    assert "partition" in result.reason
    assert result.measured is None


def test_detected_within_respects_rank_and_glob_and_is_strictly_after() -> None:
    events = [
        kill(10.0),
        ev(10.0, "detect.collective_error", 1, detector="guard"),  # same instant: not caused by the fault
        ev(10.5, "detect.collective_error", 0, detector="guard"),
        ev(12.0, "detect.collective_timeout", 1, detector="watchdog"),
        ev(13.0, "detect.collective_error", 1, detector="guard"),
    ]
    assert judge("detected_within", events, fault="kill-rank1", within=10).measured == pytest.approx(0.5)
    on_rank1 = judge("detected_within", events, fault="kill-rank1", within=10, rank=1)
    assert on_rank1.measured == pytest.approx(2.0)
    errors_on_1 = judge(
        "detected_within", events, fault="kill-rank1", within=10, rank=1, event="detect.collective_error"
    )
    assert errors_on_1.measured == pytest.approx(3.0)
    nothing = judge("detected_within", events, fault="kill-rank1", within=10, event="detect.hang")
    assert nothing.status == "fail" and "'detect.hang'" in nothing.reason


# ---------------------------------------------------------------------------------------------------------
# recovered_within


def test_recovered_within_passes_and_notes_restart() -> None:
    result = judge("recovered_within", killed_run(), fault="kill-rank1", within="30s")
    # Highest step before the kill is 10; step 11 comes at t=22, 11.5s after the fault at 10.5.
    assert result.status == "pass"
    assert result.measured == pytest.approx(11.5)
    assert any("first step after restart, 9.5s after the fault" in line for line in result.evidence)
    assert any("highest step before it: 10" in line for line in result.evidence)


def test_recovered_within_fails_when_slow() -> None:
    result = judge("recovered_within", killed_run(), fault="kill-rank1", within="5s")
    assert result.status == "fail"
    assert "11.5s, over the 5s bound" in result.reason


def test_recovered_within_fails_when_replay_never_passes_the_high_water_mark() -> None:
    events = [e for e in killed_run() if not (e.kind == "target.step" and (e.get_int("step") or 0) > 10)]
    result = judge("recovered_within", events, fault="kill-rank1", within="1h")
    assert result.status == "fail"
    assert "no step beyond 10" in result.reason


def test_recovered_within_unknown_without_fault_or_baseline() -> None:
    no_fault = [e for e in killed_run() if e.kind != "fault.applied"]
    assert judge("recovered_within", no_fault, fault="kill-rank1", within=60).status == "unknown"
    early = [kill(0.5), *steps(1, 5, t0=1.0)]
    result = judge("recovered_within", early, fault="kill-rank1", within=60)
    assert result.status == "unknown"
    assert "before any target.step" in result.reason


# ---------------------------------------------------------------------------------------------------------
# matches_golden


def golden(digest: str, step: int = 15) -> Event:
    return ev(0.05, "runner.golden", digest=digest, step=step, cached=True)


def test_matches_golden_passes() -> None:
    result = judge("matches_golden", [*killed_run(), golden("ab" * 32)])
    assert result.status == "pass"
    assert result.measured == "abababababab" and result.bound == "== golden abababababab"


def test_matches_golden_fails_and_explains_step_mismatch() -> None:
    result = judge("matches_golden", [*killed_run(), golden("cd" * 32, step=20)])
    assert result.status == "fail"
    assert "differs from golden cdcdcdcdcdcd" in result.reason
    assert "ended at step 15 but the golden run at step 20" in result.reason


def test_matches_golden_uses_each_ranks_highest_attempt() -> None:
    events = [
        ev(5.0, "target.digest", 0, digest="00" * 32, step=5, attempt=0),
        ev(9.0, "target.digest", 0, digest="11" * 32, step=9, attempt=1),
        ev(9.5, "target.digest", 1, digest="22" * 32, step=9, attempt=1),
        ev(9.6, "target.digest", None, digest="33" * 32),
        golden("11" * 32),
    ]
    assert judge("matches_golden", events[:2] + events[-1:]).status == "pass"  # rank 0's attempt 1 is final
    # Every rank is compared (a higher rank and a rank-less report were once ignored).
    result = judge("matches_golden", events)
    assert result.status == "fail" and "rank 1 differs" in result.reason and "rank-less" in result.reason
    only_rank1 = [e for e in events if e.rank != 0]
    assert judge("matches_golden", only_rank1).measured == "222222222222"


@pytest.mark.parametrize(
    ("drop", "says"),
    [
        ("target.digest", ["no target.digest"]),
        ("runner.golden", ["no runner.golden"]),
        ("both", ["no target.digest", "no runner.golden"]),
    ],
)
def test_matches_golden_unknown_names_what_is_missing(drop: str, says: list[str]) -> None:
    events = [*killed_run(), golden("ab" * 32)]
    events = [
        e for e in events if e.kind != drop and not (drop == "both" and e.kind in ("target.digest", "runner.golden"))
    ]
    result = judge("matches_golden", events)
    assert result.status == "unknown"
    for text in says:
        assert text in result.reason
    if drop != "both":
        assert len([t for t in ("no target.digest", "no runner.golden") if t in result.reason]) == 1


# ---------------------------------------------------------------------------------------------------------
# lost_work_at_most


def test_lost_work_passes_and_fails_on_recomputed_steps() -> None:
    # Reached 10, resumed from 8: 2 steps recomputed.
    ok = judge("lost_work_at_most", killed_run(), steps=2)
    assert ok.status == "pass" and ok.measured == 2.0 and ok.unit == " steps" and ok.bound == "<= 2 steps"
    bad = judge("lost_work_at_most", killed_run(), steps=1)
    assert bad.status == "fail" and "recomputed 2 step(s), over the bound of 1" in bad.reason


def test_lost_work_counts_every_earlier_attempt() -> None:
    # Attempt 0 reaches 12, attempt 1 resumes at 10 and dies at 11, attempt 2 resumes at 10 again: the
    # highest step ever reached (12) is what attempt 2 has to redo.
    events = [
        *start(),
        *steps(1, 12, t0=1.0),
        kill(12.5),
        *restart(14.0, 1, 10),
        *steps(11, 11, t0=15.0, attempt=1),
        kill(15.5, op=2),
        *restart(17.0, 2, 10),
        *steps(11, 14, t0=18.0, attempt=2),
        ev(30.0, "target.exit", code=0),
    ]
    result = judge("lost_work_at_most", events, steps=5)
    assert result.measured == 2.0 and result.status == "pass"
    attempt2 = [line for line in result.evidence if "attempt 2" in line]
    assert len(attempt2) == 1 and "highest earlier step 12, recomputed 2" in attempt2[0]


def test_lost_work_restart_without_resume_event_counts_from_first_step() -> None:
    events = [
        *start(),
        *steps(1, 6, t0=1.0),
        kill(6.5),
        ev(7.0, "target.start", 0, attempt=1),
        *steps(1, 6, t0=8.0, attempt=1, ranks=(0,)),
    ]
    result = judge("lost_work_at_most", events, steps=3)
    assert result.status == "fail" and result.measured == 6.0
    assert any("implies resume from 0" in line for line in result.evidence)


def test_lost_work_no_restart_passes_with_zero() -> None:
    events = [*start(), *steps(1, 5, t0=1.0), kill(3.5, fault="slow-disk"), ev(9.0, "target.exit", code=0)]
    result = judge("lost_work_at_most", events, steps=0)
    assert result.status == "pass" and result.measured == 0.0
    assert result.reason == "no restart: nothing recomputed"


def test_lost_work_unknown_without_faults_or_steps() -> None:
    no_fault = [e for e in killed_run() if e.kind != "fault.applied"]
    assert "no fault.applied" in judge("lost_work_at_most", no_fault, steps=1).reason
    no_steps = [e for e in killed_run() if e.kind != "target.step"]
    result = judge("lost_work_at_most", no_steps, steps=1)
    assert result.status == "unknown" and "no target.step" in result.reason


# ---------------------------------------------------------------------------------------------------------
# exactly_once


def test_exactly_once_passes_over_a_restart() -> None:
    result = judge("exactly_once", killed_run())
    assert result.status == "pass"
    assert result.measured == 15 * 2 * 2.0  # 15 steps x 2 ranks x batch 2
    assert any("rank 0: committed steps 1..15 from attempt(s) [0, 1]" == line for line in result.evidence)


def test_exactly_once_fails_on_repeated_samples() -> None:
    events = killed_run()
    # The resumed loader restarts one batch behind: step 9 of attempt 1 re-trains step 8's samples on rank 0.
    events = [
        e.model_copy(update={"data": {**e.data, "samples": [32, 33]}})
        if e.kind == "target.step" and e.rank == 0 and e.get_int("step") == 9 and e.get_int("attempt") == 1
        else e
        for e in events
    ]
    result = judge("exactly_once", events)
    assert result.status == "fail"
    assert "2 sample id(s) trained more than once: 32, 33" in result.reason
    assert any(line.startswith("sample 32 used 2 times") for line in result.evidence)


def test_exactly_once_fails_when_resume_skips_a_step() -> None:
    # Claims to resume at 8 but starts at 10: step 9 ran only in the rolled-back attempt, so it is missing.
    events = [
        e
        for e in killed_run()
        if not (e.kind == "target.step" and e.get_int("attempt") == 1 and e.get_int("step") == 9)
    ]
    result = judge("exactly_once", events)
    assert result.status == "fail"
    assert "rank 0 missing step(s) 9" in result.reason and "rank 1 missing step(s) 9" in result.reason


def test_exactly_once_drops_rolled_back_steps() -> None:
    # Attempt 0 reaches 10; attempt 1 resumes at 8 and the job ends at step 9: step 10 of attempt 0 is not
    # committed, so its samples do not count and there is no gap.
    events = [
        e
        for e in killed_run()
        if not (e.kind == "target.step" and (e.get_int("attempt") == 1) and (e.get_int("step") or 0) > 9)
    ]
    result = judge("exactly_once", events)
    assert result.status == "pass" and result.measured == 9 * 2 * 2.0


def test_exactly_once_without_checkpoint_events_uses_step_holders() -> None:
    events = [e for e in killed_run() if e.kind != "target.checkpoint"]
    assert judge("exactly_once", events).status == "pass"


def test_exactly_once_run_initial_resume_starts_lineage() -> None:
    events = [ev(0.1, "target.resume", 0, step=50, attempt=0), *steps(51, 55, t0=1.0, ranks=(0,))]
    result = judge("exactly_once", events)
    assert result.status == "pass"
    assert any("lineage starts there" in line for line in result.evidence)


def test_exactly_once_unknown_without_samples() -> None:
    events = [
        e.model_copy(update={"data": {k: v for k, v in e.data.items() if k != "samples"}})
        if e.kind == "target.step"
        else e
        for e in killed_run()
    ]
    result = judge("exactly_once", events)
    assert result.status == "unknown" and "samples" in result.reason


def test_exactly_once_unknown_when_a_committed_step_lacks_samples() -> None:
    events = [
        e.model_copy(update={"data": {k: v for k, v in e.data.items() if k != "samples"}})
        if e.kind == "target.step" and e.get_int("step") == 3 and e.rank == 1
        else e
        for e in killed_run()
    ]
    result = judge("exactly_once", events)
    assert result.status == "unknown" and "1 committed step(s) carry no samples" in result.reason


# ---------------------------------------------------------------------------------------------------------
# completes


def test_completes_pass_fail_unknown() -> None:
    assert judge("completes", killed_run()).status == "pass"
    crashed = [*killed_run(), ev(40.0, "target.exit", code=137)]
    result = judge("completes", crashed)
    assert result.status == "fail" and result.measured == 137.0 and "code 137" in result.reason
    no_exit = [e for e in killed_run() if e.kind != "target.exit"]
    assert judge("completes", no_exit).status == "unknown"
    no_code = [*killed_run(), ev(40.0, "target.exit")]
    assert "no integer code" in judge("completes", no_code).reason


def test_exactly_once_lists_duplicates_numerically_and_first() -> None:
    events = [
        ev(1.0, "target.step", 0, step=1, attempt=0, samples=[9, 10]),
        ev(2.0, "target.step", 0, step=2, attempt=0, samples=[10, 9, 11]),
    ]
    result = judge("exactly_once", events)
    assert result.status == "fail" and "2 sample id(s) trained more than once: 9, 10" in result.reason
    assert result.evidence[0].startswith("sample 9 used 2 times: rank 0 step 1 attempt 0; rank 0 step 2")
    assert result.measured == 3.0


def test_progress_fails_a_run_the_runner_ended_for_lack_of_progress() -> None:
    """The violating history: steps stop, the runner records no_progress and ends the run."""
    stalled = [
        *start(),
        *steps(1, 5, t0=1.0),
        ev(36.0, "runner.no_progress", seconds=30.0, step=5),
        ev(36.1, "runner.end", reason="no progress: no target.step for 30s"),
    ]
    result = judge("progress", stalled)
    assert result.status == "fail"
    assert result.reason == "no progress: no target.step for 30s" and result.measured == 30.0
    assert any("runner.no_progress" in line for line in result.evidence)


def test_progress_passes_a_run_that_kept_stepping() -> None:
    result = judge("progress", [*start(), *steps(1, 5, t0=1.0), ev(7.0, "runner.end", reason="target exited")])
    assert result.status == "pass"


def test_progress_counts_a_restart_as_life_but_not_a_restart_that_hangs() -> None:
    """A 3-host restart took 61 s from the last step before it to the first after it (the ranks restarted at
    45 s): the job was restarting, not hung. A gap with no start in it over the timeout still fails."""
    from types import SimpleNamespace

    from chaos.checks.progress import ProgressParams, progress
    from chaos.history.timeline import History

    watched = SimpleNamespace(safety=SimpleNamespace(no_progress_timeout=60.0))
    restart = [*start(), *steps(1, 3, t0=1.0), ev(45.0, "target.start", 0, pid=7, attempt=1), *steps(4, 5, t0=64.0)]
    passed = progress(History.from_events(restart), ProgressParams(), watched)  # type: ignore[arg-type]
    assert passed.status == "pass", passed.reason
    hung = [*start(), *steps(1, 3, t0=1.0), ev(5.0, "target.start", 0, pid=7, attempt=1), *steps(4, 5, t0=70.0)]
    failed = progress(History.from_events(hung), ProgressParams(), watched)  # type: ignore[arg-type]
    assert failed.status == "fail" and "no target.step or rank start for" in failed.reason, failed.reason


def _least(annotation: object, number: float = 1) -> object:
    """The plainest value a required check param of this type accepts: a word, ``number``, or a list of two of those
    (two models with every required field filled this way, e.g. a ladder's two rungs)."""
    args = getattr(annotation, "__args__", ())
    if getattr(annotation, "__origin__", None) is list and args:
        item = args[0]
        if isinstance(item, type) and issubclass(item, BaseModel):
            fields = {k: _least(f.annotation, number) for k, f in item.model_fields.items() if f.is_required()}
            return [{k: f"{v}{n}" if isinstance(v, str) else v for k, v in fields.items()} for n in (1, 2)]
        return [_least(item, number), _least(item, number)]
    return "f" if "str" in str(annotation) else number


def test_every_unknown_verdict_says_what_to_add() -> None:
    # Each check on a history with nothing in it (no fault fired, no evidence): its reason ends with the fix.
    scenario_free = [Event(ts_ns=1, kind="runner.start", source="runner")]
    for name, spec in sorted(checks().items()):
        required = {k: f for k, f in spec.Params.model_fields.items() if f.is_required()}
        try:
            made = spec.Params.model_validate({k: _least(f.annotation) for k, f in required.items()})
        except ValidationError:  # a bound below 1 (a share): the same with 0.5 for the numbers
            made = spec.Params.model_validate({k: _least(f.annotation, 0.5) for k, f in required.items()})
        result = spec.evaluate(History.from_events(scenario_free), made, cast(Any, None))
        if result.status == "unknown":
            assert "to fix: " in result.reason or "give min, max or both" in result.reason, (name, result.reason)
