"""The run-history store: schema and versioning, what a run turns into, trend math on hand-made results,
notes, and many processes writing one file at once."""

from __future__ import annotations

import multiprocessing
import sqlite3
from pathlib import Path

import pytest

from chaos.checks.base import CheckResult
from chaos.history.timeline import Event, History
from chaos.plan.build import make_plan
from chaos.run.result import RunResult
from chaos.spec.scenario import parse_scenario
from chaos.suite.store import (
    DEFAULT_PATH,
    ENV_HISTORY,
    SCHEMA_VERSION,
    RunStore,
    StoreError,
    default_path,
    derived_metrics,
)

T0 = 1_700_000_000.0


def _scenario(name: str) -> str:
    return f"name: {name}\nseed: 11\nallow_no_checks: true\ntarget: {{type: command, command: [/bin/true]}}\n"


def make_result(
    name: str = "kill-rank",
    *,
    verdict: str = "pass",
    detect: list[float] | None = None,
    recover: float | None = None,
    started: float = T0,
    seconds: float = 30.0,
    extra_checks: list[CheckResult] | None = None,
    run_dir: Path = Path("reports/x"),
) -> RunResult:
    """A finished run as the runner would hand it over, without running anything."""
    scenario = parse_scenario(_scenario(name))
    checks = [
        CheckResult(
            check="detected_within", name=f"detected_within[f{i}]", status="pass", measured=v, bound="<= 30s", unit="s"
        )
        for i, v in enumerate(detect or [])
    ]
    if recover is not None:
        checks.append(
            CheckResult(
                check="recovered_within", name="recovered_within[f0]", status="pass", measured=recover, unit="s"
            )
        )
    checks += extra_checks or []
    history = History.from_events(
        [
            Event(ts_ns=int(started * 1e9), kind="runner.start"),
            Event(ts_ns=int((started + seconds) * 1e9), kind="runner.verdict"),
        ]
    )
    exit_code = {"pass": 0, "fail": 1, "error": 3}[verdict]
    return RunResult(
        scenario,
        make_plan(scenario),
        run_dir,
        history,
        checks,
        verdict,
        exit_code,
        "target exited (0)",  # type: ignore[arg-type]
    )


def test_a_new_file_gets_the_versioned_schema_in_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "history.sqlite"
    with RunStore.open(path) as store:
        assert store.schema_version == SCHEMA_VERSION
    db = sqlite3.connect(path)
    tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"meta", "suites", "runs", "checks", "metrics", "notes"} <= tables
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db.close()
    with RunStore.open(path) as store:  # reopening changes nothing
        assert store.schema_version == SCHEMA_VERSION and store.runs() == []


def test_a_file_from_a_newer_schema_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite"
    RunStore.open(path).close()
    db = sqlite3.connect(path)
    db.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="schema 99, newer"):
        RunStore.open(path)
    db = sqlite3.connect(path)
    assert db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0] == "99"
    db.close()


def test_the_default_path_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(ENV_HISTORY, raising=False)
    assert default_path() == DEFAULT_PATH == Path("reports/mlchaos-history.sqlite")
    monkeypatch.setenv(ENV_HISTORY, str(tmp_path / "elsewhere.sqlite"))
    assert default_path() == tmp_path / "elsewhere.sqlite"


def test_a_run_is_stored_with_its_checks_and_derived_timings(tmp_path: Path) -> None:
    odd = [
        CheckResult(check="lost_work_at_most", name="lost_work_at_most", status="pass", measured=5.0, unit=" steps"),
        CheckResult(check="failover_within", name="failover_within[kill]", status="fail", measured=2.5, unit="s"),
        CheckResult(check="failback_within", name="failback_within[kill]", status="unknown", reason="never healed"),
        CheckResult(check="matches_golden", name="matches_golden", status="pass", measured="ab12cd"),
    ]
    result = make_result(verdict="fail", detect=[0.04], recover=7.5, extra_checks=odd, run_dir=tmp_path / "run")
    result.extra["scenario_file"] = str(tmp_path / "kill-rank.yaml")
    with RunStore.open(tmp_path / "h.sqlite") as store:
        suite_id = store.begin_suite("nightly", file="suite.yaml", seed=7, planned=1)
        run_id = store.record_run(result, "nightly", suite_id=suite_id)
        [run] = store.runs()
        assert run.id == run_id and run.suite_id == suite_id and run.suite == "nightly"
        assert (run.scenario, run.seed, run.verdict, run.exit_code) == ("kill-rank", 11, "fail", 1)
        assert run.started_ts == pytest.approx(T0) and run.duration_s == pytest.approx(30.0)
        assert run.scenario_file == str(tmp_path / "kill-rank.yaml") and run.run_dir == str(tmp_path / "run")
        assert run.host and run.ended_by == "target exited (0)"
        checks = store.checks(run_id)
        assert [c.type for c in checks] == [
            "detected_within",
            "recovered_within",
            "lost_work_at_most",
            "failover_within",
            "failback_within",
            "matches_golden",
        ]
        golden = checks[-1]
        assert golden.measured is None and golden.measured_text == "ab12cd"  # a digest is text, not a number
        assert checks[2].measured == 5.0 and checks[2].measured_text == "5 steps"
        assert checks[4].status == "unknown" and checks[4].reason == "never healed"
        timings = {(m.metric, m.check): m.value for m in store.metrics(run_id)}
        assert timings == {
            ("detection_latency_s", "detected_within[f0]"): 0.04,
            ("recovery_s", "recovered_within[f0]"): 7.5,
            ("failover_s", "failover_within[kill]"): 2.5,  # a too-slow failover is still a timing
        }
        assert store.runs(suite="other") == [] and len(store.runs(suite_id=suite_id)) == 1


