"""A user's streaming fleet behind a real gateway: ``scenarios/serving-stream-haproxy-killed.yaml`` runs Debian's
HAProxy with the configuration a user writes for token streams (``scenarios/haproxy/stream-fleet.cfg``: retries,
redispatch, retry-on, a backup server) in front of two OpenAI-style streaming servers written like a user's
(``tests/jobs/user_stream_server.py``, which imports nothing from chaos), and SIGKILLs the big-model primary
mid-stream under streamed load.

What a real gateway does, and what these tests hold the verdicts to:

- the streams the primary was sending are cut mid-answer whatever the retry configuration (no real gateway
  resumes a started response): ``streams_completed`` fails, naming each cut stream (i, primary, tokens);
- the streams sent after the kill are retried onto the backup: no errors, the backup answers them, and after
  the restarted primary is back the streams complete again: every other check passes;
- with ``scenarios/haproxy/stream-no-retries.cfg`` (no retries) the new streams fail too: 503s until the health
  checks mark the primary down, and the error rate check fails.

And ``scenarios/serving-stream-haproxy-slow.yaml``, the primary's traffic delayed by 400 ms (the ``delay`` fault
on the port the roles target chose for it): with a connect deadline
(``scenarios/haproxy/stream-connect-deadline.cfg``) HAProxy marks the primary down on the first failed connect
and every check passes; with the textbook's health check (``stream-textbook-probes.cfg``: every 5 s, 2 s timeout)
every probe passes, no error or cut stream or token gap shows the slow replica, and only ``ttft_within`` fails,
naming the slow streams and the primary.

The four runs happen once per module (about 15 s each). Skipped, with the reason, where haproxy is not installed.
"""

from __future__ import annotations

import pytest
from support import NEEDS_HAPROXY, SCENARIOS, Runs, balancer_runs, pids_mentioning, streamed_requests, verdicts_by_name

from chaos.load.summary import scheduled_ns
from chaos.run.orchestrator import RunResult

pytestmark = [pytest.mark.slow, NEEDS_HAPROXY]

SCENARIO = SCENARIOS / "serving-stream-haproxy-killed.yaml"
NO_RETRIES = "scenarios/haproxy/stream-no-retries.cfg"
SLOW = SCENARIOS / "serving-stream-haproxy-slow.yaml"
TEXTBOOK_PROBES = "scenarios/haproxy/stream-textbook-probes.cfg"
CUT_CHECK = "streams_cut_by_kill"
NEW_STREAMS = "new_streams_error_rate"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    killed = balancer_runs(SCENARIO, {"retries": None, "no_retries": NO_RETRIES}, tmp_path_factory)
    return killed | balancer_runs(SLOW, {"slow": None, "slow_textbook": TEXTBOOK_PROBES}, tmp_path_factory)


def kill_ns(result: RunResult) -> int:
    applied = result.history.of("fault.applied")
    assert applied, "the kill never applied"
    return applied[0].ts_ns


def test_the_streams_the_killed_primary_was_sending_are_cut_and_named(runs: Runs) -> None:
    result = runs["retries"]
    got = verdicts_by_name(result)
    killed = [e for e in result.history.of("target.role_exit") if e.get_str("replica") == "primary"]
    assert killed and killed[0].get_int("code") == -9, killed  # the kill landed on the primary's process
    cut = [e for e in streamed_requests(result) if e.get_str("ended") == "cut"]
    assert cut, "no stream was open on the primary when it was killed"
    assert all(e.data.get("backends") == ["primary"] for e in cut), [e.data for e in cut]
    status, reason = got[CUT_CHECK]
    assert status == "fail", got
    assert f"{len(cut)} cut stream(s) (i, backend, tokens)" in reason, reason
    for e in cut[:5]:  # the reason names the first five, the evidence every one
        assert f"{e.get_int('i')} (primary, {e.get_int('tokens')} tokens)" in reason, reason
    evidence = next(r.evidence for r in result.results if r.name == CUT_CHECK)
    named = [line for line in evidence if "cut after" in line and "via primary" in line]
    assert len(named) == len(cut), evidence
    assert result.verdict == "fail", got
    others = {name: s for name, (s, _) in got.items() if s not in ("pass", "info")}
    assert others == {CUT_CHECK: "fail"}, got  # every other check passed


