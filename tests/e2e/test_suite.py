"""Suites for real: fast command scenarios run through the CLI and in-process, recorded in the run history,
exported as a Prometheus textfile and pushed to a real (stdlib) HTTP server standing in for a Pushgateway."""

from __future__ import annotations

import http.server
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support import ROOT, scenario_yaml, ticker
from typer.testing import CliRunner

from chaos.cluster.local import process_state
from chaos.run.result import EXIT_FAIL, EXIT_HARNESS, EXIT_INVALID, EXIT_PASS, RunResult
from chaos.suite import metrics
from chaos.suite.run_suite import PlannedRun, SuiteError, SuiteOptions, load_suite, parse_suite, plan_runs, run_suite
from chaos.suite.store import RunStore

PY = sys.executable


# A job that ticks (target.step) and raises an alarm (detect.alarm) every 0.1 s, while a separate victim
# process is frozen for 0.4 s from the third tick on (an event trigger, not a time: a slow interpreter start on
# a loaded machine must not fire the fault before the first step): detected_within and recovered_within
# measure real, sub-second timings.
def _steady(victim: int) -> str:
    freeze = {"type": "freeze", "params": {"pid": victim}, "trigger": {"on_event": {"kind": "target.step", "nth": 3}}}
    within = [
        {"type": kind, "params": {"fault": "freeze-1", "within": "20s"}}
        for kind in ("detected_within", "recovered_within")
    ]
    alarm = {"pattern": "^alarm", "event": "detect.alarm"}
    return scenario_yaml(
        "steady",
        4,
        ticker(20, say="print('tick', i, flush=True); print('alarm', flush=True)", matchers=(alarm,)),
        faults=[{**freeze, "duration": "0.4s"}],
        checks=[*within, {"type": "completes"}],
        safety={"max_duration": "60s", "no_progress_timeout": "30s"},
    )


def _one_shot(
    name: str, seed: int, code: str, *, faults: list[dict[str, Any]] | None = None, max_duration: str = "60s"
) -> str:
    """A scenario whose target runs the Python ``code`` once and must complete; no progress watch."""
    target = {"type": "command", "command": [PY, "-c", code]}
    safety = {"max_duration": max_duration, "no_progress_timeout": None}
    return scenario_yaml(name, seed, target, faults=faults, checks=[{"type": "completes"}], safety=safety)


def _sleeper(seconds: float) -> str:
    return _one_shot("sleeper", 5, f"import time; time.sleep({seconds})", max_duration="120s")


def _broken() -> str:
    return _one_shot("broken", 6, "import sys; sys.exit(3)")


# A long run with a long fault on the victim: interrupting it must heal the fault.
def _frozen(victim: int) -> str:
    freeze = {"type": "freeze", "params": {"pid": victim}, "trigger": {"after": "0.2s"}, "duration": "60s"}
    return _one_shot("frozen", 8, "import time; time.sleep(60)", faults=[freeze], max_duration="120s")


def _standalone_cli() -> list[str]:
    """``python -m chaos.cli.commands`` once it registers the suite commands; until then the same commands on an app
    of their own (what chaos.cli.commands's two lines do)."""
    from chaos.cli import commands as cli

    if any(group.name == "suite" for group in cli.app.registered_groups):
        return [PY, "-m", "chaos.cli.commands"]
    script = (
        "import typer\nfrom chaos.cli.suite import register\napp = typer.Typer()\n"
        "@app.callback()\ndef main() -> None: pass\nregister(app)\napp()\n"
    )
    return [PY, "-c", script]


def mlchaos(*args: str | Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*_standalone_cli(), *map(str, args)], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


@dataclass
class Pushgateway:
    """A real HTTP server recording every request (method, path, body); answers 200, or ``status``."""

    url: str
    requests: list[tuple[str, str, bytes]]
    status: int = 200


