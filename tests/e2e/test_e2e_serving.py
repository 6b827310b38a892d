"""The shipped serving scenarios (serving-primary-killed's run is test_pytest_xdist's), end to end through the CLI
against the reference stack (real model servers, a real gateway, real faults, an open-loop load); a deliberately
broken gateway makes the checks fail; the same checks run against an endpoint mlchaos did not start
(``type: http``); bad replica names are refused before anything starts. Nothing of a run may be left running
afterwards."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import ROOT, chains_left_since, live_processes, read_jsonl, root_chains, run_scenario_file, wait_for

from chaos.cluster.local import LocalTransport
from chaos.history.timeline import Event
from chaos.run.orchestrator import RunOptions, execute
from chaos.run.result import EXIT_FAIL, EXIT_INVALID, EXIT_PASS
from chaos.spec.scenario import load_scenario, parse_scenario
from chaos.spec.serving import ServingTarget
from chaos.targets.serving_stack import ServingJob

pytestmark = pytest.mark.slow

# serving-primary-killed as shipped runs in tests/e2e/test_pytest_xdist.py (its pass, and its history holding only
# its own fault); what this test adds to a pass, the report pages, the others here show.
SCENARIOS = [
    "serving-primary-slow",
    "serving-silent-corruption",
    "serving-overload-shedding",
    "serving-primary-partitioned",
    "serving-primary-delayed",
]


def _serving_processes(folder: Path) -> list[str]:
    """This test's serving processes (their command lines name its folder: other tests' stacks may run
    beside it on parallel workers)."""
    ps = subprocess.run(["ps", "-eo", "pid=,stat=,args="], capture_output=True, text=True).stdout
    return [line.strip() for line in ps.splitlines() if "chaos.reference.serving" in line and str(folder) in line]


@pytest.fixture(autouse=True)
def _nothing_left_behind(tmp_path: Path) -> Iterator[None]:
    chains = root_chains()
    yield
    assert wait_for(lambda: not _serving_processes(tmp_path), 10), _serving_processes(tmp_path)
    assert not chains_left_since(chains), "a partition rule was left behind"


@pytest.mark.parametrize("name", SCENARIOS)
def test_serving_scenario_passes(name: str, tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    done = run_scenario_file(name, "--report-dir", reports, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    [run_dir] = list(reports.iterdir())
    run = json.loads((run_dir / "run.json").read_text())
    assert run["verdict"] == "pass" and run["ended_by"] == "load finished"
    assert run["checks"] and {c["status"] for c in run["checks"]} == {"pass"}
    events = [Event.model_validate(e) for e in run["events"]]
    requests = [e for e in events if e.kind == "load.request"]
    assert len(requests) > 1000  # every request of the load is in the history
    if name != "serving-overload-shedding":  # (that one's "fault" is the load step itself)
        assert len([e for e in events if e.kind == "fault.applied"]) == 1
    # The report: per-window error rate and latency, failover/failback, the timeline plot.
    serving = run["serving"]
    assert serving["windows"]
    html = (run_dir / "serving.html").read_text()
    assert "data:image/png;base64," in html
    for check in run["checks"]:
        assert check["name"] in html
    assert (run_dir / "serving-timeline.png").stat().st_size > 10_000
    assert "serving.html" in (run_dir / "report.html").read_text()  # the run's page links the serving page


def test_broken_gateway_fails_failover_and_error_rate(tmp_path: Path) -> None:
    """No fallback model and no cache rung: the same kill now costs errors, and the checks say so."""
    scenario = load_scenario(ROOT / "scenarios" / "serving-primary-killed.yaml")
    assert isinstance(scenario.target, ServingTarget)
    broken = scenario.model_copy(
        update={"target": scenario.target.model_copy(update={"fallback": None, "cache_fallback": False})}
    )
    result = execute(broken, RunOptions(report_root=tmp_path, golden=False))
    statuses = {r.name: r.status for r in result.results}
    assert result.exit_code == EXIT_FAIL, statuses
    assert statuses["failover_within[kill-primary]"] == "fail"
    assert statuses["error_rate_during"] == "fail"
    failover = next(r for r in result.results if r.check == "failover_within")
    assert any("502" in line for line in failover.evidence), failover.evidence


def test_http_target_runs_against_a_gateway_mlchaos_did_not_start(tmp_path: Path) -> None:
    """Point mlchaos at an existing endpoint: it starts nothing, waits for /healthz, drives the load and
    kills a backend process selected by its command line, as it would over SSH on a staging fleet."""
    stack_dir = tmp_path / "stack"
    stack_dir.mkdir()
    spec = ServingTarget.model_validate(
        {
            "type": "serving",
            "request_timeout": "500ms",
            "probes": {"interval": "500ms", "timeout": "300ms", "failure_threshold": 3, "success_threshold": 2},
        }
    )
    stack = ServingJob(spec, LocalTransport(), stack_dir, seed=3, extra_env={})
    stack.start()
    try:
        deadline = time.monotonic() + 60
        while not any(e.kind == "serving.ready" for e in stack.poll_events()):
            assert time.monotonic() < deadline, "the stack never became ready"
            time.sleep(0.1)
        scenario = parse_scenario(
            f"""
