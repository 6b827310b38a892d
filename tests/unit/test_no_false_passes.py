"""No false passes: checks that passed although the property they stand for did not hold.

Each test builds a history by hand in which the property is violated (or cannot be told) and pins that the
check no longer says ``pass``; a comment names the defect it pins. Healthy twins make sure the fix did not
turn a real pass into a fail.
"""

from __future__ import annotations

from typing import Any

from test_checks import ev
from test_checks import judge as judge_training
from test_serving_checks import KILL, good, judge, kill_events, load, scenario

from chaos.checks.serving.measures import backend_switches
from chaos.history.timeline import Event

FLIP = "flip-in-transit"


def sdc_run(**detection: Any) -> list[Event]:
    """A bit flip applied on rank 1 at step 15, and one ``detect.sdc`` reported by rank 1 in that step."""
    return [
        ev(1.0, "fault.applied", 1, fault=FLIP, op="op-1", step=15),
        ev(1.1, "detect.sdc", 1, detector="checksum", step=15, **detection),
    ]


# ---------------------------------------------------------------------------------------------------------
# sdc_detected


def test_sdc_culprit_fails_when_the_localization_names_nobody() -> None:
    # Defect: a checksum detection whose localization named nobody (culprit_rank null) was blamed on the
    # rank that reported it, which is the faulted rank, so "culprit named" passed with no culprit at all.
    result = judge_training("sdc_detected", sdc_run(culprit_rank=None), fault=FLIP)
    assert result.status == "fail" and "nobody" in result.reason


def test_sdc_culprit_fails_when_a_localization_names_another_rank() -> None:
    # Defect: one detection blaming the faulted rank (by reporting on it, without localization) was enough
    # although another detection's localization named a different rank.
    events = [*sdc_run(), ev(1.1, "detect.sdc", 0, detector="checksum", step=15, culprit_rank=0)]
    result = judge_training("sdc_detected", events, fault=FLIP)
    assert result.status == "fail" and "rank 0" in result.reason


def test_sdc_culprit_passes_when_the_faulted_rank_is_named() -> None:
    assert judge_training("sdc_detected", sdc_run(culprit_rank=1), fault=FLIP).status == "pass"
    # a detector that does not localize (no culprit_rank) blames the rank it reports on, as before
    anomaly = [ev(1.0, "fault.applied", 1, fault=FLIP, op="op-1", step=15), ev(1.1, "detect.sdc", 1, step=15)]
    assert judge_training("sdc_detected", anomaly, fault=FLIP).status == "pass"


# ---------------------------------------------------------------------------------------------------------
# failover_within


def test_failover_is_unknown_when_traffic_was_spread_before_the_fault() -> None:
    # Defect: a load balancer spreading requests over primary and fallback "failed over" with the first
    # request after the apply (0.02 s here): a pass although nothing moved because of the fault.
    spread = load(lambda t: (200, "primary" if round(t * 50) % 2 == 0 else "fallback")) + kill_events()
    result = judge("failover_within", spread, fault=KILL)
    assert result.status == "unknown" and "normal spreading" in result.reason and "50%" in result.reason


def test_failover_still_passes_when_the_primary_served_everything_before() -> None:
    result = judge("failover_within", load(good) + kill_events(), fault=KILL)
    assert result.status == "pass"


# ---------------------------------------------------------------------------------------------------------
# no_flapping


def test_no_flapping_fails_on_request_by_request_alternation() -> None:
    # Defect: runs shorter than min_run were all dropped, so traffic alternating one request each way
    # (every run of length 1) counted 0 switches and passed.
    alternating = load(lambda t: (200, "primary" if round(t * 50) % 2 == 0 else "fallback")) + kill_events()
    # not the reference stack: the hysteresis is not checked, the switch count alone must fail it
    result = judge("no_flapping", alternating, scenario(reference=False))
    assert result.status == "fail" and result.measured is not None and result.measured > 100
    assert "backend switches" in result.reason


def test_short_interleaving_at_a_transition_is_still_noise() -> None:
    # one failover and one failback, each with a few interleaved in-flight answers: 2 switches
    seq = ["primary"] * 10 + ["fallback", "primary", "fallback"] + ["fallback"] * 10 + ["primary", "fallback"]
    seq += ["primary"] * 10
    reqs = [
        ev(i / 50, "load.request", i=i, scheduled_ns=i * 20_000_000, status=200, backend=b) for i, b in enumerate(seq)
    ]
    switches = backend_switches(reqs, min_run=3)
    assert [(s.before, s.after) for s in switches] == [("primary", "fallback"), ("fallback", "primary")]
