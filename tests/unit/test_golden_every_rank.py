"""The golden comparison covers every rank, and a fault whose effect was masked is said to be masked.

``matches_golden`` (and ``step_blocked``, which is its verdict once the fault fired) compared rank 0's digest
only: a flip in rank 1's optimizer state left rank 1's weights apart from rank 0's and the check passed. The
golden run now records every rank's final digest (``runner.golden`` ``digests``), and each rank is compared
with the golden digest of the same rank. ``sdc_detected`` reads the same data to tell a firing that nothing
could detect (the final state equals golden on every rank: masked) from a guard that missed an effective
corruption.

Histories are built by hand (see test_checks.py); the golden run's caching is driven with a fake fault-free
run, which is pure logic.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from support import SCENARIOS
from test_checks import ev, judge

from chaos.checks.lineage import final_digests, golden_rank_digests
from chaos.history.timeline import Event, History
from chaos.plugins.registry import checks
from chaos.run.golden import Golden, golden_outcome
from chaos.spec.scenario import Scenario, load_scenario

A, B, C = "aa" * 32, "bb" * 32, "cc" * 32
FLIP = "flip-adam"


def golden(digests: dict[str, str] | None, digest: str = A) -> Event:
    """A ``runner.golden`` event; ``digests=None`` is a history recorded before per-rank digests were kept."""
    data: dict[str, Any] = {"digest": digest, "detections": [], "cached": False}
    if digests is not None:
        data["digests"] = digests
    return ev(40.0, "runner.golden", **data)


def finished(digests: dict[int, str], *, ranks: tuple[int, ...] = (0, 1), t: float = 30.0) -> list[Event]:
    """Both ranks start and step (so each is seen in the run), then the ranks in ``digests`` report them."""
    out = [ev(0.1, "target.start", r, attempt=0, world_size=len(ranks)) for r in ranks]
    out += [ev(1.0 + s, "target.step", r, step=s, attempt=0) for s in range(1, 4) for r in ranks]
    out += [ev(t, "target.digest", r, digest=d, step=3, attempt=0) for r, d in digests.items()]
    return out


# ---------------------------------------------------------------------------------------------------------
# matches_golden


def test_rank_1_differing_fails_although_rank_0_equals_golden() -> None:
    # The defect: rank 0 equals golden, rank 1 (whose Adam exp_avg_sq took a flip) does not. The old check
    # took rank 0's digest alone and compared it with the golden's one digest: these inputs passed.
    events = [*finished({0: A, 1: B}), golden({"0": A, "1": A})]
    assert events[-1].get_str("digest") == A and final_digests(History.from_events(events))[0].get_str("digest") == A
    result = judge("matches_golden", events)
    assert result.status == "fail"
    assert "rank 1 differs from golden aaaaaaaaaaaa" in result.reason and "bbbbbbbbbbbb" in result.reason
    assert "rank 0" not in result.reason  # only the rank that differs is named
    assert result.measured == B[:12] and result.bound == f"== golden {A[:12]}"
    assert any("rank 1" in line and "digest bbbbbbbbbbbb; golden aaaaaaaaaaaa" in line for line in result.evidence)


def test_every_rank_equal_to_golden_passes() -> None:
    result = judge("matches_golden", [*finished({0: A, 1: A}), golden({"0": A, "1": A})])
    assert result.status == "pass" and "rank(s) 0, 1" in result.reason
    assert result.measured == A[:12] and result.bound == f"== golden {A[:12]}"


def test_sharded_ranks_are_compared_with_their_own_golden_digest() -> None:
    # Ranks that legitimately hold different state (shards) pass when each equals its own golden digest ...
    assert judge("matches_golden", [*finished({0: A, 1: B}), golden({"0": A, "1": B})]).status == "pass"
    # ... and swapping them is caught on both.
    swapped = judge("matches_golden", [*finished({0: B, 1: A}), golden({"0": A, "1": B})])
    assert swapped.status == "fail" and "rank 0 differs" in swapped.reason and "rank 1 differs" in swapped.reason


def test_each_rank_is_judged_on_its_highest_attempt() -> None:
    events = [
        *finished({0: A}),
        ev(31.0, "target.digest", 1, digest=A, step=3, attempt=1),
        ev(32.0, "target.digest", 1, digest=B, step=3, attempt=0),  # later, but from an older attempt
        golden({"0": A, "1": A}),
    ]
    assert judge("matches_golden", events).status == "pass"


@pytest.mark.parametrize(
    ("drop", "says"), [("runner.golden", "no runner.golden"), ("target.digest", "no target.digest")]
)
def test_missing_golden_or_digests_is_unknown(drop: str, says: str) -> None:
    events = [e for e in [*finished({0: A, 1: A}), golden({"0": A, "1": A})] if e.kind != drop]
    result = judge("matches_golden", events)
    assert result.status == "unknown" and says in result.reason


def test_old_history_without_per_rank_digests_compares_every_rank_with_the_one_digest() -> None:
    old = golden(None, digest=A)
    passed = judge("matches_golden", [*finished({0: A, 1: A}), old])
    assert passed.status == "pass"
    assert any("one digest, not one per rank" in line for line in passed.evidence)
    failed = judge("matches_golden", [*finished({0: A, 1: B}), old])
    assert failed.status == "fail" and "rank 1 differs from golden aaaaaaaaaaaa" in failed.reason


def test_a_rank_that_ran_but_reported_no_final_digest_fails() -> None:
    # Rank 1 stepped in this run and never reported its final model: the job did not finish on it.
    result = judge("matches_golden", [*finished({0: A}), golden({"0": A, "1": A})])
    assert result.status == "fail" and "rank(s) 1 ran but reported no final digest" in result.reason


def test_a_rank_never_seen_or_not_in_the_golden_run_is_unknown() -> None:
    unseen = judge("matches_golden", [*finished({0: A}, ranks=(0,)), golden({"0": A, "1": A})])
    assert unseen.status == "unknown" and "rank(s) 1 of the golden run never appear" in unseen.reason
    extra = judge("matches_golden", [*finished({0: A, 1: A}), golden({"0": A})])
    assert extra.status == "unknown" and "rank(s) 1 reported a digest but the golden run had none" in extra.reason
    # a difference still fails, whatever else cannot be judged
    both = judge("matches_golden", [*finished({0: B, 1: A}), golden({"0": A})])
    assert both.status == "fail" and "rank 0 differs" in both.reason


def test_step_blocked_names_the_rank_that_differs() -> None:
    applied = ev(2.5, "fault.applied", 1, fault=FLIP, op="op-1", step=2)
    result = judge("step_blocked", [*finished({0: A, 1: B}), applied, golden({"0": A, "1": A})], fault=FLIP)
    assert result.status == "fail"
    assert result.reason.startswith("a corrupted update reached the model: rank 1 differs from golden")
    ok = judge("step_blocked", [*finished({0: A, 1: A}), applied, golden({"0": A, "1": A})], fault=FLIP)
    assert ok.status == "pass" and "every rank" in ok.reason


# ---------------------------------------------------------------------------------------------------------
# the golden run records every rank


@dataclass
class FakeRun:
    """What golden_outcome reads from a fault-free run."""

    history: History
    run_dir: Path = Path("/nowhere")
    ended_by: str = "job exited"
    calls: list[Scenario] = field(default_factory=list)


def _scenario() -> Scenario:
    return load_scenario(SCENARIOS / "sdc-in-transit.yaml")


def _runner(events: list[Event]) -> tuple[list[Scenario], Any]:
    calls: list[Scenario] = []

    def run_fault_free(scenario: Scenario, cache_dir: Path) -> FakeRun:
        calls.append(scenario)
        return FakeRun(History.from_events(events))

    return calls, run_fault_free


GOLDEN_EVENTS = [
    ev(1.0, "target.digest", 0, digest=C, step=3, attempt=0),  # an older attempt of rank 0
    ev(2.0, "target.digest", 1, digest=B, step=3, attempt=1),
    ev(2.1, "target.digest", 0, digest=A, step=3, attempt=1),
    ev(2.2, "detect.sdc", 1, step=3),
]


def test_golden_outcome_records_and_caches_every_ranks_digest(tmp_path: Path) -> None:
    calls, run = _runner(GOLDEN_EVENTS)
    first = golden_outcome(_scenario(), tmp_path, use_cache=True, run_fault_free=run, log=lambda _: None)
    assert first == Golden(A, ["detect.sdc"], cached=False, digests={0: A, 1: B})
    assert first.digests_json() == {"0": A, "1": B}
    assert len(calls) == 1 and not calls[0].faults  # the golden run is the fault-free scenario
    [saved] = tmp_path.glob("*.json")
    assert json.loads(saved.read_text())["digests"] == {"0": A, "1": B}
    again = golden_outcome(_scenario(), tmp_path, use_cache=True, run_fault_free=run, log=lambda _: None)
    assert again == Golden(A, ["detect.sdc"], cached=True, digests={0: A, 1: B}) and len(calls) == 1


def test_an_old_cache_file_without_per_rank_digests_is_a_miss(tmp_path: Path) -> None:
    calls, run = _runner(GOLDEN_EVENTS)
    golden_outcome(_scenario(), tmp_path, use_cache=True, run_fault_free=run, log=lambda _: None)
    [saved] = tmp_path.glob("*.json")
    saved.write_text(json.dumps({"digest": A, "detections": [], "run_dir": "/old"}))  # as written before
    logged: list[str] = []
    outcome = golden_outcome(_scenario(), tmp_path, use_cache=True, run_fault_free=run, log=logged.append)
    assert len(calls) == 2, "the old file was read as a hit"
    assert outcome is not None and not outcome.cached and outcome.digests == {0: A, 1: B}
    assert any("lacks per-rank digests" in line for line in logged)
    assert json.loads(saved.read_text())["digests"] == {"0": A, "1": B}  # rewritten


def test_runs_side_by_side_share_one_golden_run(tmp_path: Path) -> None:
    """A second run that misses while the first computes the same entry waits for it and reads its result."""
    calls, run = _runner(GOLDEN_EVENTS)
    started, release = threading.Event(), threading.Event()

    def slow_run(scenario: Scenario, cache_dir: Path) -> FakeRun:
        started.set()
        assert release.wait(10)
        return run(scenario, cache_dir)  # type: ignore[no-any-return]

    outcomes: list[Golden | None] = []
    first = threading.Thread(
        target=lambda: outcomes.append(
            golden_outcome(_scenario(), tmp_path, use_cache=True, run_fault_free=slow_run, log=lambda _: None)
        )
    )
    first.start()
    assert started.wait(10)
    waiting = threading.Event()

    def log(line: str) -> None:
        if "another run is computing" in line:
            waiting.set()

    second = threading.Thread(
        target=lambda: outcomes.append(
            golden_outcome(_scenario(), tmp_path, use_cache=True, run_fault_free=run, log=log)
        )
    )
    second.start()
    assert waiting.wait(30), "the second run did not wait for the first"
    assert second.is_alive() and not calls  # still waiting: the first has not finished
    release.set()
    first.join(10)
    second.join(10)
    assert len(calls) == 1, "the golden run ran twice"
    assert sorted(o.cached for o in outcomes if o is not None) == [False, True]  # one ran it, one read it
    assert not list(tmp_path.glob("*.tmp"))


def test_a_golden_run_without_digests_gives_nothing(tmp_path: Path) -> None:
    _, run = _runner([ev(1.0, "target.step", 0, step=1)])
    assert golden_outcome(_scenario(), tmp_path, use_cache=True, run_fault_free=run, log=lambda _: None) is None
    assert not list(tmp_path.glob("*.json"))


def test_rankless_digests_round_trip_through_runner_golden() -> None:
    recorded = Golden(A, [], cached=False, digests={None: A}).digests_json()
    assert recorded == {"none": A}
    assert golden_rank_digests(ev(1.0, "runner.golden", digest=A, digests=recorded)) == {None: A}
    assert golden_rank_digests(ev(1.0, "runner.golden", digest=A)) is None  # an old history
    events = [ev(1.0, "target.digest", None, digest=A), ev(2.0, "runner.golden", digest=A, digests=recorded)]
    assert judge("matches_golden", events).status == "pass"


# ---------------------------------------------------------------------------------------------------------
# sdc_detected: masked firings


def flipped(digests: dict[int, str], *detections: Event, step: int = 2) -> list[Event]:
    """A run where FLIP fired on rank 1 at ``step``, with ``detections`` and final ``digests``."""
    return [*finished(digests), ev(1.5 + step, "fault.applied", 1, fault=FLIP, op="op-1", step=step), *detections]


PER_RANK = {"0": A, "1": A}


def test_sdc_detected_needs_the_golden_run() -> None:
    assert checks()["sdc_detected"].needs_golden  # the runner then records runner.golden for it


def test_masked_firing_is_unknown_by_default() -> None:
    result = judge("sdc_detected", [*flipped({0: A, 1: A}), golden(PER_RANK)], fault=FLIP)
    assert result.status == "unknown"
    assert result.measured == "masked" and result.measured_text() == "masked"
    assert "1 of 1 firing(s) masked" in result.reason and "step 2 (rank 1)" in result.reason
    assert "missed" not in result.reason and "no detect.sdc within" not in result.reason
    assert any("every rank's final digest equals the golden run's" in line for line in result.evidence)


@pytest.mark.parametrize("verdict", ["fail", "pass"])
def test_if_masked_sets_the_verdict_of_masked_firings(verdict: str) -> None:
    result = judge("sdc_detected", [*flipped({0: A, 1: A}), golden(PER_RANK)], fault=FLIP, if_masked=verdict)
    assert result.status == verdict and "masked" in result.reason and f"if_masked: {verdict}" in result.reason


def test_an_effective_missed_firing_still_fails() -> None:
    # Rank 1's final state differs from golden: the corruption took effect and no guard saw it.
    for params in ({}, {"if_masked": "pass"}):
        result = judge("sdc_detected", [*flipped({0: A, 1: B}), golden(PER_RANK)], fault=FLIP, **params)
        assert result.status == "fail" and "no detect.sdc within 0 step(s) of step 2 (rank 1)" in result.reason
        assert "masked" not in result.reason
    # a rank that never reported its final state does not prove masking either
    silent = judge("sdc_detected", [*flipped({0: A}), golden(PER_RANK)], fault=FLIP, if_masked="pass")
    assert silent.status == "fail"


@pytest.mark.parametrize("golden_event", [None, golden(None)], ids=["no runner.golden", "old runner.golden"])
def test_without_per_rank_golden_digests_a_miss_stays_a_miss(golden_event: Event | None) -> None:
    events = flipped({0: A, 1: A}) + ([] if golden_event is None else [golden_event])
    result = judge("sdc_detected", events, fault=FLIP, if_masked="pass")
    assert result.status == "fail" and "no detect.sdc within" in result.reason
    assert any("cannot be told from a missed one" in line for line in result.evidence)


def test_a_late_detection_is_not_masked() -> None:
    late = ev(4.6, "detect.sdc", 1, detector="checksum", step=3, culprit_rank=1)
    result = judge("sdc_detected", [*flipped({0: A, 1: A}, late), golden(PER_RANK)], fault=FLIP, if_masked="pass")
    assert result.status == "fail" and "no detect.sdc within 0 step(s) of step 2" in result.reason


def test_masked_and_detected_firings_together() -> None:
    # Two firings: step 1's hit nothing (no detection before the next firing), step 3's was caught and retried.
    events = [
        *finished({0: A, 1: A}),
        ev(2.5, "fault.applied", 1, fault=FLIP, op="op-1", step=1),
        ev(4.5, "fault.applied", 1, fault=FLIP, op="op-2", step=3),
        ev(4.6, "detect.sdc", 1, detector="checksum", step=3, culprit_rank=1, action="retry"),
        golden(PER_RANK),
    ]
    result = judge("sdc_detected", events, fault=FLIP)
    assert result.status == "unknown" and result.measured == 0.0
    assert "1 of 2 firing(s) masked" in result.reason and "step 1 (rank 1)" in result.reason
    assert "the other 1 detected" in result.reason
    assert judge("sdc_detected", events, fault=FLIP, if_masked="pass").status == "pass"
    # the same history with a wrong culprit on the detected firing fails: a real problem outweighs masking
    wrong = [
        e.model_copy(update={"data": {**e.data, "culprit_rank": 0}}) if e.kind == "detect.sdc" else e for e in events
    ]
    failed = judge("sdc_detected", wrong, fault=FLIP, if_masked="pass")
    assert failed.status == "fail" and "not rank 1" in failed.reason and "masked" in failed.reason


def test_many_differing_ranks_are_all_named_in_a_bounded_reason() -> None:
    ranks = tuple(range(16))
    events = [*finished(dict.fromkeys(ranks, B), ranks=ranks), golden({str(r): A for r in ranks})]
    result = judge("matches_golden", events)
    assert result.status == "fail" and result.reason.count("differs from golden") == 10
    assert "rank(s) 10, 11, 12, 13, 14, 15 differ from golden too" in result.reason
