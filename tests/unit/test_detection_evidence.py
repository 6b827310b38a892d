"""``detected_within`` counts only evidence tied to the fault it judges (no false passes).

Histories here are shaped like recorded ones (the runner's ``fault.applied`` names the fault, op and host, not
the rank; the ranks' ``target.start`` events give their pids and hosts) and judged against the SHIPPED
scenarios, so the rank, replica or host a fault hit comes from the scenario as in a real run.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError
from support import SCENARIOS
from test_checks import ev

from chaos.checks.base import CheckResult
from chaos.checks.detection import DetectedWithinParams
from chaos.history.timeline import Event, History
from chaos.plugins.registry import checks
from chaos.spec.scenario import Scenario, parse_scenario


def shipped(name: str) -> Scenario:
    return parse_scenario((SCENARIOS / f"{name}.yaml").read_text(encoding="utf-8"))


def judge(events: list[Event], scenario: Scenario | None, **params: Any) -> CheckResult:
    spec = checks()["detected_within"]
    return spec.evaluate(History.from_events(events), spec.Params.model_validate(params), scenario)


def ranks_started(hosts: dict[int, str] | None = None, world: int = 2) -> list[Event]:
    """Every rank's target.start at t=0.5 (pid 100 + rank), with its host on a multi-node run."""
    return [
        ev(
            0.5,
            "target.start",
            r,
            pid=100 + r,
            attempt=0,
            world_size=world,
            **({} if hosts is None else {"host": hosts[r]}),
        )
        for r in range(world)
    ]


def kill_rank1(*after: Event) -> list[Event]:
    """kill-rank.yaml's fault as the runner records it: SIGKILL of rank 1 at t=10, then ``after``."""
    applied = ev(10.0, "fault.applied", fault="kill-rank1", op="kill-rank1#1", injector="kill", host="local")
    return [ev(0.0, "runner.start"), *ranks_started(), applied, *after]


KILL = shipped("kill-rank")
WITHIN = {"fault": "kill-rank1", "within": "30s"}


# ---------------------------------------------------------------------------------------------------------
# the pinned defect and its healthy twin


def test_a_straggler_warning_on_another_rank_does_not_detect_a_kill() -> None:
    # Defect: the first later detect.* of any kind on any rank was taken as the detection, so a straggler
    # warning about rank 0 "detected" the kill of rank 1.
    result = judge(
        kill_rank1(ev(11.0, "detect.straggler", 0, detector="straggler", reporter=0, step=26)), KILL, **WITHIN
    )
    assert result.status == "fail", result
    assert "never detected" in result.reason and "names rank 0, not rank 1" in result.reason
    assert any("ignored: names rank 0" in line for line in result.evidence)


def test_a_kill_detected_by_its_peer_passes() -> None:
    # the survivor's failed collective is how the group sees the kill: its rank is the reporter, not the culprit
    events = kill_rank1(
        ev(10.2, "detect.collective_error", 0, detector="gloo", step=26),
        ev(10.3, "detect.peer_lost", 0, detector="gloo", step=26, peer="127.0.0.1:34211"),
    )
    result = judge(events, KILL, **WITHIN)
    assert result.status == "pass", result.reason
    assert result.measured == pytest.approx(0.2)
    assert any("group-level detection" in line for line in result.evidence)


def test_the_straggler_warning_is_skipped_and_the_real_detection_counts() -> None:
    events = kill_rank1(
        ev(10.5, "detect.straggler", 0, detector="straggler", step=26),
        ev(12.0, "detect.worker_exit", 1, exitcode=-9, pid=101),
    )
    result = judge(events, KILL, **WITHIN)
    assert result.status == "pass" and result.measured == pytest.approx(2.0)
    assert any(line.startswith("detect.straggler rank 0") and "ignored" in line for line in result.evidence)


def test_a_detection_before_or_at_the_fault_is_not_evidence() -> None:
    events = kill_rank1(ev(9.0, "detect.worker_exit", 1, pid=101), ev(10.0, "detect.worker_exit", 1, pid=101))
    assert judge(events, KILL, **WITHIN).status == "fail"


def test_a_detection_after_the_bound_is_too_slow_not_missing() -> None:
    result = judge(kill_rank1(ev(45.0, "detect.worker_exit", 1, pid=101)), KILL, **WITHIN)
    assert result.status == "fail" and result.measured == pytest.approx(35.0) and "over the 30s bound" in result.reason


