"""The streamed serving scenarios end to end against the reference stack (real token-model servers, the gateway,
real faults, streamed open-loop load): each shipped scenario passes, and the same scenario against a gateway
configured worse fails the check that should catch it, naming streams, replicas and rungs. Each run happens
once (a module fixture) and its tests read it; nothing of a run may be left running afterwards."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from support import ROOT, chains_left_since, root_chains, wait_for

from chaos.checks.base import CheckResult
from chaos.checks.serving.ladder import Ladder, Rung
from chaos.history.timeline import Event
from chaos.report.ladder import ladder_series
from chaos.report.timeline import origin_of
from chaos.run.orchestrator import RunOptions, execute
from chaos.run.result import EXIT_PASS, RunResult
from chaos.spec.scenario import load_scenario
from chaos.spec.serving import ServingTarget

pytestmark = pytest.mark.slow

RUNGS = [
    {"backend": "primary", "rung": "big"},
    {"backend": "fallback", "rung": "small"},
    {"backend": "cache", "rung": "cached"},
]


def _serving_processes(folder: Path) -> list[str]:
    ps = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    return [line for line in ps.splitlines() if "chaos.reference.serving" in line and str(folder) in line]


def _run(factory: pytest.TempPathFactory, name: str, *, rules: bool = False, **target: Any) -> RunResult:
    """Scenario ``name`` as shipped, or with ``target`` settings swapped; checks nothing was left behind (with
    ``rules``, no iptables chain either)."""
    scenario = load_scenario(ROOT / "scenarios" / f"{name}.yaml")
    assert isinstance(scenario.target, ServingTarget)
    if target:
        scenario = scenario.model_copy(update={"target": scenario.target.model_copy(update=target)})
    folder = factory.mktemp(name)
    chains = root_chains() if rules else set()
    result = execute(scenario, RunOptions(report_root=folder, golden=False))
    assert wait_for(lambda: not _serving_processes(folder), 10), _serving_processes(folder)
    assert not rules or not chains_left_since(chains), "a delay rule was left behind"
    return result


def _check(result: RunResult, name: str) -> CheckResult:
    return next(r for r in result.results if r.name == name or r.name.startswith(f"{name}["))


def _statuses(result: RunResult) -> dict[str, str]:
    return {r.name: r.status for r in result.results}


def _streams(result: RunResult) -> list[Event]:
    return [e for e in result.history.events if e.kind == "load.request" and e.data.get("stream") is True]


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> RunResult:
    return _run(tmp_path_factory, "serving-stream-primary-killed")


@pytest.fixture(scope="module")
def slow(tmp_path_factory: pytest.TempPathFactory) -> RunResult:
    return _run(tmp_path_factory, "serving-stream-primary-slow", rules=True)


@pytest.fixture(scope="module")
def slow_no_deadline(tmp_path_factory: pytest.TempPathFactory) -> RunResult:
    return _run(tmp_path_factory, "serving-stream-primary-slow", rules=True, first_token_timeout=None)


@pytest.fixture(scope="module")
def ladder(tmp_path_factory: pytest.TempPathFactory) -> RunResult:
    return _run(tmp_path_factory, "serving-stream-ladder")


def test_a_big_model_killed_mid_stream_resumes_every_cut_stream_on_the_small_one(killed: RunResult) -> None:
    assert killed.exit_code == EXIT_PASS, _statuses(killed)
    assert set(_statuses(killed).values()) == {"pass"}
    resumed = [e for e in _streams(killed) if e.data["resumed"]]
    assert resumed and all(e.data["backends"] == ["primary", "fallback"] for e in resumed)
    assert all(e.data["tokens"] == 24 for e in resumed)
    completed = _check(killed, "streams_completed")
    assert f"{len(resumed)} cut on a backend: {len(resumed)} resumed by the gateway, 0 reached the user cut" in (
        completed.evidence
    )


# A gateway that does not resume a cut stream fails streams_completed naming each cut stream: judged end to end on
# a real one (HAProxy, test_e2e_real_gateway_streams); the reference gateway's resume_streams: false cutting them
# is judged in tests/integration/test_stream_load.py (killed-cut).


def test_a_slow_big_model_shows_only_in_ttft_and_the_first_token_deadline_holds_it(slow: RunResult) -> None:
    assert slow.exit_code == EXIT_PASS, _statuses(slow)
    assert set(_statuses(slow).values()) == {"pass"}
    assert any(e.kind == "serving.breaker" and e.data.get("state") == "open" for e in slow.history.events)
    assert not any(e.kind == "detect.backend_down" for e in slow.history.events)  # health never saw it


def test_without_the_deadline_ttft_fails_naming_the_slow_streams(slow_no_deadline: RunResult) -> None:
    statuses = _statuses(slow_no_deadline)
    assert statuses["ttft_during"] == "fail", statuses
    assert statuses["gap_during"] == "pass" and _check(slow_no_deadline, "streams_completed").status == "pass"
    ttft = _check(slow_no_deadline, "ttft_during")
    assert ttft.measured is not None and ttft.measured > 0.45
    worst = [line for line in ttft.evidence if "worst ttft" in line]
    assert worst and all("via primary" in line for line in worst), ttft.evidence


def test_the_ladder_goes_down_to_the_cached_answers_and_climbs_back(ladder: RunResult) -> None:
    assert ladder.exit_code == EXIT_PASS, _statuses(ladder)
    assert set(_statuses(ladder).values()) == {"pass"}
    moves = _check(ladder, "fallback_ladder").evidence
    assert moves[0].startswith("rung timeline from serving.route events"), moves
    assert any(line.startswith("down big -> small") for line in moves)
    assert any(line.startswith("down small -> cached") for line in moves)
    assert any(line.startswith("up cached -> small") for line in moves)
    assert any(line.startswith("up small -> big") for line in moves)
    cached = [e for e in _streams(ladder) if e.data["backends"][-1:] == ["cache"]]
    assert cached and all(e.data["degraded"] is True and e.data["ended"] == "complete" for e in cached)
    assert any(e.data["backends"] == ["fallback", "cache"] for e in cached)  # cut on the small one, resumed
    # The report's timeline: the rung over time, in the check's names; the gateway's route changes over it.
    names = Ladder.of([Rung(**r) for r in RUNGS])
    series = ladder_series(ladder.history.events, origin_of(ladder.history.events), names)
    assert series is not None and series.rungs == ("big", "small", "cached")
    assert [series.rungs[y] for y in series.route_ys] == ["small", "cached", "small", "big"]
    steps = [rung for _, rung in series.steps()]
    assert steps[0] == "big" and "cached" in steps and steps[-1] == "big", steps
    assert 'id="timeline"' in (ladder.run_dir / "report.html").read_text()