def test_with_retries_the_new_streams_go_to_the_backup_and_back_to_the_restarted_primary(runs: Runs) -> None:
    result = runs["retries"]
    got = verdicts_by_name(result)
    for name in (NEW_STREAMS, "ttft_within[kill-primary]", "inter_token_gap_within", "streams_after_failback"):
        assert got[name][0] == "pass", (name, got[name])
    assert got["fallback_ladder"][0] == "pass", got["fallback_ladder"]
    down = [e for e in result.history.of("detect.backend_down") if e.get_str("backend") == "primary"]
    up = [e for e in result.history.of("serving.backend_up") if e.get_str("backend") == "primary"]
    assert down and down[0].source == "haproxy", down  # HAProxy's own log line is the detection
    assert up and up[-1].ts_ns > down[0].ts_ns, up
    during = [e for e in streamed_requests(result) if kill_ns(result) <= scheduled_ns(e) < up[-1].ts_ns]
    assert during and all(e.get_str("ended") == "complete" for e in during), [e.data for e in during]
    assert {e.get_str("backend") for e in during} >= {"fallback"}, [e.data for e in during]
    last = streamed_requests(result)[-10:]  # the end of the load: the primary again, whole answers
    assert all(e.get_str("ended") == "complete" and e.data.get("backends") == ["primary"] for e in last), last


def test_without_retries_the_new_streams_fail_too(runs: Runs) -> None:
    result = runs["no_retries"]
    got = verdicts_by_name(result)
    assert got[CUT_CHECK][0] == "fail", got
    assert got[NEW_STREAMS][0] == "fail", got
    refused = [e for e in streamed_requests(result) if e.get_int("status") == 503]  # HAProxy: no server answered
    assert refused and all(e.get_str("ended") == "error" for e in refused), refused
    assert all(scheduled_ns(e) >= kill_ns(result) for e in refused), refused  # new streams, sent after the kill
    evidence = next(r.evidence for r in result.results if r.name == NEW_STREAMS)
    assert any(f"503 x{len(refused)}" in line for line in evidence), evidence
    assert result.verdict == "fail", got


def test_a_connect_deadline_moves_the_streams_off_the_slow_primary(runs: Runs) -> None:
    result = runs["slow"]
    got = verdicts_by_name(result)
    assert {name: s for name, (s, _) in got.items() if s not in ("pass", "info")} == {}, got
    applied, healed = kill_ns(result), result.history.of("fault.healed")[0].ts_ns
    down = [e for e in result.history.of("detect.backend_down") if e.get_str("backend") == "primary"]
    assert down and applied < down[0].ts_ns < healed, down  # HAProxy marked the slow primary down during the fault
    # Until HAProxy has the primary UP again: the heal takes effect before its fault.healed is recorded, and the
    # health checks can bring the primary back in between.
    up = [e.ts_ns for e in result.history.of("serving.backend_up") if e.get_str("backend") == "primary"]
    back = min([healed, *(t for t in up if t > down[0].ts_ns)])
    during = [e for e in streamed_requests(result) if down[0].ts_ns <= scheduled_ns(e) < back]
    assert during and {e.get_str("backend") for e in during} == {"fallback"}, [e.data for e in during]
    assert all(e.get_str("ended") == "complete" for e in streamed_requests(result)), "a stream was cut"


def test_with_the_textbook_probes_only_time_to_first_token_shows_the_slow_primary(runs: Runs) -> None:
    result = runs["slow_textbook"]
    got = verdicts_by_name(result)
    failed = {name: s for name, (s, _) in got.items() if s not in ("pass", "info")}
    # errors, cuts and gaps pass; nothing was detected, so there was no failover to come back from
    assert failed == {
        "ttft_during": "fail",
        "detected_within[delay-primary]": "fail",
        "failback_within[delay-primary]": "unknown",
    }, got
    assert not result.history.of("detect.backend_down"), "a probe saw the slow primary"
    applied, healed = kill_ns(result), result.history.of("fault.healed")[0].ts_ns
    slow = [
        e
        for e in streamed_requests(result)
        if applied <= scheduled_ns(e) < healed and float(e.data.get("ttft_s") or 0) > 0.45
    ]
    assert slow and {e.get_str("backend") for e in slow} == {"primary"}, [e.data for e in slow]
    evidence = next(r.evidence for r in result.results if r.name == "ttft_during")
    worst = [line for line in evidence if "worst ttft" in line]  # the slow streams, named with who served them
    assert worst and all("via primary" in line for line in worst), evidence


def test_the_fleet_leaves_no_process_behind(runs: Runs) -> None:
    # Each run's own processes (by pid and command line: other modules run fleets of the same files meanwhile).
    for name, result in runs.items():
        for start in result.history.of("target.role_start"):
            pid, role = start.get_int("pid"), start.get_str("role")
            assert pid is not None and role is not None, start
            marker = "haproxy" if role == "lb" else "user_stream_server.py"
            assert pid not in pids_mentioning(marker), f"{name}: {role} (pid {pid}) outlived its run"
