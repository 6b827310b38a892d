"""The serving checks on hand-made histories: pass on a good run, fail on a bad one, unknown without evidence.

A history here is a load generator's ``load.request`` events (a constant rate, each request's outcome a
function of its send time) plus the faults and serving-stack events a run would record around them.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

import chaos.checks.serving.verdicts as serving
from chaos.checks.base import CHECKS, CheckResult
from chaos.checks.serving.measures import backend_switches
from chaos.checks.serving.windows import Window, WindowParams, resolve_window
from chaos.history.timeline import Event, History
from chaos.spec.scenario import ScenarioError, parse_scenario
from chaos.spec.serving import ProbeSettings, ServingTarget

SECOND = 1_000_000_000
RATE = 50  # requests per second
KILL = "kill-primary"
Outcome = tuple[int | str, str | None]  # (status, backend)


def ev(t: float, kind: str, source: str = "target", rank: int | None = None, **data: Any) -> Event:
    return Event(ts_ns=round(t * SECOND), kind=kind, source=source, rank=rank, data=data)


def load(
    outcome: Callable[[float], Outcome],
    *,
    duration: float = 20.0,
    priority: Callable[[int], str | None] = lambda i: None,
    latency: Callable[[float], float] = lambda t: 0.01,
) -> list[Event]:
    """A constant-rate load from t=0: request i is sent at i/RATE; its outcome and latency depend on that time."""
    events = [ev(0.0, "load.start", "load", start_ns=0, duration_s=duration, rate=RATE)]
    for i in range(round(duration * RATE)):
        t = i / RATE
        status, backend = outcome(t)
        lat = 1.0 if status == "timeout" else latency(t)
        events.append(
            ev(
                t + lat,
                "load.request",
                "load",
                i=i,
                scheduled_ns=round(t * SECOND),
                latency_s=lat,
                status=status,
                backend=backend,
                degraded=backend == "cache",
                priority=priority(i),
                send_lag_s=0.0,
            )
        )
    events.append(ev(duration + 1.0, "load.end", "load", stopped_early=False))
    return events


def good(t: float) -> Outcome:
    """Primary killed at 5 s: one in-flight timeout, fallback from 5.02 s, primary again from 9.6 s."""
    if 5.0 <= t < 5.02:
        return "timeout", None
    return (200, "fallback") if 5.0 <= t < 9.6 else (200, "primary")


def no_fallback(t: float) -> Outcome:
    """The same kill with the fallback disabled: every request 503s until the primary is back."""
    return (503, "gateway") if 5.0 <= t < 9.6 else (200, "primary")


def kill_events() -> list[Event]:
    return [
        ev(4.9, "serving.ready", url="http://127.0.0.1:1/"),
        ev(5.0, "fault.applied", "runner", fault=KILL, op="op-1", injector="kill", host="local", duration_s=None),
        ev(5.1, "serving.replica_exit", "runner", replica="primary", code=-9),
        ev(6.6, "detect.backend_down", backend="primary", reason="health", failures=2),
        ev(7.0, "serving.replica_start", "runner", replica="primary", pid=4242, port=1, model="primary"),
        ev(9.5, "serving.backend_up", backend="primary", successes=2),
    ]


def target(**probes: Any) -> ServingTarget:
    settings_ = {"interval": 1.0, "timeout": 0.5, "failure_threshold": 2, "success_threshold": 2, **probes}
    return ServingTarget(type="serving", probes=ProbeSettings(**settings_))


def scenario(reference: bool = True, faults: tuple[tuple[str, float | None], ...] = ((KILL, None),)) -> Any:
    """A stand-in for a Scenario: the checks read only ``target`` and ``faults`` (name, duration)."""
    chosen = target() if reference else SimpleNamespace(type="http")
    return SimpleNamespace(name="t", target=chosen, faults=[SimpleNamespace(name=n, duration=d) for n, d in faults])


def judge(check: str, events: list[Event], scn: Any = None, **params: Any) -> CheckResult:
    spec = CHECKS[check]
    chosen = scenario() if scn is None else scn
    return spec.evaluate(History.from_events(events), spec.Params.model_validate(params), cast(Any, chosen))


GOOD = load(good) + kill_events()
BAD = load(no_fallback) + kill_events()
QUIET = load(lambda t: (200, "primary"))  # the fault never fired


# ---------------------------------------------------------------------------------------------------------
# registry and params


def test_every_serving_check_is_registered_with_documented_strict_params() -> None:
    for name in serving.SERVING_CHECKS:
        spec = CHECKS[name]
        assert spec.summary and spec.evaluate.__module__ == "chaos.checks.serving.verdicts"
        for field_name, field in spec.Params.model_json_schema().get("properties", {}).items():
            assert field.get("description"), (name, field_name)
        with pytest.raises(ValidationError):
            spec.Params.model_validate({"no_such_param": 1})


@pytest.mark.parametrize(
    ("check", "params"),
    [
        ("error_rate", {"max": 0.1, "window": "during"}),  # a fault-relative window without a fault
        ("error_rate", {"max": 1.5}),
        ("error_rate", {"max": 0.1, "fault": KILL, "until_backend": "primary"}),  # until_backend without until
        ("error_rate", {"max": 0.1, "start": "5s", "end": "2s"}),
        ("latency", {"q": 99, "max": "1s"}),  # q is a fraction
        ("fallback_share", {"fault": KILL, "min": 0.8, "max": 0.2}),
        ("failback_within", {"fault": KILL, "within": "5s", "since": "heal"}),  # not a reference point
        ("priority_preserved", {"shed_statuses": []}),
    ],
)
def test_bad_params_are_rejected(check: str, params: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        CHECKS[check].Params.model_validate(params)


SCENARIO_YAML = """
name: serving-kill
target: {type: serving}
faults:
  - {name: kill-primary, type: kill, params: {replica: primary}, trigger: {after: 5s}}
