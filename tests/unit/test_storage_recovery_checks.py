"""``restore_straggler_named`` and ``retried_with_backoff`` on hand-made histories: what their reports say (the
safety suite, tests/unit/test_check_safety.py, holds them to pass/fail on many more)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError
from storage_histories import FAULT, RetryRun, StragglerRun

from chaos.checks.base import CheckResult
from chaos.history.timeline import Event, History
from chaos.plugins.registry import checks


def judge(check: str, events: list[Event], **params: Any) -> CheckResult:
    spec = checks()[check]
    return spec.evaluate(History.from_events(events), spec.Params.model_validate({"fault": FAULT, **params}), None)


def test_the_straggler_is_named_with_its_excess_and_the_time_to_resume() -> None:
    result = judge("restore_straggler_named", StragglerRun(world=4, aimed=2, delay=3.0).events())
    assert result.status == "pass", result.reason
    assert result.reason.startswith("rank 2 was the restore straggler: 3.12s")
    assert "time to resume" in result.reason
    assert isinstance(result.measured, float) and 2.9 < result.measured < 3.1  # over the next slowest (rank 3)
    assert result.name == f"restore_straggler_named[{FAULT}]"


def test_a_straggler_that_is_not_the_delayed_rank_is_named_and_fails() -> None:
    result = judge("restore_straggler_named", StragglerRun(world=3, aimed=1, slow=0).events(), rank=1)
    assert result.status == "fail"
    assert "rank 0 was the restore straggler" in result.reason and "delayed rank 1's reads" in result.reason


def test_the_rank_is_read_from_the_delayed_paths_only_when_they_name_one() -> None:
    events = [e for e in StragglerRun().events() if e.kind != "storage.hit"]
    hit = next(e for e in StragglerRun().events() if e.kind == "storage.hit")
    odd = hit.model_copy(update={"data": {**hit.data, "path": "step-10/shard.pt"}})
    result = judge("restore_straggler_named", [*events, odd])
    assert result.status == "unknown" and "no single rank" in result.reason
    assert judge("restore_straggler_named", [*events, odd], rank=1).status == "pass"


def test_backoff_reports_attempts_and_gaps() -> None:
    result = judge("retried_with_backoff", RetryRun(base=0.2, growth=2.0, window=3.0).events())
    assert result.status == "pass", result.reason
    assert result.measured == "4 failed attempt(s), gaps 0.21/0.41/0.81s"
    assert "rank 0 (step 20)" in result.reason


def test_a_users_job_that_reports_nothing_is_judged_from_the_layers_errors() -> None:
    result = judge("retried_with_backoff", RetryRun(report=False).events())
    assert result.status == "pass", result.reason
    assert "bursts of errors the layer returned" in " ".join(result.evidence)


def test_a_tight_loop_and_a_crash_are_told_apart() -> None:
    spin = judge("retried_with_backoff", RetryRun(spin=1000, report=False).events())
    assert spin.status == "fail" and spin.reason.startswith("a tight loop: the layer returned 2000 errors")
    crash = judge("retried_with_backoff", RetryRun(crashes=True).events())
    assert crash.status == "fail" and "exited after the first storage error" in crash.reason


def test_a_backoff_needs_two_gaps_to_be_judged() -> None:
    # Two failures a fixed 0.5 s apart show one gap, so nothing shows it grew: a min_attempts below 3 would
    # let such a run pass "with growing gaps", so it is refused, and the default judges it unknown.
    events = RetryRun(base=0.5, growth=1.0, window=0.8).events()
    assert len([e for e in events if e.kind == "target.checkpoint_retry"]) == 2
    with pytest.raises(ValidationError, match="min_attempts"):
        judge("retried_with_backoff", events, min_attempts=2)
    assert judge("retried_with_backoff", events).status == "unknown"