@pytest.fixture(scope="module")
def pushgateway() -> Iterator[Pushgateway]:
    gateway = Pushgateway("", [])

    class Handler(http.server.BaseHTTPRequestHandler):
        def _record(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            gateway.requests.append((self.command, self.path, body))
            self.send_response(gateway.status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_PUT = do_POST = do_DELETE = _record

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the base class's name)
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    gateway.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield gateway
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def victim() -> Iterator[int]:
    process = subprocess.Popen([PY, "-c", "import time\nwhile True: time.sleep(0.05)"])
    try:
        yield process.pid
    finally:
        process.send_signal(signal.SIGCONT)
        process.kill()
        process.wait(timeout=10)


@pytest.fixture(autouse=True)
def _no_ambient_targets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLCHAOS_HISTORY", raising=False)
    monkeypatch.delenv(metrics.ENV_PUSHGATEWAY, raising=False)


@dataclass
class FolderRun:
    folder: Path
    reports: Path
    proc: subprocess.CompletedProcess[str]
    seconds: float


@pytest.fixture(scope="module")
def folder_run(tmp_path_factory: pytest.TempPathFactory, victim: int, pushgateway: Pushgateway) -> FolderRun:
    """One real suite over a folder: 3 scenarios (and 3 YAML files that are not scenarios), 2 rounds,
    shuffled with seed 5, metrics pushed to the test's HTTP server."""
    folder = tmp_path_factory.mktemp("nightly")
    reports = tmp_path_factory.mktemp("reports")
    (folder / "steady.yaml").write_text(_steady(victim))
    (folder / "sleeper.yaml").write_text(_sleeper(1))
    (folder / "broken.yaml").write_text(_broken())
    (folder / "suite.yaml").write_text("name: other\nscenarios: [steady.yaml]\n")
    (folder / "values.yaml").write_text("replicas: 3\nimage: x\n")
    (folder / "manifest.yaml").write_text("kind: ConfigMap\n---\nkind: Secret\n")
    started = time.monotonic()
    proc = mlchaos(
        "suite",
        "run",
        folder,
        "--repeat",
        "2",
        "--shuffle",
        "--seed",
        "5",
        "--report-dir",
        reports,
        "--pushgateway",
        pushgateway.url,
    )
    return FolderRun(folder, reports, proc, time.monotonic() - started)


def test_a_folder_suite_runs_every_scenario_and_exits_1_when_one_fails(folder_run: FolderRun) -> None:
    proc = folder_run.proc
    assert proc.returncode == EXIT_FAIL, proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("[")]
    assert len(lines) == 6, proc.stdout
    assert any(line.startswith("[1/6] ") and "(seed " in line and " … " in line for line in lines)
    assert all(" in " in line and line.rstrip().endswith(("s", ")")) for line in lines)
    assert sum("broken (seed 6) … fail in" in line and "(completes)" in line for line in lines) == 2
    assert sum("steady (seed 4) … pass in" in line for line in lines) == 2
    assert "shuffled with seed 5" in proc.stdout
    assert "4/6 runs passed (6 planned); exit 1" in proc.stdout
    assert len(list(folder_run.reports.glob("*-*/run.json"))) == 6


def test_the_shuffled_order_replays_from_its_seed(folder_run: FolderRun) -> None:
    suite = load_suite(folder_run.folder)
    assert [item.scenario.name for item in suite.items] == ["broken", "sleeper", "steady"]  # non-scenarios skipped
    planned, seed = plan_runs(suite, repeat=2, shuffle=True, seed=5)
    again, _ = plan_runs(suite, repeat=2, shuffle=True, seed=5)
    assert seed == 5 and _order(planned) == _order(again)
    assert any(_order(plan_runs(suite, repeat=2, shuffle=True, seed=s)[0]) != _order(planned) for s in range(6, 12))
    with RunStore.open(folder_run.reports / "mlchaos-history.sqlite") as store:
        runs = store.runs()
        assert [(r.scenario, r.seed) for r in runs] == _order(planned)  # what ran is what the seed says
        assert {r.suite for r in runs} == {folder_run.folder.name} and len({r.suite_id for r in runs}) == 1


def _order(runs: list[PlannedRun]) -> list[tuple[str, int]]:
    return [(run.item.scenario.name, run.seed) for run in runs]


def test_every_run_lands_in_the_history_with_its_checks_and_timings(folder_run: FolderRun) -> None:
    with RunStore.open(folder_run.reports / "mlchaos-history.sqlite") as store:
        by_name = {t.scenario: t for t in store.trends()}
        assert set(by_name) == {"broken", "sleeper", "steady"}
        steady, broken = by_name["steady"], by_name["broken"]
        assert (steady.runs, steady.pass_rate, steady.sparkline) == (2, 1.0, "✓✓")
        assert (broken.runs, broken.pass_rate, broken.sparkline, broken.last_verdict) == (2, 0.0, "✗✗", "fail")
        assert steady.detection_p50_s is not None and steady.detection_max_s is not None
        assert 0 < steady.detection_p50_s <= steady.detection_max_s < 20
        assert steady.recovery_p50_s is not None and 0 < steady.recovery_p50_s < 20
        assert by_name["sleeper"].detection_p50_s is None
        [broken_run, *_] = store.runs(scenario="broken")
        [check] = store.checks(broken_run.id)
        assert (check.type, check.status, check.measured) == ("completes", "fail", 3.0)
        assert Path(broken_run.run_dir).is_dir() and broken_run.exit_code == EXIT_FAIL


def _families(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    return {
        family.name: [(dict(sample.labels), sample.value) for sample in family.samples]
        for family in text_string_to_metric_families(text)
    }


def _value(families: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    [value] = [v for found, v in families[name] if labels.items() <= found.items()]
    return value


def test_the_textfile_parses_and_says_what_the_suite_did(folder_run: FolderRun) -> None:
    suite = folder_run.folder.name
    text = (folder_run.reports / "mlchaos.prom").read_text()
    families = _families(text)
    assert _value(families, "mlchaos_scenario_last_verdict", scenario="steady", suite=suite) == 1
    assert _value(families, "mlchaos_scenario_last_verdict", scenario="broken", suite=suite) == 0
    assert _value(families, "mlchaos_scenario_pass_ratio", scenario="broken") == 0
    assert _value(families, "mlchaos_scenario_runs", scenario="sleeper") == 2
    detection = _value(
        families, "mlchaos_detection_latency_seconds", scenario="steady", check="detected_within[freeze-1]"
    )
    assert 0 < detection < 20
    assert 0 < _value(families, "mlchaos_recovery_seconds", scenario="steady", check="recovered_within[freeze-1]") < 20
    assert families["mlchaos_failover_seconds"] == []  # no serving check ran
    assert _value(families, "mlchaos_suite_exit_code", suite=suite) == EXIT_FAIL
    assert _value(families, "mlchaos_suite_runs", suite=suite) == 6
    ended = _value(families, "mlchaos_suite_last_run_timestamp_seconds", suite=suite)
    assert time.time() - 600 < ended <= time.time()
    assert not list(folder_run.reports.glob(".mlchaos.prom.*"))  # the temp file was renamed away


def test_the_same_metrics_were_pushed_to_the_pushgateway(folder_run: FolderRun, pushgateway: Pushgateway) -> None:
    suite = folder_run.folder.name
    pushes = [r for r in pushgateway.requests if r[1] == f"/metrics/job/mlchaos/suite/{suite}"]
    assert [method for method, _, _ in pushes] == ["PUT"]  # PUT: the suite's group is replaced as a whole
    pushed = _families(pushes[0][2].decode())
    written = _families((folder_run.reports / "mlchaos.prom").read_text())
    assert pushed == written


def test_history_prints_trends_as_a_table_and_as_json(folder_run: FolderRun) -> None:
    store = folder_run.reports / "mlchaos-history.sqlite"
    table = mlchaos("history", "--history", store)
    assert table.returncode == 0, table.stderr
    assert "steady" in table.stdout and "✓✓" in table.stdout and "✗✗" in table.stdout and "100%" in table.stdout
    as_json = mlchaos("history", "--history", store, "--json", "--scenario", "steady", "--last", "1")
    [trend] = json.loads(as_json.stdout)
    assert trend["scenario"] == "steady" and trend["runs"] == 1 and trend["sparkline"] == "✓"
    assert 0 < trend["detection_p50_s"] < 20
    runs = json.loads(mlchaos("history", "--history", store, "--runs", "--json").stdout)
    assert len(runs) == 6 and {r["verdict"] for r in runs} == {"pass", "fail"}
    missing = mlchaos("history", "--history", folder_run.reports / "nope.sqlite", "--json")
    assert missing.returncode == 0 and json.loads(missing.stdout) == [] and "no run history" in missing.stderr


def test_a_suite_file_applies_entry_overrides_and_exits_0(tmp_path: Path) -> None:
    (tmp_path / "scenarios").mkdir()
    (tmp_path / "scenarios" / "sleeper.yaml").write_text(_sleeper(0.2))
    suite_file = tmp_path / "suites" / "smoke.yaml"
    suite_file.parent.mkdir()
    suite_file.write_text("name: smoke\nscenarios:\n  - {file: ../scenarios/*.yaml, seed: 42, repeat: 2}\n")
    history = tmp_path / "h.sqlite"
    textfile = tmp_path / "node-exporter" / "smoke.prom"
    proc = mlchaos(
        "suite", "run", suite_file, "--report-dir", tmp_path / "reports", "--history", history, "--textfile", textfile
    )
    assert proc.returncode == EXIT_PASS, proc.stdout + proc.stderr
    assert "[2/2] sleeper (seed 42) … pass in" in proc.stdout
    with RunStore.open(history) as store:
        assert [(r.suite, r.seed, r.verdict) for r in store.runs()] == [("smoke", 42, "pass")] * 2
    assert _value(_families(textfile.read_text()), "mlchaos_suite_exit_code", suite="smoke") == 0


def test_an_invalid_suite_names_file_and_line_and_runs_nothing(tmp_path: Path) -> None:
    (tmp_path / "broken.yaml").write_text(_broken().replace("checks:", "chekcs:"))
    suite_file = tmp_path / "suite.yaml"
    suite_file.write_text(
        "name: bad\nscenarios:\n  - missing.yaml\n  - {file: '*.yml'}\n  - {file: broken.yaml, seeed: 3}\n  - broken.yaml\n"
    )
    with pytest.raises(SuiteError) as caught:
        load_suite(suite_file)
    text = str(caught.value)
    assert f"{suite_file}:3:5: no such scenario file 'missing.yaml'" in text
    assert f"{suite_file}:4:6: '*.yml' matches no scenario file" in text
    assert f"{suite_file}:5:25: unknown key 'seeed' in scenarios.2" in text and "did you mean 'seed'?" in text
    assert text.count("broken.yaml:4:1: unknown key 'chekcs'") == 1  # every entry's scenarios, each once
    proc = mlchaos("suite", "run", suite_file, "--report-dir", tmp_path / "reports")
    assert proc.returncode == EXIT_INVALID
    assert "nothing was run" in proc.stderr and "unknown key 'seeed'" in proc.stderr
    fixed = (
        suite_file.read_text()
        .replace("seeed", "seed")
        .replace("  - missing.yaml\n", "")
        .replace("  - {file: '*.yml'}\n", "")
    )
    suite_file.write_text(fixed)
    proc = mlchaos("suite", "run", suite_file, "--report-dir", tmp_path / "reports")
    assert (
        proc.returncode == EXIT_INVALID and "broken.yaml:4:1: unknown key 'chekcs'" in proc.stderr
    )  # the scenario's own
    assert not (tmp_path / "reports").exists()


def test_suite_yaml_model_errors_point_into_the_file() -> None:
    with pytest.raises(SuiteError) as caught:
        parse_suite("name: has space\nscenarios: []\nshufle: true\n", "s.yaml")
    problems = {(p.line, p.message.split(":")[0]) for p in caught.value.problems}
    assert (1, "name") in problems and (2, "scenarios") in problems
    assert any(p.line == 3 and p.hint == "did you mean 'shuffle'?" for p in caught.value.problems)


def test_sigterm_stops_the_suite_after_healing_and_records_what_ran(tmp_path: Path) -> None:
    victim = subprocess.Popen([PY, "-c", "import time\nwhile True: time.sleep(0.05)"])
    try:
        folder = tmp_path / "suite"
        folder.mkdir()
        (folder / "a-frozen.yaml").write_text(_frozen(victim.pid))
        (folder / "b-sleeper.yaml").write_text(_sleeper(0.1))
        reports = tmp_path / "reports"
        harness = subprocess.Popen(
            [*_standalone_cli(), "suite", "run", str(folder), "--report-dir", str(reports)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        deadline = time.monotonic() + 60
        while process_state(victim.pid) != "T" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert process_state(victim.pid) == "T", "the fault never fired"
        harness.send_signal(signal.SIGTERM)
        output, _ = harness.communicate(timeout=60)
        assert harness.returncode == EXIT_HARNESS, output
        assert process_state(victim.pid) not in ("T", None), "the freeze outlived the interrupted suite"
        assert "stopped early: interrupted during run 1/2" in output and "[2/2]" not in output
        with RunStore.open(reports / "mlchaos-history.sqlite") as store:
            [run] = store.runs()
            assert (run.scenario, run.verdict, run.ended_by) == ("frozen", "error", "interrupted")
        families = _families((reports / "mlchaos.prom").read_text())
        assert _value(families, "mlchaos_suite_exit_code") == EXIT_HARNESS
    finally:
        victim.send_signal(signal.SIGCONT)
        victim.kill()
        victim.wait(timeout=10)


class _Recorder:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def started(self, position: int, total: int, run: PlannedRun) -> None:
        self.lines.append(f"start {position}/{total} {run.item.scenario.name}")

    def finished(self, position: int, total: int, run: PlannedRun, result: RunResult, seconds: float) -> None:
        self.lines.append(f"end {position}/{total} {result.verdict}")

    def notice(self, line: str) -> None:
        self.lines.append(line)

    def log(self, line: str) -> None:
        pass


def test_fail_fast_stops_after_the_first_run_that_does_not_pass(tmp_path: Path) -> None:
    (tmp_path / "broken.yaml").write_text(_broken())
    (tmp_path / "sleeper.yaml").write_text(_sleeper(0.1))
    (tmp_path / "suite.yaml").write_text("name: ff\nscenarios: [broken.yaml, sleeper.yaml]\n")
    recorder = _Recorder()
    outcome = run_suite(
        load_suite(tmp_path / "suite.yaml"), SuiteOptions(report_dir=tmp_path / "r", fail_fast=True), recorder
    )
    assert recorder.lines == ["start 1/2 broken", "end 1/2 fail"]
    assert outcome.exit_code == EXIT_FAIL and outcome.stopped_early.startswith("--fail-fast: run 1/2 (broken)")
    assert len(outcome.completed) == 1 and outcome.completed[0].run_id is not None
    assert outcome.textfile is not None and outcome.textfile.exists()


def test_a_pushgateway_that_refuses_makes_the_suite_a_harness_error(tmp_path: Path, pushgateway: Pushgateway) -> None:
    (tmp_path / "broken.yaml").write_text(_broken())
    suite = load_suite(tmp_path / "broken.yaml")  # one scenario file is a suite of one
    assert suite.name == "broken" and len(suite.items) == 1
    pushgateway.status = 500
    try:
        outcome = run_suite(suite, SuiteOptions(report_dir=tmp_path / "r", pushgateway=pushgateway.url), _Recorder())
    finally:
        pushgateway.status = 200
    assert outcome.exit_code == EXIT_HARNESS
    assert any("push to Pushgateway" in p and "500" in p for p in outcome.problems), outcome.problems
    assert outcome.textfile is not None and outcome.textfile.exists()  # the textfile is still written


def test_suite_plan_lists_the_order_without_running(tmp_path: Path) -> None:
    from typer import Typer

    from chaos.cli.suite import register

    for name in ("a", "b", "c", "d"):
        (tmp_path / f"{name}.yaml").write_text(_sleeper(0).replace("sleeper", name))
    app = Typer()

    @app.callback()
    def main() -> None:
        pass

    register(app)
    runner = CliRunner()
    first = runner.invoke(app, ["suite", "plan", str(tmp_path), "--shuffle", "--seed", "3", "--repeat", "2"])
    second = runner.invoke(app, ["suite", "plan", str(tmp_path), "--shuffle", "--seed", "3", "--repeat", "2"])
    other = runner.invoke(app, ["suite", "plan", str(tmp_path), "--shuffle", "--seed", "4", "--repeat", "2"])
    assert first.exit_code == 0, first.output
    assert "8 run(s), shuffled with seed 3" in first.output
    assert first.output == second.output != other.output


def test_ctrl_c_between_runs_stops_the_loop_and_keeps_what_ran(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(_sleeper(0).replace("sleeper", "a"))
    (tmp_path / "b.yaml").write_text(_sleeper(0).replace("sleeper", "b"))

    class CtrlCBeforeRun2(_Recorder):
        def started(self, position: int, total: int, run: PlannedRun) -> None:
            super().started(position, total, run)
            if position == 2:
                raise KeyboardInterrupt

    outcome = run_suite(load_suite(tmp_path), SuiteOptions(report_dir=tmp_path / "r"), CtrlCBeforeRun2())
    assert outcome.interrupted and outcome.exit_code == EXIT_HARNESS
    assert [c.result.scenario.name for c in outcome.completed] == ["a"]
    assert outcome.stopped_early.startswith("interrupted") and "run 2/2" in outcome.stopped_early
    with RunStore.open(tmp_path / "r" / "mlchaos-history.sqlite") as store:
        assert [r.scenario for r in store.runs()] == ["a"]
    assert _value(_families((tmp_path / "r" / "mlchaos.prom").read_text()), "mlchaos_suite_exit_code") == EXIT_HARNESS
