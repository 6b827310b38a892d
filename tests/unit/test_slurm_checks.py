"""The Slurm checks on hand-made histories (the slurm target's event contract): what each measures, cites, and
when it cannot tell. The property-based holds/violates pairs are in ``test_check_safety``."""

from __future__ import annotations

from typing import Any

from slurm_histories import FAULT, HC_REASON, SlurmRun, applied, job, node

from chaos.checks.base import CheckResult
from chaos.history.timeline import Event, History
from chaos.plugins.registry import checks


def judge(check: str, events: list[Event], **params: Any) -> CheckResult:
    spec = checks()[check]
    return spec.evaluate(History.from_events(events), spec.Params.model_validate(params), None)


def test_node_drained_within_measures_the_fault_to_drain_time_and_cites_the_reason() -> None:
    result = judge("node_drained_within", SlurmRun().events(), fault=FAULT, within="10s", by="health_check")
    assert result.status == "pass" and result.measured == 4.0, result
    assert result.name == f"node_drained_within[{FAULT}]"
    assert any("h2 ALLOCATED+DRAIN (mlchaos-hc: xid 79" in line for line in result.evidence), result.evidence
    # by: any takes an operator's drain too
    other = SlurmRun(drain_reason="operator").events()
    assert judge("node_drained_within", other, fault=FAULT, within=10).status == "pass"
    assert judge("node_drained_within", other, fault=FAULT, within=10, by="health_check").status == "fail"


def test_node_drained_within_cannot_tell_for_a_node_drained_before_the_fault_or_a_short_history() -> None:
    events = [*SlurmRun().events(), node(3.0, "h2", "ALLOCATED+DRAIN", "operator")]
    result = judge("node_drained_within", events, fault=FAULT, within=10)
    assert result.status == "unknown" and "already drained" in result.reason, result
    short = SlurmRun(drain_after=None, requeue_after=None, heal_after=None, end=8.0).events()
    result = judge("node_drained_within", short, fault=FAULT, within=10)
    assert result.status == "unknown" and "history ends" in result.reason, result
    nowhere = [
        e.model_copy(update={"data": {**e.data, "host": None}}) if e.kind == "fault.applied" else e for e in short
    ]
    assert judge("node_drained_within", nowhere, fault=FAULT, within=1).status == "unknown"


def test_requeued_within_counts_a_restarts_jump_when_polling_missed_the_requeue() -> None:
    events = [
        job(0.0, "PENDING"),
        job(1.0, "RUNNING", ("h1", "h2")),
        applied(5.0, "h2"),
        job(14.0, "RUNNING", ("h1", "h3"), restarts=1),
        Event(ts_ns=60_000_000_000, kind="runner.end"),
    ]
    result = judge("requeued_within", events, fault=FAULT, within="20s")
    assert result.status == "pass" and result.measured == 9.0, result
    assert judge("requeued_within", events, fault=FAULT, within="5s").status == "fail"


def test_requeued_within_judges_the_job_on_the_hit_node_only() -> None:
    events = [
        job(1.0, "RUNNING", ("h3",), job_id=9),  # another job, elsewhere: not the one hit
        *SlurmRun(hit="h1").events(),
    ]
    assert judge("requeued_within", events, fault=FAULT, within=30).status == "pass"
    stranger = [job(1.0, "RUNNING", ("h3",), job_id=9), applied(5.0, "h3"), Event(ts_ns=90 * 10**9, kind="x")]
    result = judge("requeued_within", stranger, fault=FAULT, within=30)
    assert result.status == "fail" and "job 9" in result.reason, result


def test_no_repeat_without_fault_judges_every_applied_fault_and_names_the_repeat() -> None:
    run = SlurmRun(rerun=("h2", "h3"), heal_after=None)
    result = judge("no_repeat_failure_on_bad_node", run.events())
    assert result.status == "fail" and result.name == "no_repeat_failure_on_bad_node", result
    assert "job 7 RUNNING restarts 1 nodes h2,h3" in result.reason and "h2 ALLOCATED+DRAIN" in result.reason
    assert judge("no_repeat_failure_on_bad_node", SlurmRun().events(), fault=FAULT).status == "pass"
    # a node that was healed and resumed may take the job again
    back = SlurmRun(drain_after=2.0, rerun_after=15.0, heal_after=10.0, resume_after=11.0, rerun=("h2", "h3"))
    assert judge("no_repeat_failure_on_bad_node", back.events()).status == "pass"
    assert HC_REASON.startswith("mlchaos-hc: ")


def test_requeued_within_on_requeue_exit_counts_the_next_attempt_not_the_failed_attempts_end() -> None:
    # A job that asks for its requeue (exit = RequeueExit): its attempt ends FAILED in accounting, then the job is
    # REQUEUED and RUNNING again under its id with Slurm's restart count one higher (seen on the testbed).
    running = job(1.0, "RUNNING", ("h1", "h2"))
    requeued = [job(14.0, "FAILED", ("h1", "h2")), job(14.0, "REQUEUED", (), 1), job(14.5, "PENDING", (), 1)]
    again = job(25.0, "RUNNING", ("h1", "h3"), 1)
    end = job(42.0, "COMPLETED", ("h1", "h3"), 1)
    result = judge("requeued_within", [running, applied(12.0, "h2"), *requeued, again, end], fault=FAULT, within=90)
    assert result.status == "pass" and result.measured == 13.0, result
    # Failed for good: no later attempt. And a RUNNING again WITHOUT a higher restart count (e.g. a suspended
    # job resumed) is not a requeue.
    gone = judge(
        "requeued_within",
        [running, applied(12.0, "h2"), requeued[0], job(60.0, "FAILED", ("h1", "h2"))],
        fault=FAULT,
        within=90,
    )
    assert gone.status == "fail" and "was not requeued" in gone.reason, gone
    resumed = [running, applied(12.0, "h2"), job(13.0, "SUSPENDED", ("h1", "h2")), job(14.0, "RUNNING", ("h1", "h2"))]
    assert (
        judge("requeued_within", [*resumed, job(99.0, "COMPLETED", ("h1", "h2"))], fault=FAULT, within=90).status
        != "pass"
    )


def test_node_drained_within_cannot_tell_for_a_node_first_seen_drained_after_the_fault() -> None:
    # Slurm's first sight of h2 is the drain, after the fault: it may have been drained before the fault hit.
    unseen = SlurmRun(seen_before_fault=False).events()
    result = judge("node_drained_within", unseen, fault=FAULT, within="10s", by="health_check")
    assert result.status == "unknown" and "no slurm.node event showed h2 before" in result.reason, result