# ---------------------------------------------------------------------------------------------------------
# localizations


@pytest.mark.parametrize(("culprit", "named"), [(None, "nobody"), (0, "rank 0")])
def test_a_first_detection_localizing_to_nobody_or_another_rank_fails(culprit: int | None, named: str) -> None:
    events = kill_rank1(
        ev(10.1, "detect.sdc", 0, detector="checksum", step=26, culprit_rank=culprit),
        ev(10.2, "detect.collective_error", 0, detector="gloo", step=26),  # a right detection follows
    )
    result = judge(events, KILL, **WITHIN)
    assert result.status == "fail", result
    assert f"localized to {named}, not rank 1" in result.reason


def test_a_wrong_localization_after_the_right_detection_does_not_count_but_does_not_fail() -> None:
    events = kill_rank1(
        ev(10.1, "detect.collective_error", 0, detector="gloo", step=26),
        ev(10.2, "detect.sdc", 0, detector="checksum", step=26, culprit_rank=0),
    )
    assert judge(events, KILL, **WITHIN).status == "pass"
    alone = kill_rank1(ev(10.2, "detect.sdc", 0, detector="checksum", step=26, culprit_rank=0))
    assert judge(alone, KILL, by="detect.sdc", fault="kill-rank1", within="30s").status == "fail"


def test_a_localization_naming_the_faulted_rank_counts_whoever_reports_it() -> None:
    events = kill_rank1(ev(10.4, "detect.sdc", 0, detector="checksum", step=26, culprit_rank=1))
    result = judge(events, KILL, by="detect.sdc", fault="kill-rank1", within="30s")
    assert result.status == "pass" and any("localized to rank 1" in line for line in result.evidence)


def test_a_divergence_without_a_single_culprit_counts_when_its_odd_ranks_include_the_faulted_one() -> None:
    def divergence(odd: list[int]) -> Event:
        return ev(10.3, "detect.divergence", 0, detector="consistency", reporter=0, odd_ranks=odd, culprit_rank=None)

    assert judge(kill_rank1(divergence([1, 2])), KILL, **WITHIN).status == "pass"
    result = judge(kill_rank1(divergence([0, 2])), KILL, **WITHIN)
    assert result.status == "fail" and "localized to ranks 0, 2, not rank 1" in result.reason


def test_an_in_job_fault_is_tied_to_the_rank_it_fired_on() -> None:
    # an in-job fault's fault.applied comes from the agent, on the rank it fired on
    base = [*ranks_started(), ev(5.0, "fault.applied", 1, fault="flip", op="flip#1", injector="grad_corrupt", step=15)]
    on_it = judge([*base, ev(5.2, "detect.grad_anomaly", 1, detector="anomaly", step=15)], None, fault="flip", within=1)
    assert on_it.status == "pass"
    elsewhere = judge(
        [*base, ev(5.2, "detect.grad_anomaly", 0, detector="anomaly", step=15)], None, fault="flip", within=1
    )
    assert elsewhere.status == "fail" and "names rank 0, not rank 1" in elsewhere.reason


# ---------------------------------------------------------------------------------------------------------
# multi-node: processes and hosts


HOSTS = {0: "h1", 1: "h2", 2: "h3"}


def test_a_worker_exit_without_rank_is_tied_by_its_host_and_pid() -> None:
    # multi-node: torchrun names local ranks, so the harness keeps only host, pid and local_rank
    slow = shipped("slow-node")  # slow rank 1 (runs on h2)
    applied = ev(10.0, "fault.applied", fault="slow-node", op="slow-node#1", injector="slow", host="h2")
    base = [*ranks_started(HOSTS, world=3), applied]

    def exit_of(pid: int, host: str) -> list[Event]:
        return [*base, ev(11, "detect.worker_exit", None, pid=pid, host=host, exitcode=1, local_rank=0)]

    ours = judge(exit_of(101, "h2"), slow, fault="slow-node", within="5s")
    assert ours.status == "pass", ours.reason
    assert judge(exit_of(100, "h1"), slow, fault="slow-node", within="5s").status == "fail"
    assert judge(exit_of(101, "h1"), slow, fault="slow-node", within="5s").status == "fail"  # same pid, other host


