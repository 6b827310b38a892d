"""The replica-aware checks (survivors_progress, rejoined_within, replicas_agree) on simulated histories:
healthy replica groups pass, each way of misbehaving fails (or is unknown where the history cannot tell)."""

from __future__ import annotations

from typing import Any

import pytest
from replica_histories import FAULT, ReplicaRun

from chaos.checks.base import CheckResult
from chaos.history.timeline import Event, History
from chaos.plugins.registry import checks

HEALTHY = ReplicaRun()


def judge(check: str, run: ReplicaRun, **params: Any) -> CheckResult:
    spec = checks()[check]
    return spec.evaluate(History.from_events(run.events()), spec.Params.model_validate(params), run.scenario())


# -- survivors_progress


def test_survivors_progress_passes_when_the_survivor_keeps_committing() -> None:
    result = judge("survivors_progress", HEALTHY, fault=FAULT, max_stall="2s")
    assert result.status == "pass", result.reason
    assert result.measured is not None and result.measured <= 0.6  # one period, not the 4 s the victim was down
    assert any("g.0" in line for line in result.evidence)


def test_survivors_progress_fails_when_the_survivor_crashes_while_the_victim_is_down() -> None:
    result = judge("survivors_progress", HEALTHY.but(survivor_dies_at=7.0), fault=FAULT, max_stall="2s")
    assert result.status == "fail"
    assert "survivor g.0 died" in result.reason


def test_survivors_progress_fails_when_the_survivor_stalls() -> None:
    result = judge("survivors_progress", HEALTHY.but(survivor_stalls=(5.0, 8.5)), fault=FAULT, max_stall="2s")
    assert result.status == "fail"
    assert result.measured is not None and result.measured > 3.0


def test_survivors_progress_judges_a_victim_that_never_returns_to_the_end() -> None:
    stalled = HEALTHY.but(back_at=None, survivor_stalls=(12.0, 20.0))  # after the victim would have been back
    assert judge("survivors_progress", stalled, fault=FAULT, max_stall="2s").status == "fail"
    assert judge("survivors_progress", HEALTHY.but(back_at=None), fault=FAULT, max_stall="2s").status == "pass"


def test_survivors_progress_is_unknown_without_the_fault() -> None:
    result = judge("survivors_progress", HEALTHY.but(applied=False), fault=FAULT, max_stall="2s")
    assert result.status == "unknown"
    assert "never applied" in result.reason


def test_survivors_progress_is_unknown_when_nobody_else_was_committing() -> None:
    result = judge("survivors_progress", HEALTHY.but(replicas=1, victim=0), fault=FAULT, max_stall="2s")
    assert result.status == "unknown"


# -- rejoined_within


def test_rejoined_within_measures_the_time_to_the_first_healed_commit() -> None:
    result = judge("rejoined_within", HEALTHY, fault=FAULT, within="10s")
    assert result.status == "pass", result.reason
    assert result.measured == pytest.approx(4.0, abs=0.01)  # fault at 5 s, back at 9 s
    assert judge("rejoined_within", HEALTHY, fault=FAULT, within="3s").status == "fail"


def test_rejoined_within_fails_a_replica_that_restarts_from_scratch() -> None:
    result = judge("rejoined_within", HEALTHY.but(from_scratch=True), fault=FAULT, within="5s")
    assert result.status == "fail"
    assert "did not heal from a peer" in result.reason


def test_rejoined_within_fails_a_replica_that_never_returns() -> None:
    result = judge("rejoined_within", HEALTHY.but(back_at=None), fault=FAULT, within="5s")
    assert result.status == "fail"
    assert "never rejoined" in result.reason


def test_rejoined_within_is_unknown_when_the_history_ends_before_the_bound() -> None:
    result = judge("rejoined_within", HEALTHY.but(back_at=None), fault=FAULT, within="60s")
    assert result.status == "unknown"


# -- replicas_agree


def test_replicas_agree_passes_identical_digests_after_the_rejoin() -> None:
    result = judge("replicas_agree", HEALTHY, fault=FAULT)
    assert result.status == "pass", result.reason
    assert result.measured is not None and result.measured >= 10  # steps 18..30, both replicas
    assert judge("replicas_agree", HEALTHY).status == "pass"


def test_replicas_agree_fails_a_rejoined_replica_with_stale_parameters() -> None:
    result = judge("replicas_agree", HEALTHY.but(stale_digest=True), fault=FAULT)
    assert result.status == "fail"
    assert "replica(s) g.1 hold other parameters" in result.reason


def test_replicas_agree_is_unknown_when_the_victim_never_rejoined() -> None:
    assert judge("replicas_agree", HEALTHY.but(back_at=None), fault=FAULT).status == "unknown"
    assert judge("replicas_agree", HEALTHY.but(applied=False), fault=FAULT).status == "unknown"


def _digest(ts: float, replica: str, step: int, digest: str) -> Event:
    return Event(ts_ns=int(ts * 1e9), kind="target.digest", data={"replica": replica, "step": step, "digest": digest})


def test_replicas_agree_compares_a_step_only_within_one_run_of_the_job() -> None:
    # The job lost its run and started over at step 1: group.0 healed straight to step 3 in the new run, so
    # its step-1 digest is the old run's; comparing it with group.1's new step 1 would be a false alarm.
    events = [
        _digest(1, "g.0", 1, "a1"),
        _digest(1, "g.1", 1, "a1"),
        _digest(2, "g.0", 2, "a2"),
        _digest(2, "g.1", 2, "a2"),
    ]
    events += [
        _digest(10, "g.1", 1, "b1"),
        _digest(11, "g.1", 2, "b2"),
        _digest(12, "g.1", 3, "b3"),
        _digest(12, "g.0", 3, "b3"),
    ]
    spec = checks()["replicas_agree"]
    result = spec.evaluate(History.from_events(events), spec.Params(), None)
    assert result.status == "pass", result.reason
    assert result.measured == 3  # (old run) steps 1, 2 and (new run) step 3
    broken = [*events, _digest(13, "g.0", 4, "b4"), _digest(13, "g.1", 4, "XX")]
    result = spec.evaluate(History.from_events(broken), spec.Params(), None)
    assert result.status == "fail" and "at step 4" in result.reason


def test_rejoined_within_cannot_tell_for_a_replica_that_had_not_joined_before_the_fault() -> None:
    # g.1 committed nothing before the fault: its first commit after it (at the peers' step) is a first join.
    result = judge("rejoined_within", HEALTHY.but(victim_joined=False), fault=FAULT, within="10s")
    assert result.status == "unknown" and "g.1 committed no step before" in result.reason, result