checks:
  - {type: error_rate, params: {fault: kill-primary, window: during, settle: 1s, until: serving.backend_up, max: 0.01}}
  - {type: error_rate, name: overall, params: {max: 0.02}}
  - {type: latency, params: {fault: kill-primary, window: after, settle: 2s, q: 0.99, max: 250ms}}
  - {type: failover_within, params: {fault: kill-primary}}
  - {type: fallback_share, params: {fault: kill-primary, until: serving.backend_up, min: 0.9}}
  - {type: failback_within, params: {fault: kill-primary, since: backend_up, within: 2s}}
  - {type: no_flapping, params: {max_switches: 2}}
  - {type: wrong_answers_detected, params: {fault: kill-primary, max_wrong: 100}}
  - {type: priority_preserved, params: {start: 10s, end: 15s, max_error_rate: 0}}
"""


def test_a_serving_scenario_parses_with_every_check() -> None:
    parsed = parse_scenario(SCENARIO_YAML)
    assert isinstance(parsed.target, ServingTarget)
    names = [c.name for c in parsed.checks]
    assert names[:2] == ["error_rate[kill-primary]", "overall"]
    assert {c.type for c in parsed.checks} == set(serving.SERVING_CHECKS)


def test_a_typo_in_serving_params_is_a_positioned_error() -> None:
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(SCENARIO_YAML.replace("min: 0.9", "minimum: 0.9"))
    assert ":11:" in str(caught.value) and "minimum" in str(caught.value)


# ---------------------------------------------------------------------------------------------------------
# windows


def test_windows_split_the_load_around_the_fault() -> None:
    history = History.from_events(GOOD)
    scn = scenario()

    def span(**params: Any) -> tuple[tuple[int, int], ...]:
        window = resolve_window(history, scn, WindowParams.model_validate(params))
        assert isinstance(window, Window), window
        return window.intervals

    assert span() == ((0, 20 * SECOND),)
    assert span(fault=KILL, window="before") == ((0, 5 * SECOND),)
    assert span(fault=KILL, until="serving.backend_up") == ((5 * SECOND, round(9.5 * SECOND)),)
    assert span(fault=KILL, window="after", until="serving.backend_up", settle=1) == (
        (round(10.5 * SECOND), 20 * SECOND),
    )
    assert span(start=10, end=12) == ((10 * SECOND, 12 * SECOND),)
    # the scenario's duration ends a fault that has no heal
    timed = scenario(faults=((KILL, 2.0),))
    assert resolve_window(history, timed, WindowParams(fault=KILL)) == Window(
        "during kill-primary (+5.000s..+7.000s)",
        ((5 * SECOND, 7 * SECOND),),
        ("load +0.000s..+20.000s", "fault.applied kill-primary (op op-1) at +5.000s; lasted its duration 2s"),
    )


def test_a_kill_without_heal_duration_or_until_has_no_during_window() -> None:
    result = judge("error_rate", GOOD, fault=KILL, max=0.1)
    assert result.status == "unknown" and "no known end" in result.reason and "until" in result.reason


def test_a_heal_ends_the_fault() -> None:
    events = [*GOOD, ev(8.0, "fault.healed", "runner", fault=KILL, op="op-1")]
    window = resolve_window(History.from_events(events), scenario(), WindowParams(fault=KILL))
    assert isinstance(window, Window) and window.intervals == ((5 * SECOND, 8 * SECOND),)


# ---------------------------------------------------------------------------------------------------------
# error_rate and latency


def test_error_rate_passes_with_fallback_and_fails_without() -> None:
    params = {"fault": KILL, "until": "serving.backend_up", "max": 0.01}
    ok = judge("error_rate", GOOD, **params)
    assert ok.status == "pass" and ok.measured == pytest.approx(1 / 225)  # one timeout in 4.5 s x 50/s
    bad = judge("error_rate", BAD, **params)
    assert bad.status == "fail" and bad.measured == 1.0
    assert any("503 via gateway" in line for line in bad.evidence)


def test_error_rate_is_unknown_when_the_fault_never_fired_or_the_window_is_empty() -> None:
    missing = judge("error_rate", QUIET, fault=KILL, max=0.1)
    assert missing.status == "unknown" and "never applied" in missing.reason
    empty = judge("error_rate", GOOD, start=30, end=40, max=0.1)
    assert empty.status == "unknown" and "no requests" in empty.reason
    nothing = judge("error_rate", kill_events(), max=0.1)
    assert nothing.status == "unknown" and "no load.request" in nothing.reason


def test_error_rate_of_one_priority() -> None:
    events = load(lambda t: (200, "primary"), priority=lambda i: "premium" if i % 2 else "free")
    events = [e if e.data.get("priority") == "premium" else _with(e, status=503, backend="gateway") for e in events]
    assert judge("error_rate", events, max=0.0, priority="premium").status == "pass"
    assert judge("error_rate", events, max=0.0, priority="free").measured == 1.0


def _with(event: Event, **data: Any) -> Event:
    return event.model_copy(update={"data": {**event.data, **data}})


def test_latency_counts_timeouts_at_the_timeout() -> None:
    params = {"fault": KILL, "window": "before", "q": 0.99, "max": "50ms"}
    assert judge("latency", GOOD, **params).status == "pass"
    during = judge("latency", GOOD, fault=KILL, until="serving.backend_up", q=1.0, max="50ms")
    assert during.status == "fail" and during.measured == 1.0  # the in-flight timeout
    slow = load(good, latency=lambda t: 0.4 if t > 12 else 0.01) + kill_events()
    after = judge("latency", slow, fault=KILL, window="after", until="serving.backend_up", q=0.5, max="100ms")
    assert after.status == "fail" and after.measured == pytest.approx(0.4)


# ---------------------------------------------------------------------------------------------------------
# failover_within and fallback_share


def test_failover_within_passes_on_the_good_run_with_the_reference_bound() -> None:
    result = judge("failover_within", GOOD, fault=KILL)
    assert result.status == "pass" and result.bound == "<= 3.5s"  # 1s x 2 + 0.5s + 1s
    assert result.measured == pytest.approx(0.02)


def test_failover_within_fails_without_a_fallback_and_names_what_clients_got() -> None:
    result = judge("failover_within", BAD, fault=KILL)
    assert result.status == "fail" and "no failover" in result.reason
    assert any("175 request(s) in the 3.5s after it: 503 x175" in line for line in result.evidence)


def test_failover_within_is_too_slow_and_honours_to() -> None:
    slow = load(lambda t: (503, "gateway") if 5 <= t < 9.0 else (200, "fallback" if 9 <= t < 12 else "primary"))
    result = judge("failover_within", slow + kill_events(), fault=KILL)
    assert result.status == "fail" and result.measured == pytest.approx(4.0)
    only_cache = judge("failover_within", GOOD, fault=KILL, to=["cache"])
    assert only_cache.status == "fail"


def test_failover_within_is_unknown_without_fault_or_bound() -> None:
    assert judge("failover_within", QUIET, fault=KILL).status == "unknown"
    foreign = judge("failover_within", GOOD, scenario(reference=False), fault=KILL)
    assert foreign.status == "unknown" and "within is not set" in foreign.reason
    assert judge("failover_within", GOOD, scenario(reference=False), fault=KILL, within="1s").status == "pass"


def test_fallback_share() -> None:
    unbounded = judge("fallback_share", GOOD, fault=KILL, until="serving.backend_up")
    assert unbounded.status == "unknown" and "give min, max" in unbounded.reason
    params = {"fault": KILL, "until": "serving.backend_up", "settle": 0.5}
    assert judge("fallback_share", GOOD, min=0.95, **params).status == "pass"
    assert judge("fallback_share", GOOD, fault=KILL, window="before", max=0.0).measured == 0.0
    bad = judge("fallback_share", BAD, min=0.95, **params)
    assert bad.status == "unknown" and "no ok request" in bad.reason  # nothing answered: nothing to share
    mixed = load(lambda t: (200, "primary") if t < 5 or int(t * RATE) % 2 else (200, "cache")) + kill_events()
    assert judge("fallback_share", mixed, max=0.2, **params).status == "fail"
    assert judge("fallback_share", mixed, to=["fallback"], max=0.0, **params).status == "pass"


# ---------------------------------------------------------------------------------------------------------
# failback_within and no_flapping


def test_failback_within_from_each_reference_point() -> None:
    since_up = judge("failback_within", GOOD, fault=KILL, since="backend_up", within="0.5s")
    assert since_up.status == "pass" and since_up.measured == pytest.approx(0.1)
    auto = judge("failback_within", GOOD, fault=KILL, within="2s")  # a kill has no end: the replica_start
    assert auto.status == "fail" and auto.measured == pytest.approx(2.6)
    assert any("replica_start" in line for line in auto.evidence)


def test_failback_within_fails_when_traffic_never_returns() -> None:
    stuck = load(lambda t: (200, "fallback") if t >= 5 else (200, "primary")) + kill_events()
    result = judge("failback_within", stuck, fault=KILL, since="backend_up", within="5s")
    assert result.status == "fail" and "no failback" in result.reason


def test_failback_within_ignores_a_stray_primary_answer() -> None:
    stray = load(lambda t: (200, "primary") if t < 5 or t >= 12 or abs(t - 10) < 0.01 else (200, "fallback"))
    result = judge("failback_within", stray + kill_events(), fault=KILL, since="backend_up", within="5s")
    assert result.measured == pytest.approx(2.5)


def test_failback_within_is_unknown_when_traffic_never_left_or_no_reference() -> None:
    steady = load(lambda t: (200, "primary")) + kill_events()
    never_left = judge("failback_within", steady, fault=KILL, since="backend_up", within="5s")
    assert never_left.status == "unknown" and "never left" in never_left.reason
    no_ref = judge("failback_within", load(good) + kill_events()[:2], fault=KILL, within="5s")
    assert no_ref.status == "unknown" and "no reference point" in no_ref.reason
    assert judge("failback_within", QUIET, fault=KILL, within="5s").status == "unknown"


def test_no_flapping_passes_over_and_back_and_ignores_transition_noise() -> None:
    # two primary answers amid the fallback run (in flight at some transition), after the hysteresis ended
    noisy = load(lambda t: (200, "primary") if 9.0 <= t < 9.04 else good(t)) + kill_events()
    result = judge("no_flapping", noisy)
    assert result.status == "pass" and result.measured == 2.0 and result.bound == "<= 2 switches"
    assert any("hysteresis 1s" in line for line in result.evidence)
    assert judge("no_flapping", noisy, min_run=1).measured == 4.0


def test_no_flapping_fails_on_flapping() -> None:
    flapping = load(lambda t: (200, "primary" if int(t) % 2 == 0 else "fallback")) + kill_events()
    result = judge("no_flapping", flapping)
    assert result.status == "fail" and result.measured == 19.0


def test_no_flapping_fails_when_failback_beats_the_hysteresis() -> None:
    early = load(lambda t: (200, "primary") if t < 5 or t >= 7.2 else (200, "fallback"))
    events = early + kill_events()
    result = judge("no_flapping", events)
    assert result.status == "fail" and "before the hysteresis" in result.reason
    # without the reference stack the hysteresis is not known and not checked
    assert judge("no_flapping", events, scenario(reference=False)).status == "pass"


def test_no_flapping_is_unknown_without_answers() -> None:
    down = load(lambda t: (503, "gateway"))
    assert judge("no_flapping", down).status == "unknown"


# ---------------------------------------------------------------------------------------------------------
# wrong_answers_detected


FLIP = "flip-primary"


def bitflip(detect_at: float | None, reason_event: str = "detect.wrong_answer") -> list[Event]:
    events = load(lambda t: (200, "primary") if detect_at is None or t < detect_at else (200, "fallback"))
    events.append(ev(5.0, "fault.applied", "target", rank=0, fault=FLIP, op="op-1", injector="weight_bitflip"))
    if detect_at is not None:
        if reason_event == "detect.wrong_answer":
            events.append(ev(detect_at, reason_event, backend="primary", max_abs_err=3.0, tolerance=1e-4))
        else:
            events.append(ev(detect_at, reason_event, backend="primary", reason="correctness", failures=1))
    return events


def test_wrong_answers_detected_counts_exposed_answers() -> None:
    scn = scenario(faults=((FLIP, None),))
    result = judge("wrong_answers_detected", bitflip(6.0), scn, fault=FLIP)
    assert result.status == "pass" and result.measured == 50.0  # 1 s x 50/s served by the corrupted primary
    assert result.bound == "detected within 10.5s"  # correctness.interval 5s x 2 + probes.timeout
    capped = judge("wrong_answers_detected", bitflip(6.0), scn, fault=FLIP, max_wrong=10)
    assert capped.status == "fail" and "over 10" in capped.reason
    by_down = judge("wrong_answers_detected", bitflip(6.0, "detect.backend_down"), scn, fault=FLIP)
    assert by_down.status == "pass"


def test_wrong_answers_detected_fails_when_late_or_never() -> None:
    scn = scenario(faults=((FLIP, None),))
    late = judge("wrong_answers_detected", bitflip(12.0), scn, fault=FLIP, within="2s")
    assert late.status == "fail" and late.measured == 350.0
    never = judge("wrong_answers_detected", bitflip(None), scn, fault=FLIP)
    assert never.status == "fail" and "no wrong-answer detection" in never.reason
    health_only = bitflip(None) + [ev(6.0, "detect.backend_down", backend="primary", reason="health", failures=3)]
    assert judge("wrong_answers_detected", health_only, scn, fault=FLIP).status == "fail"


def test_wrong_answers_detected_is_unknown_when_the_fault_did_not_fire() -> None:
    result = judge("wrong_answers_detected", QUIET, scenario(faults=((FLIP, None),)), fault=FLIP)
    assert result.status == "unknown" and "never applied" in result.reason
    foreign = judge("wrong_answers_detected", bitflip(6.0), scenario(reference=False), fault=FLIP)
    assert foreign.status == "unknown"


# ---------------------------------------------------------------------------------------------------------
# priority_preserved


def overload(premium_status: int = 200, shed: bool = True) -> list[Event]:
    def outcome_of(i: int) -> Outcome:
        t = i / RATE
        premium = i % 4 == 0
        if 10 <= t < 15 and premium:
            return premium_status, "primary" if premium_status == 200 else "gateway"
        if 10 <= t < 15 and shed and i % 2:
            return 503, "gateway"
        return 200, "primary"

    events = load(lambda t: (200, "primary"), priority=lambda i: "premium" if i % 4 == 0 else "free")
    out = []
    for e in events:
        index = e.get_int("i")
        if e.kind == "load.request" and index is not None:
            status, backend = outcome_of(index)
            e = _with(e, status=status, backend=backend)
        out.append(e)
    return out


def test_priority_preserved_passes_while_others_are_shed() -> None:
    result = judge("priority_preserved", overload(), start=10, end=15, max_error_rate=0)
    assert result.status == "pass" and result.measured == 0.0 and "shed" in result.reason


def test_priority_preserved_fails_when_premium_is_shed() -> None:
    result = judge("priority_preserved", overload(premium_status=503), start=10, end=15)
    assert result.status == "fail" and result.measured == 1.0


def test_priority_preserved_is_unknown_when_nothing_was_shed() -> None:
    result = judge("priority_preserved", overload(shed=False), start=10, end=15)
    assert result.status == "unknown" and "never forced a choice" in result.reason
    relaxed = judge("priority_preserved", overload(shed=False), start=10, end=15, require_shedding=False)
    assert relaxed.status == "pass"
    other = judge("priority_preserved", overload(), start=10, end=15, priority="gold")
    assert other.status == "unknown" and "no 'gold' requests" in other.reason


# ---------------------------------------------------------------------------------------------------------
# properties

STATUSES = st.sampled_from([200, 204, 302, 404, 500, 503, "timeout", "error", "dropped_client", "cancelled"])
BACKENDS = st.sampled_from(["primary", "fallback", "cache", None])


@st.composite
def random_load(draw: st.DrawFn) -> list[tuple[int | str, str | None]]:
    return draw(st.lists(st.tuples(STATUSES, BACKENDS), min_size=1, max_size=200))


def _events(outcomes: list[Outcome]) -> list[Event]:
    events = load(lambda t: (200, "primary"), duration=len(outcomes) / RATE)
    requests = [e for e in events if e.kind == "load.request"]
    rest = [e for e in events if e.kind != "load.request"]
    return rest + [_with(e, status=s, backend=b) for e, (s, b) in zip(requests, outcomes, strict=True)]


@settings(max_examples=60, deadline=None)
@given(random_load())
def test_error_rate_equals_the_brute_force_ratio(outcomes: list[Outcome]) -> None:
    result = judge("error_rate", _events(outcomes), max=1.0)
    bad = sum(not (isinstance(s, int) and 200 <= s < 400) for s, _ in outcomes)
    assert result.status == "pass" and result.measured == pytest.approx(bad / len(outcomes))


@settings(max_examples=60, deadline=None)
@given(random_load(), st.floats(0.0, 4.0), st.integers(0, 60))
def test_failover_time_is_never_negative_and_is_the_first_fallback_answer(
    outcomes: list[Outcome], applied_s: float, healthy_lead: int
) -> None:
    outcomes = [(200, "primary")] * healthy_lead + outcomes  # a primary serving everything, then anything
    events = [*_events(outcomes), ev(applied_s, "fault.applied", "runner", fault=KILL, op="op-1")]
    result = judge("failover_within", events, fault=KILL, within="1h")
    before = [
        b
        for i, (s, b) in enumerate(outcomes)
        # answered (sent + its 10 ms latency) at least PRE_FAULT_GUARD_S (1 s) before the apply
        if round(i / RATE * SECOND) + round(0.01 * SECOND) < round((applied_s - 1.0) * SECOND)
        and isinstance(s, int)
        and 200 <= s < 400
        and b
    ][-20:]
    if not before or 10 * before.count("primary") < 9 * len(before):
        # the primary did not serve the traffic just before the apply: a failover cannot be told
        assert result.status == "unknown" and result.measured is None
        return
    expected = next(
        (
            i / RATE - applied_s
            for i, (s, b) in enumerate(outcomes)
            if round(i / RATE * SECOND) >= round(applied_s * SECOND)
            and isinstance(s, int)
            and 200 <= s < 400
            and b not in (None, "primary")
        ),
        None,
    )
    if expected is None:
        assert result.status in ("fail", "unknown") and result.measured is None
    else:
        assert result.status == "pass" and isinstance(result.measured, float)
        assert result.measured >= 0 and result.measured == pytest.approx(expected, abs=1e-6)


@settings(max_examples=60, deadline=None)
@given(random_load(), st.integers(1, 5))
def test_switches_count_backend_changes_and_min_run_only_removes_some(outcomes: list[Outcome], min_run: int) -> None:
    events = [e for e in _events(outcomes) if e.kind == "load.request"]
    seq = [b for s, b in outcomes if b is not None and isinstance(s, int) and 200 <= s < 400]
    changes = sum(a != b for a, b in zip(seq, seq[1:], strict=False))
    assert len(backend_switches(events)) == changes
    filtered = backend_switches(events, min_run=min_run)
    assert len(filtered) <= changes
    assert all(s.before != s.after for s in filtered)