def test_a_host_fault_is_detected_by_its_group_and_not_by_a_straggler_elsewhere() -> None:
    partition = shipped("partition-node")  # cut the host running rank 2 (h3)
    applied = ev(10.0, "fault.applied", fault="cut-node", op="cut-node#1", injector="partition", host="h3")
    base = [*ranks_started(HOSTS, world=3), applied]
    # rank 0 (on h1) reports that rank 0 is a straggler: the event comes from h1 and names rank 0
    straggler = ev(11.0, "detect.straggler", 0, detector="straggler", reporter=0, host="h1")
    assert judge([*base, straggler], partition, fault="cut-node", within="15s").status == "fail"
    lost = ev(14.9, "detect.peer_lost", 1, detector="pg_timeout", peer=None, host="h2")
    assert judge([*base, straggler, lost], partition, fault="cut-node", within="15s").measured == pytest.approx(4.9)
    # a straggler warning naming rank 2, the rank on the cut host, is about it wherever it was reported
    named = ev(11.0, "detect.straggler", 2, detector="straggler", reporter=0, host="h1")
    assert judge([*base, named], partition, fault="cut-node", within="15s").status == "pass"


def test_a_host_fault_that_hit_no_rank_is_not_detected_by_a_group_timeout() -> None:
    # the fault hit h4, where no rank runs: the group's timeout right after it is not about it
    applied = ev(10.0, "fault.applied", fault="cut-node", op="cut-node#1", injector="partition", host="h4")
    events = [*ranks_started(HOSTS, world=3), applied, ev(11, "detect.collective_timeout", 0, detector="gloo")]
    result = judge(events, shipped("partition-node"), fault="cut-node", within="15s")
    assert result.status == "fail" and "host h4" in result.reason


# ---------------------------------------------------------------------------------------------------------
# serving: replicas and the harness host


def serving_kill(*after: Event) -> list[Event]:
    applied = ev(4.0, "fault.applied", fault="kill-primary", op="kill-primary#1", injector="kill", host="local")
    return [ev(0.0, "runner.start"), applied, *after]


def test_a_replica_fault_is_detected_only_by_a_detection_naming_that_replica() -> None:
    scenario = shipped("serving-primary-killed")
    params = {"fault": "kill-primary", "within": "3s", "event": "detect.backend_down"}
    wrong = serving_kill(ev(5.0, "detect.backend_down", backend="fallback", reason="health", failures=3))
    result = judge(wrong, scenario, **params)
    assert result.status == "fail" and "names backend fallback, not replica primary" in result.reason
    right = serving_kill(ev(5.1, "detect.backend_down", backend="primary", reason="health", failures=3))
    assert judge(right, scenario, **params).status == "pass"


def test_a_partition_of_the_harness_host_is_detected_by_what_runs_there() -> None:
    scenario = shipped("serving-primary-partitioned")  # peers and ports: no replica named, the host as a whole
    applied = ev(4.0, "fault.applied", fault="cut-primary", op="cut-primary#1", injector="partition", host="local")
    down = ev(5.5, "detect.backend_down", backend="primary", reason="health", failures=3)
    result = judge([applied, down], scenario, fault="cut-primary", within="3s", event="detect.backend_down")
    assert result.status == "pass" and any("from host local" in line for line in result.evidence)
    remote = down.model_copy(update={"data": {**down.data, "host": "h9"}})
    assert judge([applied, remote], scenario, fault="cut-primary", within="3s").status == "fail"


def test_an_in_job_fault_on_a_serving_replica_is_tied_to_that_backend() -> None:
    # the reference stack runs each model server as a rank (primary = 0): the agent records the flip on rank 0
    scenario = shipped("serving-silent-corruption")
    applied = ev(4.0, "fault.applied", 0, fault="corrupt-primary", op="corrupt-primary#1", injector="bitflip", step=400)
    wrong = ev(4.5, "detect.wrong_answer", backend="primary", max_abs_err=7e34, tolerance=1e-4)
    result = judge([applied, wrong], scenario, fault="corrupt-primary", within="3s")
    assert result.status == "pass" and any("names replica primary" in line for line in result.evidence)
    other = wrong.model_copy(update={"data": {**wrong.data, "backend": "fallback"}})
    assert judge([applied, other], scenario, fault="corrupt-primary", within="3s").status == "fail"


# ---------------------------------------------------------------------------------------------------------
# jobs without ranks, declared group detectors, rank:


