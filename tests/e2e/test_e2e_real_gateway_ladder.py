"""The fallback ladder behind a real gateway: ``scenarios/serving-stream-haproxy-ladder.yaml`` runs Debian's HAProxy
configured for a ladder (``scenarios/haproxy/stream-ladder.cfg``: the big model, then two backup servers, the
small model and a cached-answers server, ``tests/jobs/user_answer_cache.py``) under streamed load, SIGKILLs the
big model and, while it is down, the small one.

What these tests hold the verdicts to:

- with the ladder configuration, new streams go big -> small -> cached -> small -> big, each move on a signal
  and each move up after HAProxy's rise checks: every check passes; the only streams that do not complete are
  the ones open on a server at the instant it was killed (no real gateway resumes them, and no check judges
  the kill instants);
- with ``scenarios/haproxy/stream-ladder-allbackups.cfg`` (``option allbackups``) the cached rung serves while
  the small model is healthy: ``fallback_ladder`` fails, naming the moves small -> cached that came with no
  signal about the small one;
- the cached answers are the big model's, and a prompt the cache does not hold is an honest 404.

Both runs happen once per module (about 15 s each). Skipped, with the reason, where haproxy is not installed.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from support import (
    NEEDS_HAPROXY,
    ROOT,
    SCENARIOS,
    Runs,
    balancer_runs,
    pids_mentioning,
    streamed_requests,
    verdicts_by_name,
    wait_for,
)

from chaos.checks.serving.ladder import Ladder, Rung
from chaos.checks.serving.streams import stream_end_ns
from chaos.cluster.ports import free_port
from chaos.history.timeline import Event
from chaos.load.summary import scheduled_ns
from chaos.report.ladder import ladder_series
from chaos.report.timeline import origin_of
from chaos.run.result import RunResult

pytestmark = [pytest.mark.slow, NEEDS_HAPROXY]

SCENARIO = SCENARIOS / "serving-stream-haproxy-ladder.yaml"
ALLBACKUPS = "scenarios/haproxy/stream-ladder-allbackups.cfg"
ANSWERS = SCENARIOS / "haproxy" / "cached-answers.json"
CACHE_SERVER = ROOT / "tests" / "jobs" / "user_answer_cache.py"
MODEL_SERVER = ROOT / "tests" / "jobs" / "user_stream_server.py"
RUNGS = [
    Rung(backend="primary", rung="big"),
    Rung(backend="fallback", rung="small"),
    Rung(backend="cache", rung="cached"),
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return balancer_runs(SCENARIO, {"ladder": None, "allbackups": ALLBACKUPS}, tmp_path_factory)


def applied_ns(result: RunResult, fault: str) -> int:
    found = [e.ts_ns for e in result.history.of("fault.applied") if e.get_str("fault") == fault]
    assert found, f"{fault} never applied"
    return found[0]


def between_the_kills(result: RunResult) -> list[Event]:
    """The streams scheduled while the big model was down and the small one up (300 ms off either kill)."""
    lo, hi = applied_ns(result, "kill-big") + 300_000_000, applied_ns(result, "kill-small") - 300_000_000
    return [e for e in streamed_requests(result) if lo < scheduled_ns(e) < hi]


def check_timeline(result: RunResult) -> list[str]:
    """The rung names of fallback_ladder's rung timeline (its first evidence line: ``+1.2s big, +3.4s small``)."""
    line = next(r for r in result.results if r.name == "fallback_ladder").evidence[0]
    return [item.split()[-1] for item in line.split(": ", 1)[1].split(", ")]


def test_the_ladder_goes_big_small_cached_and_climbs_back_with_every_check_passing(runs: Runs) -> None:
    result = runs["ladder"]
    got = verdicts_by_name(result)
    assert result.verdict == "pass", got
    assert {s for s, _ in got.values()} <= {"pass", "info"}, got
    assert check_timeline(result) == ["big", "small", "cached", "small", "big"], got["fallback_ladder"]
    moves = next(r for r in result.results if r.name == "fallback_ladder").evidence
    for move in ("down big -> small", "down small -> cached", "up cached -> small", "up small -> big"):
        assert any(line.startswith(move) for line in moves), moves
    for replica in ("primary", "fallback"):  # each kill landed, and HAProxy's own log saw it
        exits = [e for e in result.history.of("target.role_exit") if e.get_str("replica") == replica]
        assert exits and exits[0].get_int("code") == -9, exits
        down = [e for e in result.history.of("detect.backend_down") if e.get_str("backend") == replica]
        assert down and down[0].source == "haproxy", down
    cached = [e for e in streamed_requests(result) if e.get_str("backend") == "cache"]
    assert cached and all(e.get_str("ended") == "complete" and e.get_int("tokens") == 24 for e in cached), cached
    assert {e.get_str("backend") for e in between_the_kills(result)} == {"fallback"}  # the cache waits its turn
    # The report's timeline draws the rung over time: the plot guesses the ladder from the backends.
    origin = origin_of(result.history.events)
    plotted = ladder_series(result.history.events, origin)
    assert plotted is not None and plotted.rungs == ("primary", "fallback", "cache"), plotted
    named = ladder_series(result.history.events, origin, Ladder.of(RUNGS))
    assert named is not None and named.rungs == ("big", "small", "cached")
    steps = [rung for _, rung in named.steps()]
    assert steps[0] == "big" and "cached" in steps and steps[-1] == "big", steps
    assert 'id="timeline"' in (result.run_dir / "report.html").read_text()