def test_derived_metrics_key_off_check_types_and_skip_what_was_not_measured() -> None:
    results = [
        CheckResult(check="detected_within", name="d", status="unknown"),
        CheckResult(check="recovered_within", name="r", status="pass", measured=1.0, unit="s"),
        CheckResult(check="completes", name="c", status="pass", measured=0.0),
    ]
    assert [(m.metric, m.check, m.value) for m in derived_metrics(results)] == [("recovery_s", "r", 1.0)]


def test_trends_per_scenario_over_the_last_n_runs(tmp_path: Path) -> None:
    with RunStore.open(tmp_path / "h.sqlite") as store:
        # kill-rank, oldest first: pass, fail, pass, pass, error; two faults in run 2 (its worst counts).
        plan = [
            ("pass", [0.1], 10.0),
            ("fail", [0.3, 2.0], 20.0),
            ("pass", [0.2], 30.0),
            ("pass", [0.5], None),
            ("error", [], None),
        ]
        for index, (verdict, detect, recover) in enumerate(plan):
            store.record_run(make_result(verdict=verdict, detect=detect, recover=recover, started=T0 + 100 * index))
        store.record_run(make_result("slow-rank", started=T0 + 50))
        kill, slow = store.trends()
        assert kill.scenario == "kill-rank" and slow.scenario == "slow-rank"
        assert (kill.runs, kill.passed, kill.pass_rate) == (5, 3, 0.6)
        assert kill.sparkline == "✓✗✓✓!" and kill.last_verdict == "error"
        assert kill.detection_p50_s == pytest.approx(0.35)  # per-run worst: 0.1, 2.0, 0.2, 0.5 -> median 0.35
        assert kill.detection_max_s == pytest.approx(2.0)
        assert kill.recovery_p50_s == pytest.approx(20.0)
        assert kill.failover_p50_s is None and kill.failback_p50_s is None
        assert kill.last_ts == pytest.approx(T0 + 400 + 30)
        assert (slow.runs, slow.pass_rate, slow.sparkline, slow.detection_p50_s) == (1, 1.0, "✓", None)

        [recent] = store.trends("kill-rank", last=3)  # pass, pass, error
        assert (recent.runs, recent.passed, recent.sparkline) == (3, 2, "✓✓!")
        assert recent.detection_p50_s == pytest.approx(0.35) and recent.detection_max_s == pytest.approx(0.5)
        assert recent.recovery_p50_s == pytest.approx(30.0)
        assert store.trends("never-ran") == []
        assert [r.verdict for r in store.runs(scenario="kill-rank", last=2)] == ["pass", "error"]  # oldest first


def test_notes_attach_to_runs_or_stand_alone(tmp_path: Path) -> None:
    with RunStore.open(tmp_path / "h.sqlite") as store:
        run_id = store.record_run(make_result())
        first = store.add_note("partition looks asymmetric", author="ana", ts=T0 + 1)
        second = store.add_note("inject kill rank=1", run_id=run_id, author="ana", kind="command", ts=T0 + 2)
        third = store.add_note("game day over", ts=T0 + 3)
        assert first < second < third
        assert [(n.kind, n.text) for n in store.notes(run_id=run_id)] == [("command", "inject kill rank=1")]
        everything = store.notes()
        assert [n.id for n in everything] == [first, second, third]
        assert everything[2].author  # defaults to the OS user
        assert [n.id for n in store.notes(last=2)] == [second, third]
        with pytest.raises(StoreError, match="no run with id 999"):
            store.add_note("about nothing", run_id=999)
        assert len(store.notes()) == 3  # the refused note left nothing behind


def _writer(path: str, worker: int, count: int) -> None:
    store = RunStore.open(path)
    try:
        for index in range(count):
            store.record_run(make_result(f"scenario-{worker}", detect=[0.1 * index], started=T0 + index))
            store.add_note(f"worker {worker} wrote run {index}", author=f"w{worker}")
    finally:
        store.close()


def test_concurrent_writers_from_many_processes_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "fresh.sqlite"  # created concurrently too: schema set-up races as well
    workers, per_worker = 6, 25
    context = multiprocessing.get_context("fork")
    processes = [context.Process(target=_writer, args=(str(path), w, per_worker)) for w in range(workers)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=120)
    assert [p.exitcode for p in processes] == [0] * workers
    with RunStore.open(path) as store:
        runs = store.runs()
        assert len(runs) == workers * per_worker
        assert len({r.id for r in runs}) == workers * per_worker
        assert len(store.notes()) == workers * per_worker
        for trend in store.trends():
            assert trend.runs == 20 and trend.pass_rate == 1.0  # the default window
            assert trend.detection_max_s == pytest.approx(0.1 * (per_worker - 1))
        assert all(len(store.checks(r.id)) == 1 for r in runs)