def test_in_a_job_without_ranks_an_alarm_naming_nothing_speaks_for_the_job() -> None:
    applied = ev(1.0, "fault.applied", fault="freeze-1", op="freeze-1#1", injector="freeze", host="local")
    alarm = ev(1.2, "detect.alarm", line="alarm")
    steps = [ev(0.5, "target.step", step=1), ev(1.5, "target.step", step=2)]
    assert judge([*steps, applied, alarm], None, fault="freeze-1", within=5).status == "pass"
    # once the job has ranks, a rank-less alarm names nobody in particular: it does not detect a rank's kill
    late_alarm = alarm.model_copy(update={"ts_ns": 10_500_000_000})
    assert judge(kill_rank1(late_alarm), KILL, **WITHIN).status == "fail"


def test_a_declared_group_detector_counts_for_any_rank_the_fault_hit() -> None:
    events = kill_rank1(ev(10.5, "detect.heartbeat_missed", 0, detector="watchdog"))
    assert judge(events, KILL, **WITHIN).status == "fail"  # rank 0's own heartbeat: not about rank 1
    declared = judge(events, KILL, group_kinds=["detect.heartbeat_*"], **WITHIN)
    assert declared.status == "pass" and declared.measured == pytest.approx(0.5)


def test_rank_states_the_evidence_itself() -> None:
    events = kill_rank1(ev(10.5, "detect.straggler", 0, detector="straggler"), ev(11, "detect.collective_error", 0))
    assert judge(events, KILL, rank=0, **WITHIN).measured == pytest.approx(0.5)
    # a wrong localization still never counts, on whatever rank it is reported
    wrong = kill_rank1(ev(10.5, "detect.sdc", 0, culprit_rank=0))
    assert judge(wrong, KILL, rank=0, **WITHIN).status == "fail"


# ---------------------------------------------------------------------------------------------------------
# params


def test_by_and_its_former_name_event() -> None:
    assert DetectedWithinParams.model_validate(WITHIN).kinds == "detect.*"
    assert DetectedWithinParams.model_validate({**WITHIN, "by": "detect.peer_lost"}).kinds == "detect.peer_lost"
    assert DetectedWithinParams.model_validate({**WITHIN, "event": "detect.peer_lost"}).kinds == "detect.peer_lost"
    with pytest.raises(ValidationError, match="give by or its former name event, not both"):
        DetectedWithinParams.model_validate({**WITHIN, "by": "detect.a", "event": "detect.b"})
    events = kill_rank1(ev(10.2, "detect.collective_error", 0), ev(10.4, "detect.peer_lost", 0))
    assert judge(events, KILL, by="detect.peer_lost", **WITHIN).measured == pytest.approx(0.4)


def test_every_shipped_scenario_with_detected_within_still_parses() -> None:
    found = 0
    for path in sorted(SCENARIOS.glob("*.yaml")):
        scenario = parse_scenario(path.read_text(encoding="utf-8"))
        for check in scenario.checks:
            if check.type == "detected_within":
                assert isinstance(check.params, DetectedWithinParams)
                found += 1
    assert found >= 8


def test_a_torchft_groups_kill_is_detected_by_a_survivors_quorum_that_lost_it_not_by_one_that_lost_another() -> None:
    scenario = shipped("torchft-replica-killed")  # group 1 killed; the roles target names the lost group
    applied = ev(4.0, "fault.applied", fault="kill-group-1", op="kill-group-1#1", injector="kill", replica="group.1")
    seen = {
        "lost": ["user_torchft_1"],
        "detector": "torchft",
        "signature": "torchft_quorum_lost",
        "reporter": "group.0",
    }
    right = ev(9.0, "detect.peer_lost", replica="group.1", **seen)
    result = judge([applied, right], scenario, fault="kill-group-1", within="6s")
    assert result.status == "pass" and any("names replica group.1" in line for line in result.evidence), result
    both = ev(9.0, "detect.peer_lost", replicas=["group.1", "group.2"], **seen)  # two groups lost in one quorum
    assert judge([applied, both], scenario, fault="kill-group-1", within="6s").status == "pass"
    other = ev(9.0, "detect.peer_lost", replica="group.0", **{**seen, "reporter": "group.1"})
    assert judge([applied, other], scenario, fault="kill-group-1", within="6s").status == "fail"