def test_only_the_streams_open_at_a_kill_are_cut(runs: Runs) -> None:
    result = runs["ladder"]
    kills = {"primary": applied_ns(result, "kill-big"), "fallback": applied_ns(result, "kill-small")}
    lost = [e for e in streamed_requests(result) if e.get_str("ended") != "complete"]
    assert lost, "no stream was open on a server when it was killed"
    for e in lost:
        backend = e.get_str("backend")
        assert backend in kills, e.data  # headers came from the server that was killed
        assert scheduled_ns(e) < kills[backend] <= stream_end_ns(e) + 50_000_000, e.data
    assert any(e.get_str("backend") == "primary" for e in lost) and any(
        e.get_str("backend") == "fallback" for e in lost
    )


def test_allbackups_serves_cached_answers_while_the_small_model_is_up_and_fails_the_ladder(runs: Runs) -> None:
    result = runs["allbackups"]
    got = verdicts_by_name(result)
    status, reason = got["fallback_ladder"]
    assert status == "fail", got
    assert "moved down small -> cached at +" in reason and "with no signal" in reason, reason
    assert "about small (fallback)" in reason, reason
    assert result.verdict == "fail"
    assert {name for name, (s, _) in got.items() if s not in ("pass", "info")} == {"fallback_ladder"}, got
    served = {e.get_str("backend") for e in between_the_kills(result)}  # the cache answered while the small model
    assert served == {"fallback", "cache"}, served  # was up


@pytest.fixture
def answer_cache() -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    port = free_port()
    args = [sys.executable, str(CACHE_SERVER), "--port", str(port), "--answers", str(ANSWERS)]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        assert wait_for(lambda: _get(f"{url}/healthz") == 200, 10), "the cache server never answered"
        yield proc, url
    finally:
        proc.kill()
        proc.wait()


def _get(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=1) as answer:
            return int(answer.status)
    except (OSError, urllib.error.URLError):
        return None


def _ask(url: str, prompt: str, *, stream: bool) -> tuple[int, str]:
    body = {"model": "big", "messages": [{"role": "user", "content": prompt}], "stream": stream, "max_tokens": 24}
    request = urllib.request.Request(f"{url}/v1/chat/completions", json.dumps(body).encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return int(answer.status), answer.read().decode()
    except urllib.error.HTTPError as error:
        return int(error.code), error.read().decode()


def _streamed_text(sse: str) -> str:
    lines = [line[len("data: ") :] for line in sse.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]", lines
    chunks = [json.loads(line)["choices"][0]["delta"].get("content", "") for line in lines[:-1]]
    return "".join(chunks).strip()


def test_the_cache_replays_the_big_models_answers_and_misses_honestly(
    answer_cache: tuple[subprocess.Popen[bytes], str],
) -> None:
    proc, url = answer_cache
    answers = json.loads(ANSWERS.read_text())
    assert sorted(answers) == [f"question s{k}" for k in range(8)]  # the scenario's 8 sessions
    port = free_port()
    model = subprocess.Popen(
        [
            sys.executable,
            str(MODEL_SERVER),
            "--port",
            str(port),
            "--model",
            "big",
            "--prefill",
            "0",
            "--token-delay",
            "0",
        ],
        stdout=subprocess.DEVNULL,
    )
    try:
        big = f"http://127.0.0.1:{port}"
        assert wait_for(lambda: _get(f"{big}/healthz") == 200, 30), "the big model never answered"
        for prompt, text in answers.items():
            status, streamed = _ask(url, prompt, stream=True)
            assert status == 200 and _streamed_text(streamed) == text, (prompt, streamed)
            status, whole = _ask(big, prompt, stream=False)
            assert status == 200 and json.loads(whole)["choices"][0]["message"]["content"] == text, prompt
    finally:
        model.kill()
        model.wait()
    status, missed = _ask(url, "a question nobody asked", stream=True)
    assert status == 404 and "error" in json.loads(missed), missed
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0


def test_the_fleet_leaves_no_process_behind(runs: Runs) -> None:
    assert runs  # both runs are over
    started = [e.get_int("pid") for r in runs.values() for e in r.history.of("target.role_start")]
    assert started and all(pid is not None for pid in started)
    alive = [pid for pid in started if pid is not None and _alive(pid)]
    assert not alive, f"processes of the runs outlived them: {alive}"
    assert not pids_mentioning("stream-ladder.cfg") and not pids_mentioning("stream-ladder-allbackups.cfg")
    assert not pids_mentioning(ANSWERS.name), "a cache server outlived its run"


def _alive(pid: int) -> bool:
    """The process ``pid`` still runs one of the fleet's programs (a reused pid running something else is not it)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except OSError:
        return False
    return any(name in cmdline for name in (b"user_stream_server", b"user_answer_cache", b"haproxy"))
