"""The stream and ladder checks on hand-made histories (:mod:`stream_histories`): what each measures, the
evidence it cites, its windows and params, and the ladder panel of the run timeline. The safety suite
(test_check_safety) holds each to its holding and violating histories; here are the cases a reader checks by eye.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml
from pydantic import ValidationError
from stream_histories import DURING, KILL, RUNGS, StreamRun, scenario
from support import PNG_SIGNATURE, ROOT, ev, png_size

from chaos.checks.base import CHECKS, CheckResult
from chaos.checks.serving.ladder import Ladder, Rung, request_points, smoothed
from chaos.checks.serving.ladder_verdicts import LADDER_CHECKS, AlertParams
from chaos.checks.serving.stream_verdicts import STREAM_CHECKS
from chaos.history.timeline import Event, History
from chaos.report.ladder import ladder_series
from chaos.report.timeline import plot_run_timeline


def judge(check: str, events: list[Event], **params: Any) -> CheckResult:
    spec = CHECKS[check]
    return spec.evaluate(History.from_events(events), spec.Params.model_validate(params), scenario())


@pytest.mark.parametrize("name", STREAM_CHECKS + LADDER_CHECKS)
def test_registered_with_documented_strict_params(name: str) -> None:
    spec = CHECKS[name]
    assert spec.summary and spec.to_add
    for field_name, field in spec.Params.model_json_schema(by_alias=False).get("properties", {}).items():
        assert field.get("description"), (name, field_name)
    with pytest.raises(ValidationError):
        spec.Params.model_validate({"no_such_param": 1})


@pytest.mark.parametrize(
    ("check", "params"),
    [
        ("ttft_within", {"q": 99, "max": "1s"}),  # q is a fraction
        ("streams_completed", {"min_share": 1.5}),
        ("fallback_ladder", {"rungs": RUNGS[:1]}),  # a ladder has two rungs at least
        ("fallback_ladder", {"rungs": RUNGS, "down_on": ["backend down!"]}),
        ("fallback_share_alert", {"max_share": 1.0}),
        ("fallback_share_alert", {"max_share": 0.2, "for": 0}),
        ("fallback_share_alert", {"max_share": 0.2, "expect": "page"}),
    ],
)
def test_bad_params_are_rejected(check: str, params: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        CHECKS[check].Params.model_validate(params)


def test_the_documented_checks_block_is_valid() -> None:
    text = (ROOT / "docs" / "serving.md").read_text(encoding="utf-8")
    [block] = [b for b in re.findall(r"```yaml\n(.*?)```", text, flags=re.S) if "fallback_ladder" in b]
    entries = yaml.safe_load(block)["checks"]
    assert {e["type"] for e in entries} == set(STREAM_CHECKS + LADDER_CHECKS)
    for entry in entries:
        CHECKS[entry["type"]].Params.model_validate(entry.get("params", {}))


def test_the_alert_reads_for_as_a_duration_defaulting_to_five_minutes() -> None:
    assert AlertParams.model_validate({"max_share": 0.2}).for_ == 300.0
    assert AlertParams.model_validate({"max_share": 0.2, "for": "2m"}).for_ == 120.0


# ---------------------------------------------------------------------------------------------------------
# streams_completed


def test_a_gateway_without_retries_fails_naming_the_cut_streams() -> None:
    run = StreamRun(resume=False)
    result = judge("streams_completed", run.events(), **DURING)
    assert result.status == "fail"
    cut = run.cut()
    assert len(cut) >= 5
    for i in cut[:5]:  # the first five in the reason (i, backend, tokens at the cut), every one in the evidence
        assert f"{i} (primary, " in result.reason
    assert all(any(f"stream {i} (cut after" in line for line in result.evidence) for i in cut)
    assert f"{len(cut)} cut stream(s)" in result.reason
    assert any(f"0 resumed by the gateway, {len(cut)} reached the user cut" in line for line in result.evidence)


def test_resumed_streams_count_as_complete_and_are_reported() -> None:
    result = judge("streams_completed", StreamRun().events(), **DURING, min_share=1.0)
    assert result.status == "pass" and result.measured == 1.0
    line = next(line for line in result.evidence if "cut on a backend" in line)
    assert "resumed by the gateway, 0 reached the user cut" in line and not line.startswith("0 ")
    strict = judge("streams_completed", StreamRun().events(), **DURING, min_share=1.0, cut_ok_if_resumed=False)
    assert strict.status == "fail"


def test_streams_cut_by_a_fault_belong_to_its_during_window_though_sent_before_it() -> None:
    run = StreamRun(resume=False)
    before = judge("streams_completed", run.events(), fault=KILL, window="before", min_share=1.0)
    during = judge("streams_completed", run.events(), **DURING, min_share=1.0)
    assert during.status == "fail"
    assert before.status == "fail"  # open before the fault too: the cut stream was sent then
    after = judge(
        "streams_completed",
        run.events(),
        fault=KILL,
        window="after",
        until="serving.backend_up",
        until_backend="primary",
        min_share=1.0,
    )
    assert after.status == "pass"


# ---------------------------------------------------------------------------------------------------------
# ttft and gaps: before, during and after a fault


@pytest.mark.parametrize(("window", "expect"), [("before", "pass"), ("during", "fail"), ("after", "pass")])
def test_ttft_is_judged_in_the_window_of_the_fault(window: str, expect: str) -> None:
    run = StreamRun(slow=10.0, ttft=0.1)  # the small rung's first token comes after 1 s
    # after: traffic is back on the primary `hold` (1 s) after its backend_up, which settle skips
    params = {**DURING, "window": window, "q": 0.99, "max": 0.5, "settle": 1.0 if window == "after" else 0.0}
    result = judge("ttft_within", run.events(), **params)
    assert result.status == expect, result.reason
    if expect == "fail":
        assert result.measured == pytest.approx(1.0)
        assert any("via small" in line and "worst ttft" in line for line in result.evidence)


def test_a_stream_that_never_starts_counts_at_its_timeout() -> None:
    result = judge("ttft_within", StreamRun(no_first_token=True).events(), **DURING, q=0.5, max=1.0)
    assert result.status == "fail" and result.measured == pytest.approx(5.0)
    assert any("timed out before the first token" in line for line in result.evidence)


def test_gaps_are_placed_at_the_token_after_them() -> None:
    run = StreamRun(slow=4.0, gap=0.05)  # 0.2 s gaps on the small rung, 0.05 s on the primary
    during = judge("inter_token_gap_within", run.events(), **DURING, q=0.5, max=0.1)
    before = judge("inter_token_gap_within", run.events(), **{**DURING, "window": "before"}, q=0.99, max=0.1)
    assert during.status == "fail" and during.measured == pytest.approx(0.2)
    assert before.status == "pass" and before.measured == pytest.approx(0.05)


def test_a_stream_stalled_to_its_timeout_counts_the_wait_as_a_gap() -> None:
    result = judge("inter_token_gap_within", StreamRun(stall=True).events(), q=0.99, max=1.0)
    assert result.status == "fail" and result.measured is not None and result.measured > 4.0
    assert any("timed out mid-way" in line for line in result.evidence)


# ---------------------------------------------------------------------------------------------------------
# fallback_ladder


def test_the_ladder_cites_its_timeline_and_each_moves_signal() -> None:
    run = StreamRun(cache_from=7.0)
    result = judge("fallback_ladder", run.events(), rungs=RUNGS, up_after=1.0)
    assert result.status == "pass", result.reason
    timeline = result.evidence[0]
    assert "big" in timeline and "small" in timeline and "cached" in timeline
    assert any(
        # the first signal on primary: a stream cut there (at its cut, before the breaker opened) or the breaker
        line.startswith("down big -> small") and ("failed on primary" in line or "serving.breaker primary open" in line)
        for line in result.evidence
    )
    assert any(
        line.startswith("down small -> cached") and "detect.backend_down small" in line for line in result.evidence
    )
    assert any(line.startswith("up cached -> big") for line in result.evidence)


def test_the_gateways_routes_are_the_timeline_when_recorded() -> None:
    run = StreamRun(routes=True)
    result = judge("fallback_ladder", run.events(), rungs=RUNGS, up_after=1.0)
    assert result.status == "pass" and "from serving.route events" in result.evidence[0]
    early = judge("fallback_ladder", run.events(), rungs=RUNGS, up_after=2.0)
    assert early.status == "fail" and "sooner than the 2s hysteresis" in early.reason


def test_a_move_down_with_no_signal_fails_naming_the_move() -> None:
    result = judge("fallback_ladder", StreamRun(with_fault=False).events(), rungs=RUNGS)
    assert result.status == "fail"
    assert "moved down big -> small at +5.000s with no signal" in result.reason


def test_a_request_that_failed_on_the_rung_is_a_signal_unless_left_out() -> None:
    run = StreamRun(breaker=False, down_after=None)  # only the streams the kill cut (resumed) say it failed
    assert judge("fallback_ladder", run.events(), rungs=RUNGS).status == "pass"
    only_probes = judge("fallback_ladder", run.events(), rungs=RUNGS, down_on=["detect.backend_down"])
    assert only_probes.status == "fail"


def test_transition_noise_is_not_a_move() -> None:
    ladder = Ladder.of([Rung(backend="primary", rung="big"), Rung(backend="small", rung="small")])
    backends = ["primary"] * 10 + ["small", "primary"] + ["small"] * 10
    reqs = [
        ev(k * 0.1, "load.request", source="load", i=k, scheduled_ns=round(k * 1e8), status=200, backend=b)
        for k, b in enumerate(backends)
    ]
    kept = smoothed(request_points(reqs, ladder), min_run=3)
    assert [p.rung for p in kept] == [0, 1]


# ---------------------------------------------------------------------------------------------------------
# fallback_share_alert: the textbook's 5-minute rule


def _long_load(fallback: tuple[float, float], minutes: float = 12.0) -> list[Event]:
    """One request a second for ``minutes``; the small rung serves in ``fallback`` (seconds)."""
    out = [ev(0.0, "load.start", source="load", start_ns=0, duration_s=minutes * 60, rate=1.0)]
    for i in range(round(minutes * 60)):
        backend = "small" if fallback[0] <= i < fallback[1] else "primary"
        out.append(
            ev(
                i + 0.1,
                "load.request",
                source="load",
                i=i,
                scheduled_ns=round(i * 1e9),
                latency_s=0.1,
                status=200,
                backend=backend,
                stream=True,
                ttft_s=0.05,
                gaps_s=[0.05],
                tokens=2,
                ended="complete",
                backends=[backend],
                resumed=False,
                session=None,
            )
        )
    return out


def test_six_minutes_on_the_fallback_fires_the_five_minute_alert() -> None:
    events = _long_load((60.0, 420.0))
    quiet = judge("fallback_share_alert", events, max_share=0.2)
    assert quiet.status == "fail" and "the alert would fire" in quiet.reason
    # the 60 s window's share rises past 0.2 12 s into the fallback and falls under it 48 s after: 396 s
    assert quiet.measured == pytest.approx(360.0 + 48.0 - 12.0, abs=2.0)
    assert judge("fallback_share_alert", events, max_share=0.2, expect="fire").status == "pass"


def test_four_minutes_on_the_fallback_stays_quiet() -> None:
    events = _long_load((60.0, 300.0))
    assert judge("fallback_share_alert", events, max_share=0.2).status == "pass"
    fire = judge("fallback_share_alert", events, max_share=0.2, expect="fire")
    assert fire.status == "fail" and "would not fire" in fire.reason


def test_a_gap_in_traffic_longer_than_the_window_resets_the_stretch() -> None:
    events = [e for e in _long_load((60.0, 420.0)) if not 200 <= (e.get_int("i") or 0) < 300]
    result = judge("fallback_share_alert", events, max_share=0.2)
    assert result.status == "pass", result.reason  # 140 s + 120 s above the bound, never 300 s in a row


# ---------------------------------------------------------------------------------------------------------
# session_affinity


def test_sessions_follow_a_failed_replica_and_come_back_when_it_is_up() -> None:
    result = judge("session_affinity", StreamRun().events())
    assert result.status == "pass" and result.measured == 0.0
    assert any("back on primary" in line for line in result.evidence)


def test_sessions_scattered_across_healthy_replicas_are_named() -> None:
    result = judge("session_affinity", StreamRun(spread=True).events())
    assert result.status == "fail" and "s0" in result.reason
    assert any("primary -> primary-b" in line and "with no failure of primary" in line for line in result.evidence)


# ---------------------------------------------------------------------------------------------------------
# the timeline's ladder panel


def test_the_ladder_series_holds_the_rung_over_time() -> None:
    run = StreamRun(cache_from=7.0, routes=True)
    events = run.events()
    series = ladder_series(events, 0)
    assert series is not None
    assert series.rungs == ("primary", "small", "cache")
    steps = series.steps()
    assert [rung for _, rung in steps] == ["primary", "small", "cache", "primary"]
    assert steps[1][0] == pytest.approx(4.9, abs=0.31) and steps[3][0] == pytest.approx(run.back, abs=0.11)
    assert series.route_ys == [1, 2, 0]
    named = ladder_series(events, 0, Ladder.of([Rung(**r) for r in RUNGS]))
    assert named is not None and named.rungs == ("big", "small", "cached")


def test_the_timeline_draws_the_ladder_only_for_streams() -> None:
    streamed = StreamRun(duration=6.0, fault_at=2.0, back_at=3.0, hold=0.5)
    plain = streamed.but(stream=False)
    assert ladder_series(plain.events(), 0) is None
    with_ladder, without = plot_run_timeline(streamed.events()), plot_run_timeline(plain.events())
    assert with_ladder.startswith(PNG_SIGNATURE)
    assert png_size(with_ladder)[1] > png_size(without)[1]  # the ladder panel is there


def test_a_later_signal_does_not_excuse_a_move_away_from_a_rung_that_went_on_serving() -> None:
    # The cache and small alternate for 1 s (small healthy, answering), then small dies: its signal is within the
    # grace of the first move to the cache, but small served after that move, so the move was not for it.
    leaked = StreamRun(cache_from=7.0, leak=1.0)
    result = judge("fallback_ladder", leaked.events(), rungs=RUNGS)
    assert result.status == "fail", result
    assert "moved down small -> cached at +7" in result.reason and "while small went on serving" in result.reason
    assert judge("fallback_ladder", leaked.but(leak=0.0).events(), rungs=RUNGS).status == "pass"
