"""``restarts_at_most`` and the "restarts used" row of a torchrun run's verdict table, on hand-made histories:
what counts as a restart used (workers' restart counts, the launcher's restart lines, ranks' own reports), per
host (a budget is per launcher: hosts are not added up), and when the count is unknown."""

from __future__ import annotations

from typing import Any, cast

from chaos.checks.base import CheckResult
from chaos.checks.restarts import restarts_used
from chaos.history.timeline import Event, History
from chaos.plugins.registry import checks
from chaos.report.html import render_html
from chaos.report.restarts import restarts_row, restarts_row_of_document

S = 1_000_000_000


def judge(events: list[Event], restarts: int) -> CheckResult:
    spec = checks()["restarts_at_most"]
    params = spec.Params.model_validate({"restarts": restarts})
    return spec.evaluate(History.from_events(events), params, cast(Any, None))


def worker(t: float, rank: int, restart: int, host: str = "local", pid: int = 0) -> Event:
    data: dict[str, Any] = {"local_rank": rank % 2, "pid": pid or 100 + rank + 10 * restart, "host": host}
    data["restart"] = restart
    return Event(ts_ns=int(t * S), kind="target.worker", source="process_tree", rank=rank, data=data)


def restart(t: float, number: int, cause: str, host: str = "local") -> Event:
    data: dict[str, Any] = {"restart": number, "attempt": number, "host": host, "cause": cause}
    return Event(ts_ns=int(t * S), kind="target.restart", source="process_tree", data=data)


def agent_line(t: float, left: int, budget: int) -> Event:
    data: dict[str, Any] = {"state": "FAILED", "attempts_left": left, "max_restarts": budget, "line": "..."}
    return Event(ts_ns=int(t * S), kind="target.agent_restart", source="torchrun", data=data)


CLEAN = [worker(1, 0, 0), worker(1, 1, 0)]
ONE_RESTART = [
    *CLEAN,
    restart(5, 1, "rank 1 (local_rank 1, pid 101) died of SIGKILL (exitcode -9)"),
    worker(5, 0, 1),
    worker(5, 1, 1),
]


def test_a_clean_run_used_no_restart() -> None:
    result = judge(CLEAN, 0)
    assert result.status == "pass" and result.measured == 0.0, result
    assert "no restart" in result.reason and result.evidence


def test_one_restart_fails_a_budget_of_zero_and_passes_one() -> None:
    failed = judge(ONE_RESTART, 0)
    assert failed.status == "fail" and failed.measured == 1.0, failed
    assert "1 restart(s), more than the 0 allowed" in failed.reason
    assert any("restart 1 on local: rank 1" in line and "SIGKILL" in line for line in failed.evidence), failed
    passed = judge(ONE_RESTART, 1)
    assert passed.status == "pass" and passed.measured == 1.0, passed


def test_the_launchers_log_alone_shows_a_restart() -> None:
    # "Worker group FAILED. 2/3 attempts left": the agent logs it right before restart 3 - 2 + 1 = 2.
    events = [*CLEAN, agent_line(4, 3, 3), agent_line(8, 2, 3)]
    assert judge(events, 1).status == "fail"
    assert judge(events, 2).status == "pass"


def test_ranks_own_reports_count_and_a_nodes_own_count_wins_over_the_job_wide_attempt() -> None:
    single = [Event(ts_ns=S, kind="target.start", source="target", rank=0, data={"pid": 5, "attempt": 2})]
    assert judge(single, 1).status == "fail" and judge(single, 2).status == "pass"
    # Multi-node: attempt is job-wide (3 rounds), node_attempt the launcher's own count (1): the budget is its.
    multi = [
        Event(
            ts_ns=S,
            kind="target.start",
            source="target",
            rank=0,
            data={"pid": 5, "attempt": 3, "node_attempt": 1, "host": "h1"},
        )
    ]
    assert judge(multi, 1).status == "pass"


def test_hosts_are_not_added_up() -> None:
    events = [worker(1, 0, 1, host="h1"), worker(1, 2, 2, host="h2"), worker(1, 3, 0, host="h3")]
    found = restarts_used(History.from_events(events))
    assert found is not None and found.used == 2 and found.by_host == {"h1": 1, "h2": 2, "h3": 0}
    assert judge(events, 2).status == "pass"
    failed = judge(events, 1)
    assert failed.status == "fail" and any("per host: h1 1, h2 2, h3 0" in line for line in failed.evidence)


