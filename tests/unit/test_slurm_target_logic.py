"""The slurm target's pure parts: state diffs into slurm.job/slurm.node events, when a job counts as over, its
exit code, the spec model, the ``slurm:`` host selector, the cluster record, and the node faults' "ours"
rule for resuming."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import ValidationError

from chaos.cluster.hosts import HostsError, HostSet, host_of_node, node_of_host
from chaos.cluster.inventory import Host, Inventory
from chaos.slurm.client import AccountingRecord, parse_node
from chaos.slurm.locate import SlurmCluster
from chaos.spec.preflight import preflight
from chaos.spec.scenario import FaultSpec, HostSelector, parse_scenario
from chaos.spec.slurm import SlurmTarget
from chaos.targets.slurm_watch import JobView, JobWatch, NodeWatch, exit_code_of
from injectors.slurm.nodes import NodeFault, ours

S = 1_000_000_000


def _view(state: str, restarts: int = 0, nodes: tuple[str, ...] = ("h1", "h2"), code: str = "0:0") -> JobView:
    return JobView(state, None, nodes if state != "PENDING" else (), restarts, code)


def _record(state: str, end_s: int, nodes: tuple[str, ...] = ("h1", "h2")) -> AccountingRecord:
    end = datetime.fromtimestamp(1_700_000_000 + end_s, tz=UTC)
    return AccountingRecord("7", "job", state, 0, 0, nodes, end, end, end)


def test_first_observation_and_every_change_are_recorded_once() -> None:
    watch = JobWatch(7)
    assert [e.data["state"] for e in watch.observe(_view("PENDING"), 1)] == ["PENDING"]
    assert watch.observe(_view("PENDING"), 2) == []
    events = watch.observe(_view("RUNNING"), 3)
    assert len(events) == 1 and events[0].kind == "slurm.job" and events[0].source == "slurm"
    assert events[0].data == {
        "job_id": 7,
        "state": "RUNNING",
        "reason": None,
        "nodes": ["h1", "h2"],
        "restarts": 0,
        "exit_code": "0:0",
    }


def test_a_missed_attempt_end_is_read_from_accounting_then_requeued() -> None:
    watch = JobWatch(7)
    watch.observe(_view("RUNNING"), 1)
    records = [_record("NODE_FAIL", 30)]
    events = watch.observe(_view("PENDING", restarts=1), 2, attempts=lambda: records)
    assert [(e.data["state"], e.data["restarts"], e.data.get("via")) for e in events] == [
        ("NODE_FAIL", 0, "accounting"),
        ("REQUEUED", 1, "restarts"),
        ("PENDING", 1, None),
    ]
    assert events[0].data["nodes"] == ["h1", "h2"]


def test_a_seen_end_is_not_read_again_and_a_shown_requeue_not_doubled() -> None:
    watch = JobWatch(7)
    watch.observe(_view("RUNNING"), 1)
    watch.observe(_view("NODE_FAIL"), 2)

    def never() -> list[AccountingRecord]:
        raise AssertionError("accounting read although the end was seen")

    events = watch.observe(_view("REQUEUED", restarts=1), 3, attempts=never)
    assert [e.data["state"] for e in events] == ["REQUEUED"]


def test_accounting_that_fails_only_loses_the_extra_event() -> None:
    watch = JobWatch(7)
    watch.observe(_view("RUNNING"), 1)

    def broken() -> list[AccountingRecord]:
        raise RuntimeError("sacct down")

    events = watch.observe(_view("PENDING", restarts=1), 2, attempts=broken)
    assert [e.data["state"] for e in events] == ["REQUEUED", "PENDING"]


def test_second_attempt_end_is_the_second_record() -> None:
    watch = JobWatch(7)
    watch.observe(_view("RUNNING", restarts=1), 1)
    records = [_record("FAILED", 40), _record("NODE_FAIL", 10)]  # out of order: sorted by end
    events = watch.observe(_view("PENDING", restarts=2), 2, attempts=lambda: records)
    assert (events[0].data["state"], events[0].data["restarts"]) == ("FAILED", 1)


def test_a_job_is_over_only_after_its_final_state_held() -> None:
    watch = JobWatch(7)
    watch.observe(_view("RUNNING"), 0)
    watch.observe(_view("COMPLETED"), 1 * S)
    assert not watch.settled(1 * S)  # one poll
    watch.observe(_view("COMPLETED"), int(1.5 * S))
    assert not watch.settled(int(1.5 * S))  # not a second yet
    watch.observe(_view("COMPLETED"), 2 * S)
    assert watch.settled(2 * S)


def test_a_final_state_that_turns_into_a_requeue_is_not_over() -> None:
    watch = JobWatch(7)
    watch.observe(_view("RUNNING"), 0)
    watch.observe(_view("NODE_FAIL"), 1 * S)
    watch.observe(_view("PENDING", restarts=1), 2 * S)
    assert not watch.settled(5 * S)


@pytest.mark.parametrize(
    ("state", "code", "expected"),
    [("COMPLETED", "0:0", 0), ("FAILED", "3:0", 3), ("CANCELLED", "0:15", 143), ("NODE_FAIL", "0:0", 1)],
)
def test_exit_code(state: str, code: str, expected: int) -> None:
    assert exit_code_of(_view(state, code=code)) == expected


def test_job_state_loses_slurm_suffixes() -> None:
    from chaos.slurm.client import parse_job

    job = parse_job("JobId=9 JobName=x JobState=CANCELLED Reason=None NodeList=h[1-2] Restarts=2 ExitCode=0:15")
    assert JobView.of(job) == JobView("CANCELLED", None, ("h1", "h2"), 2, "0:15")


def test_node_events_carry_slurms_state_string_and_reason() -> None:
    watch = NodeWatch(["h1", "h2"])
    idle = parse_node("NodeName=h1 NodeAddr=10.0.0.1 State=IDLE")
    drained = parse_node(
        "NodeName=h1 NodeAddr=10.0.0.1 State=IDLE+DRAIN Reason=mlchaos-hc: xid 79 [root@2026-11-24T10:00:00]"
    )
    other = parse_node("NodeName=h9 State=IDLE")
    assert [e.data for e in watch.observe([idle, other], 1)] == [{"node": "h1", "state": "IDLE", "reason": None}]
    assert watch.observe([idle], 2) == []
    assert [e.data for e in watch.observe([drained], 3)] == [
        {"node": "h1", "state": "IDLE+DRAIN", "reason": "mlchaos-hc: xid 79"}
    ]


def test_spec_refuses_options_the_fields_own_and_words_that_are_not_options() -> None:
    base = {"type": "slurm", "script": "job.sbatch"}
    assert SlurmTarget.model_validate({**base, "sbatch": ["--exclusive", "--mem=1G"]}).requeue
    with pytest.raises(ValidationError, match="nodes"):
        SlurmTarget.model_validate({**base, "sbatch": ["--nodes=3"]})
    with pytest.raises(ValidationError, match="does not start with"):
        SlurmTarget.model_validate({**base, "sbatch": ["exclusive"]})
    with pytest.raises(ValidationError):
        SlurmTarget.model_validate({**base, "partition": "a b"})


def test_a_bad_slurm_target_names_file_and_line() -> None:
    text = "name: s\ntarget:\n  type: slurm\n  script: job.sbatch\n  nodes: 0\nallow_no_checks: true\n"
    with pytest.raises(Exception) as raised:
        parse_scenario(text, "s.yaml")
    assert "s.yaml:5" in str(raised.value)


def test_slurm_selector_needs_a_slurm_target_and_is_exclusive() -> None:
    with pytest.raises(ValidationError, match="one of host, rank, group, slurm or role"):
        HostSelector(slurm="allocated", group="all")
    text = (
        "name: s\ntarget: {type: command, command: [sleep, x]}\nallow_no_checks: true\n"
        "faults:\n  - type: drain\n    params: {}\n    trigger: {after: 1}\n    hosts: {slurm: allocated}\n"
    )
    found = preflight(parse_scenario(text, "s.yaml"))
    assert any("slurm target" in p.hint or "Slurm job" in p.message for p in found), found


class _Placement:
    def __init__(self, nodes: dict[str, list[str]] | None) -> None:
        self.nodes = nodes

    def slurm_nodes(self, which: str) -> list[str] | None:
        return None if self.nodes is None else self.nodes[which]


def _hosts(placement: _Placement | None, protected: list[str] | None = None) -> HostSet:
    inventory = Inventory(
        hosts=[
            Host(name=f"n{i}", address=f"10.0.0.{i}", groups=["slurm"], labels={"slurm_node": f"h{i}"})
            for i in (1, 2, 3)
        ]
        + [Host(name="login", address="10.0.0.9")]
    )
    hosts = HostSet(inventory, protected or [], None)
    hosts.slurm = placement
    return hosts


def _fault(selector: dict[str, object]) -> FaultSpec:
    text = (
        "name: s\ntarget: {type: slurm, script: j.sbatch}\nallow_no_checks: true\n"
        f"faults:\n  - type: drain\n    params: {{}}\n    trigger: {{after: 1}}\n    hosts: {selector}\n"
    )
    return parse_scenario(text.replace("'", ""), "s.yaml").faults[0]


def test_allocated_and_spare_resolve_to_inventory_hosts_of_those_nodes() -> None:
    hosts = _hosts(_Placement({"allocated": ["h1", "h3"], "spare": ["h2"]}))
    allocated = _fault({"slurm": "allocated", "count": 1})
    for seed in range(5):
        assert hosts.resolve(allocated, f"op{seed}", seed)[0] in ("n1", "n3")
    assert hosts.resolve(_fault({"slurm": "spare"}), "op", 0) == ["n2"]
    assert hosts.resolve(_fault({"slurm": "allocated", "exclude": ["n1"]}), "op", 0) == ["n3"]


def test_an_empty_allocation_or_too_large_count_is_an_error_naming_it() -> None:
    hosts = _hosts(_Placement({"allocated": [], "spare": ["h1", "h2", "h3"]}))
    with pytest.raises(HostsError, match="allocation has no node"):
        hosts.resolve(_fault({"slurm": "allocated"}), "op", 0)
    with pytest.raises(HostsError, match="asked for 4"):
        hosts.resolve(_fault({"slurm": "spare", "count": 4}), "op", 0)
    protected = _hosts(_Placement({"allocated": ["h1"], "spare": []}), protected=["n1"])
    with pytest.raises(HostsError, match="excluded or protected"):
        protected.resolve(_fault({"slurm": "allocated"}), "op", 0)


def test_before_the_allocation_is_known_every_slurm_node_may_be_hit() -> None:
    hosts = _hosts(_Placement(None))
    assert hosts.resolve(_fault({"slurm": "allocated", "count": 1}), "op", 0) == ["n1", "n2", "n3"]
    assert _hosts(None).resolve(_fault({"slurm": "spare"}), "op", 0) == ["n1", "n2", "n3"]


def test_node_names_and_host_names_map_through_the_label() -> None:
    inventory = _hosts(None).inventory
    assert inventory is not None
    assert host_of_node(inventory, "h2") == "n2" and host_of_node(inventory, "login") == "login"
    assert host_of_node(inventory, "nope") is None
    assert node_of_host(inventory, "n3") == "h3" and node_of_host(None, "x") == "x"


def test_cluster_record_round_trips_and_refuses_junk() -> None:
    for cluster in (
        SlurmCluster("testbed", state_dir=Path("/tmp/tb")),
        SlurmCluster("login", login="l1", inventory_path=Path("/i.yaml"), conf="/etc/s.conf", completion_log=True),
    ):
        assert SlurmCluster.from_json(cluster.to_json()) == cluster
    with pytest.raises(ValueError):
        SlurmCluster.from_json({"kind": "testbed"})
    with pytest.raises(ValueError):
        SlurmCluster.from_json("x")


def test_heal_resumes_only_what_the_fault_did() -> None:
    cluster = SlurmCluster("testbed", state_dir=Path("/tmp/tb"))
    drain = NodeFault("drain", "h1", cluster, "mlchaos drain", "ns")
    failed = NodeFault("node_fail", "h1", cluster, "mlchaos node_fail-1", "ns")
    ours_drain = parse_node("NodeName=h1 State=IDLE+DRAIN Reason=mlchaos drain [root@2026-01-01T00:00:00]")
    health = parse_node("NodeName=h1 State=IDLE+DRAIN Reason=mlchaos-hc: xid 79 [root@2026-01-01T00:00:00]")
    down = parse_node("NodeName=h1 State=DOWN+NOT_RESPONDING Reason=Not responding [slurm@2026-01-01T00:00:00]")
    assert ours(ours_drain, drain) and not ours(health, drain)
    assert ours(down, failed) and not ours(health, failed) and not ours(down, drain)


def test_node_fault_state_round_trips() -> None:
    fault = NodeFault("slurmd_stop", "h2", SlurmCluster("testbed", state_dir=Path("/tmp/tb")), "r", "ns-h2")
    assert NodeFault.from_json(fault.to_json()) == fault
    with pytest.raises(Exception, match="not a Slurm node fault"):
        NodeFault.from_json({"action": "reboot", "node": "h2", "reason": "r"})


def test_rng_draw_is_seeded() -> None:
    hosts = _hosts(_Placement({"allocated": ["h1", "h2", "h3"], "spare": []}))
    picks = {tuple(hosts.resolve(_fault({"slurm": "allocated", "count": 1}), "op", 3)) for _ in range(3)}
    assert len(picks) == 1


@pytest.mark.parametrize(
    ("time_limit", "bound", "minutes"),
    [(None, None, None), (None, 130.0, 3), (600.0, 130.0, 3), (60.0, 130.0, 1), (1.0, None, 1), (None, 5.0, 1)],
)
def test_a_jobs_time_limit_never_outlasts_the_run(
    time_limit: float | None, bound: float | None, minutes: int | None, tmp_path: Path
) -> None:
    """A harness that dies cannot scancel its job: its sbatch --time is at most the run's max_duration +
    heal_grace (whole minutes, rounded up), below the target's own time_limit when that is longer."""
    from chaos.targets.slurm import SlurmJob

    spec = SlurmTarget(type="slurm", script="job.sbatch", time_limit=time_limit)
    job = SlurmJob(spec, "no cluster", tmp_path, 1, run_bound_s=bound)
    assert job.time_limit_minutes() == minutes