name: existing-gateway
target: {{type: http, url: "{stack.url}", health: /healthz}}
load:
  method: POST
  url: /v1/predict
  rate: 50
  duration: 10s
  body: '{{"prompt": "request {{i}}"}}'
  served_by: {{header: X-Backend}}
faults:
  - name: kill-primary
    type: kill
    params: {{name: 'model_server --replica primary .*--run-dir {stack_dir}'}}
    trigger: {{after: 3s}}
checks:
  - {{type: failover_within, params: {{fault: kill-primary, within: 2s}}}}
  - {{type: error_rate, params: {{fault: kill-primary, window: during, until: load.end, max: 0.01}}}}
"""
        )
        result = execute(scenario, RunOptions(report_root=tmp_path / "reports", golden=False))
        assert result.exit_code == EXIT_PASS, (result.error, [r.model_dump() for r in result.results])
        assert result.ended_by == "load finished"
        assert result.history.of("target.ready")
        assert (result.run_dir / "serving.html").exists()
    finally:
        stack.stop(grace=5)


def test_unknown_replica_is_refused_before_anything_starts(tmp_path: Path) -> None:
    scenario = load_scenario(ROOT / "scenarios" / "serving-primary-killed.yaml")
    [fault] = scenario.faults
    bad = fault.model_copy(update={"params": fault.params.model_copy(update={"replica": "primay"})})
    result = execute(scenario.model_copy(update={"faults": [bad]}), RunOptions(report_root=tmp_path, golden=False))
    assert result.exit_code == EXIT_INVALID
    assert "no replica named 'primay'" in result.error and "primary" in result.error
    assert not result.history.of("fault.applied") and not result.history.of("load.request")


def test_replica_selector_on_a_target_without_replicas_is_refused(tmp_path: Path) -> None:
    scenario = parse_scenario(
        """
name: no-replicas
allow_no_checks: true
target: {type: command, command: [sleep, "30"]}
faults: [{name: k, type: kill, params: {replica: primary}, trigger: {after: 1s}}]
"""
    )
    result = execute(scenario, RunOptions(report_root=tmp_path, golden=False))
    assert result.exit_code == EXIT_INVALID
    assert "has no replicas" in result.error


def test_interrupted_serving_run_stops_the_stack_and_the_load(tmp_path: Path) -> None:
    """SIGTERM to the harness mid-run: the fault is healed, the stack and the load generator are gone."""
    # Every process of this run carries the mark in its environment: other tests' runs (xdist workers) may have
    # load generators and stacks of their own alive right now, which are not this run's leftovers.
    mark = f"interrupted-serving-{os.getpid()}-{time.monotonic_ns()}"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "chaos.cli.commands",
            "run",
            str(ROOT / "scenarios" / "serving-primary-slow.yaml"),
            "--report-dir",
            str(tmp_path),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "TEST_RUN_MARK": mark},
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "fault applied" in line:
                break
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 3, out
    [run_dir] = list(tmp_path.iterdir())
    history = read_jsonl(run_dir / "history.jsonl")
    assert [e for e in history if e["kind"] == "fault.healed"]
    ours = _processes_marked(f"TEST_RUN_MARK={mark}")
    assert not [line for line in ours if "-m chaos.load --emit" in line], ours
    assert not [line for line in ours if line.startswith("T") and "chaos.reference.serving" in line], ours


def _processes_marked(entry: str) -> list[str]:
    """``state args`` of every live process whose environment holds ``entry`` (NAME=VALUE)."""
    found = []
    for proc in live_processes():
        try:
            environ = Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if entry.encode() in environ:
            args = proc.cmdline.replace(b"\0", b" ").decode(errors="replace")
            found.append(f"{proc.state} {args}")
    return found