def test_unobserved_restarts_are_unknown_not_zero() -> None:
    events = [Event(ts_ns=S, kind="target.step", source="target", rank=0, data={"step": 1})]
    result = judge(events, 0)
    assert result.status == "unknown" and "not observed" in result.reason


def test_one_restart_reported_twice_is_listed_once_with_its_cause() -> None:
    # The reference trainer's rank 0 reports the restart too (no cause): the tree's event names the cause.
    own = Event(ts_ns=6 * S, kind="target.restart", source="target", rank=0, data={"attempt": 1})
    found = restarts_used(History.from_events([*ONE_RESTART, own]))
    assert found is not None and len(found.restarts) == 1 and "SIGKILL" in found.causes()[0]


def test_the_verdict_table_row_of_a_torchrun_run() -> None:
    row = restarts_row(History.from_events(ONE_RESTART), "torchrun", 1)
    assert row is not None
    name, status, measured, bound, why = row.cells()
    assert (name, status, measured, bound) == ("restarts used", "info", "1", "max_restarts 1")
    assert "SIGKILL" in why
    assert row.to_json()["used"] == 1
    clean = restarts_row(History.from_events(CLEAN), "torchrun", 3)
    assert clean is not None and clean.cells()[2:] == ("0", "max_restarts 3", "no restart")
    unseen = restarts_row(History.from_events([]), "torchrun", 0)
    assert unseen is not None and unseen.measured == "?" and unseen.used is None
    # Not a torchrun run, and no launcher evidence: no row.
    assert restarts_row(History.from_events([]), "command", None) is None
    # A roles run: the restarts its policies made, per replica, with the exit each answered.
    assert restarts_row(History.from_events(CLEAN), "roles", None) is not None


def role_event(t: float, kind: str, replica: str, **data: Any) -> Event:
    return Event(
        ts_ns=int(t * S), kind=kind, source="runner", data={"role": replica.split(".")[0], "replica": replica, **data}
    )


def test_the_row_of_a_roles_run_counts_policy_restarts_per_replica() -> None:
    events = [
        role_event(1, "target.role_exit", "group.1", code=-9),
        role_event(2, "target.role_restart", "group.1", attempt=1),
        role_event(3, "target.role_exit", "lighthouse", code=1),
        role_event(4, "target.role_restart", "lighthouse", attempt=1),
        role_event(5, "target.role_exit", "group.1", code=-9),
        role_event(6, "target.role_restart", "group.1", attempt=2),
    ]
    row = restarts_row(History.from_events(events), "roles", None)
    assert row is not None
    _, status, measured, bound, why = row.cells()
    assert (status, measured, bound) == ("info", "3", "restart policies")
    assert why.startswith("group.1 x2, lighthouse x1: ") and "group.1 after signal 9" in why
    assert "lighthouse after exit 1" in why
    assert row.to_json()["by_replica"] == {"group.1": 2, "lighthouse": 1}
    clean = restarts_row(History.from_events(events[:1]), "roles", None)
    assert clean is not None and clean.cells()[2:] == ("0", "restart policies", "no restart")


def test_report_html_shows_the_row() -> None:
    document: dict[str, Any] = {
        "scenario": {"name": "user-kill", "target": {"type": "torchrun", "max_restarts": 1}},
        "verdict": "pass",
        "checks": [],
        "events": [e.model_dump(mode="json") for e in ONE_RESTART],
    }
    history = History.from_events(ONE_RESTART)
    row = restarts_row_of_document(document, history)
    assert row is not None and row.measured == "1"
    page = render_html(document, png=b"not drawn here")
    assert "restarts used" in page and "max_restarts 1" in page and "SIGKILL" in page


def role_start(t: float, replica: str, attempt: int) -> Event:
    return Event(
        ts_ns=int(t * S), kind="target.role_start", source="runner", data={"replica": replica, "attempt": attempt}
    )


def test_a_roles_supervisors_restarts_count_per_replica() -> None:
    started = [role_start(0, "lighthouse", 0), role_start(0, "group.0", 0), role_start(0, "group.1", 0)]
    assert judge(started, 0).status == "pass"  # observed: every replica in its first attempt
    twice = [*started, role_start(5, "group.1", 1), role_start(9, "group.1", 2), role_start(9, "group.0", 1)]
    failed = judge(twice, 1)
    assert failed.status == "fail" and failed.measured == 2.0, failed  # group.1's two, not the three added up
    assert judge(twice, 2).status == "pass"
