"""ETTR: the analytical model against published vectors and its monotonicity, goodput on hand-made and simulated
histories, and ``mlchaos ettr`` through typer's CliRunner."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from test_checks import ev, kill, killed_run, restart, start, steps
from test_checks_properties import Run, runs
from typer.testing import CliRunner

from chaos.analysis.ettr import (
    RSC1_FAILURES_PER_NODE_DAY,
    EttrModel,
    eq2_best_interval,
    ettr_for_job_rate,
    expected_ettr,
    goodput,
    nodes_for_gpus,
    optimal_checkpoint_interval,
    predict_for,
)
from chaos.cli.commands import app
from chaos.history.timeline import Event, History, write_jsonl

MINUTE = 60.0
FIVE_MIN = 5 * MINUTE
FAST = settings(max_examples=200, deadline=None)


def model_for(
    gpus: int, *, rate: float = RSC1_FAILURES_PER_NODE_DAY, u0: float = FIVE_MIN, w: float = FIVE_MIN
) -> EttrModel:
    return expected_ettr(nodes_for_gpus(gpus, 8), rate, u0, w)


# ---------------------------------------------------------------------------------------------------------
# the model: published vectors (Kokolis et al.; 8 GPUs per node, u0 = w = 5 min, r_f per 1000 node-days)


def test_12288_gpus_optimal_interval_is_38_minutes_and_ettr_074() -> None:
    assert nodes_for_gpus(12_288) == 1_536
    dt_star = optimal_checkpoint_interval(1_536, 6.5 / 1000, FIVE_MIN)
    assert round(dt_star / MINUTE) == 38
    assert dt_star == pytest.approx(37.98 * MINUTE, abs=1.0)
    result = model_for(12_288)
    assert result.interval_s == dt_star and result.optimal_interval_s == dt_star
    assert round(result.ettr, 2) == 0.74
    assert result.nodes == 1_536 and result.failure_rate_per_node_day == 6.5 / 1000


@pytest.mark.parametrize(
    ("gpus", "rate", "w", "published"),
    [
        (12_288, 6.5e-3, FIVE_MIN, 0.74),
        (4_096, 6.5e-3, FIVE_MIN, 0.85),
        (2_048, 6.5e-3, FIVE_MIN, 0.89),
        (12_288, 6.5e-3, 10.0, 0.92),  # FIELD-NOTES: faster checkpoint writes
        (12_288, 1e-3, FIVE_MIN, 0.90),  # FIELD-NOTES: a more reliable cluster
        (12_000, 6.5e-3, FIVE_MIN, 0.74),  # FIELD-NOTES writes "12k GPUs": that reading rounds the same
    ],
)
def test_published_vectors_to_two_decimals(gpus: int, rate: float, w: float, published: float) -> None:
    assert round(model_for(gpus, rate=rate, w=w).ettr, 2) == published


def test_textbook_young_daly_worked_example() -> None:
    # 37 s write, MTBF 13,284 s -> tau = sqrt(2 * 37 * 13284) = 991 s (FIELD-NOTES, textbook chapter).
    assert ettr_for_job_rate(1 / 13_284, 0.0, 37.0).interval_s == pytest.approx(991, abs=1)


def test_eq2_peaks_a_little_below_daly_young() -> None:
    lam = model_for(12_288).job_failure_rate_per_s
    best = eq2_best_interval(lam, FIVE_MIN, FIVE_MIN)
    assert best / MINUTE == pytest.approx(32.6, abs=0.1)
    at_best = ettr_for_job_rate(lam, FIVE_MIN, FIVE_MIN, best).ettr
    assert round(at_best, 2) == 0.74 and at_best > model_for(12_288).ettr
    for nudge in (0.99, 1.01):
        assert ettr_for_job_rate(lam, FIVE_MIN, FIVE_MIN, best * nudge).ettr < at_best


def test_zero_write_time_means_checkpoint_continuously() -> None:
    result = model_for(12_288, w=0.0)
    assert result.interval_s == 0.0
    assert result.ettr == pytest.approx(1 - result.job_failure_rate_per_s * FIVE_MIN)


def test_no_failures_leaves_only_the_checkpoint_overhead() -> None:
    result = expected_ettr(10, 0.0, FIVE_MIN, FIVE_MIN, 3_600.0)
    assert result.ettr == pytest.approx(1 / (1 + 300 / 3_600)) and math.isinf(result.mtbf_s)
    with pytest.raises(ValueError, match="unbounded"):
        expected_ettr(10, 0.0, FIVE_MIN, FIVE_MIN)


def test_nodes_round_up() -> None:
    assert nodes_for_gpus(9, 8) == 2 and nodes_for_gpus(8, 8) == 1 and nodes_for_gpus(1, 8) == 1
    with pytest.raises(ValueError, match="gpus"):
        nodes_for_gpus(0)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0, 6.5e-3, 300.0, 300.0, None), "nodes"),
        ((8, -1.0, 300.0, 300.0, None), "failure rate"),
        ((8, math.nan, 300.0, 300.0, None), "failure rate"),
        ((8, 6.5e-3, -1.0, 300.0, None), "restart overhead"),
        ((8, 6.5e-3, 300.0, -1.0, None), "checkpoint write"),
        ((8, 6.5e-3, 300.0, 300.0, 0.0), "interval"),
        ((8, 6.5e-3, 300.0, 300.0, math.inf), "interval"),
    ],
)
def test_bad_inputs_are_clear_value_errors(args: tuple[int, float, float, float, float | None], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        expected_ettr(*args)


def test_a_scale_with_no_progress_says_so() -> None:
    with pytest.raises(ValueError, match="cannot make progress at this scale"):
        expected_ettr(nodes_for_gpus(131_072), 6.5e-3, 30 * MINUTE, FIVE_MIN)


# ---------------------------------------------------------------------------------------------------------
# the model: properties

nodes_st = st.integers(1, 50_000)
rate_st = st.floats(1e-5, 0.05)
time_st = st.floats(1.0, 3_600.0)


def _ettr(nodes: int, rate: float, u0: float, w: float, interval: float | None = None) -> float:
    try:
        return expected_ettr(nodes, rate, u0, w, interval).ettr
    except ValueError:
        assume(False)  # no progress at all: nothing to compare
        raise AssertionError("unreachable") from None


@FAST
@given(nodes_st, nodes_st, rate_st, time_st, time_st, st.one_of(st.none(), time_st))
def test_ettr_falls_as_nodes_grow(a: int, b: int, rate: float, u0: float, w: float, interval: float | None) -> None:
    small, large = sorted((a, b))
    assert _ettr(large, rate, u0, w, interval) <= _ettr(small, rate, u0, w, interval) + 1e-12


@FAST
@given(nodes_st, rate_st, rate_st, time_st, time_st, st.one_of(st.none(), time_st))
def test_ettr_falls_as_failure_rate_grows(
    nodes: int, a: float, b: float, u0: float, w: float, interval: float | None
) -> None:
    low, high = sorted((a, b))
    assert _ettr(nodes, high, u0, w, interval) <= _ettr(nodes, low, u0, w, interval) + 1e-12


@FAST
@given(nodes_st, rate_st, time_st, time_st)
def test_daly_young_beats_twice_the_interval(nodes: int, rate: float, u0: float, w: float) -> None:
    optimum = _ettr(nodes, rate, u0, w)
    try:
        doubled = expected_ettr(nodes, rate, u0, w, 2 * optimal_checkpoint_interval(nodes, rate, w)).ettr
    except ValueError:
        return  # twice the interval makes no progress at all: the optimum is trivially better
    assert optimum >= doubled - 1e-12


@FAST
@given(nodes_st, rate_st, time_st, time_st)
def test_daly_young_beats_half_the_interval_in_the_models_regime(nodes: int, rate: float, u0: float, w: float) -> None:
    """Δt* beats Δt*/2 under Eq. 2 exactly when 1 − λu0 >= 1/2 + 3/2 sqrt(λw/2) (algebra on Eq. 2 with
    s = λΔt*/2 = w/Δt*): always where failures cost under ~a quarter of the time, the regime the first-order
    model is meant for; past it Eq. 2's own peak has moved far enough below Δt* that half of it wins."""
    _ettr(nodes, rate, u0, w)  # skips scales with no progress
    result = expected_ettr(nodes, rate, u0, w)
    lam, s = result.job_failure_rate_per_s, math.sqrt(result.job_failure_rate_per_s * w / 2)
    halved = _ettr(nodes, rate, u0, w, result.interval_s / 2)
    if 1 - lam * u0 >= 0.5 + 1.5 * s + 1e-9:
        assert result.ettr >= halved - 1e-12
    elif 1 - lam * u0 <= 0.5 + 1.5 * s - 1e-9:
        assert result.ettr <= halved + 1e-12
    if result.failure_loss <= 0.25:
        assert result.ettr >= halved - 1e-12


def test_half_the_daly_young_interval_wins_where_restarts_eat_half_the_time() -> None:
    # 1000 nodes at 10 per 1000 node-days, u0 = 1 h, w = 1 min: λu0 = 0.42, so 1 − λu0 < 1/2 + 3/2 sqrt(λw/2).
    optimum = expected_ettr(1_000, 0.01, 3_600.0, 60.0)
    assert expected_ettr(1_000, 0.01, 3_600.0, 60.0, optimum.interval_s / 2).ettr > optimum.ettr


@FAST
@given(nodes_st, rate_st, time_st, time_st, st.floats(0.1, 10.0))
def test_eq2_best_interval_is_at_least_as_good_as_any(
    nodes: int, rate: float, u0: float, w: float, factor: float
) -> None:
    lam = expected_ettr(nodes, rate, 0.0, w, 1.0).job_failure_rate_per_s
    assume(lam * u0 < 1)
    best = eq2_best_interval(lam, u0, w)
    peak = _ettr(nodes, rate, u0, w, best)
    assert peak >= _ettr(nodes, rate, u0, w, best * factor) - 1e-12
    assert best <= optimal_checkpoint_interval(nodes, rate, w) + 1e-9


# ---------------------------------------------------------------------------------------------------------
# goodput on hand-made histories (test_checks' builders: 1 s per step, steps on ranks 0 and 1)


def test_no_fault_run_is_all_steps_but_start_up_and_teardown() -> None:
    events = [
        *start(),
        *steps(1, 20, t0=1.0),
        ev(20.5, "target.digest", 0, digest="ab", step=20),
        ev(21.0, "target.exit", code=0),
    ]
    result = goodput(History.from_events(events))
    assert result.wall_s == pytest.approx(20.9)  # first target.start (0.1) to target.exit (21.0)
    assert result.productive_s == pytest.approx(19.0)  # 19 measured intervals; step 1's compute is start-up
    # ETTR ≈ steps x step time / wall, short by the one step whose start no report marks.
    assert result.ettr == pytest.approx(19 / 20.9) and 20 / 20.9 - result.ettr == pytest.approx(1 / 20.9)
    assert (result.recomputed_s, result.restart_s, result.checkpoint_s) == (0.0, 0.0, 0.0)
    assert result.other_s == pytest.approx(1.9)
    assert (result.committed_steps, result.recomputed_steps, result.restarts) == (20, 0, 0)
    assert result.step_s == pytest.approx(1.0) and result.notes == ()
    assert predict_for(result).model is None  # no checkpoint: the interval is unknown


def five_recomputed() -> list[Event]:
    """Steps 1..10, checkpoint 5, kill at 10.5, restart resuming at 5 (steps 6..10 redone), steps 6..15 from 15."""
    return [
        *start(),
        *steps(1, 10, t0=1.0),
        ev(5.05, "target.checkpoint", 0, step=5, path="/ckpt/step5", attempt=0),
        kill(10.5),
        *restart(12.0, 1, 5),
        *steps(6, 15, t0=15.0, attempt=1),
        ev(24.5, "target.digest", 0, digest="ab", step=15, attempt=1),
        ev(25.0, "target.exit", code=0),
    ]


def test_kill_with_five_recomputed_steps() -> None:
    result = goodput(History.from_events(five_recomputed()))
    assert result.recomputed_steps == 5 and result.recomputed_s == pytest.approx(5.0)  # attempt 0's 6..10
    assert result.restart_s == pytest.approx(5.0)  # last step before (10.0) to first after (15.0)
    assert result.productive_s == pytest.approx(4.0 + 9.0)  # steps 2..5, then 7..15
    assert result.committed_steps == 15 and result.restarts == 1
    assert result.wall_s == pytest.approx(24.9)
    parts = result.productive_s + result.recomputed_s + result.restart_s + result.checkpoint_s + result.other_s
    assert parts == pytest.approx(result.wall_s)
    assert result.ettr == pytest.approx(13.0 / 24.9)
    assert result.training_ettr == pytest.approx(13.0 / 23.0)  # without start-up (0.9 s) and teardown (1 s)
    assert any("carry no duration" in note and "estimated as 0" in note for note in result.notes)
    assert any("0.05s in all" in note for note in result.notes)  # step 5 at 5.0, its checkpoint at 5.05


def test_killed_run_prediction_uses_the_runs_own_numbers() -> None:
    result = goodput(History.from_events(killed_run()))
    assert (result.recomputed_steps, result.restart_s, result.checkpoint_interval_steps) == (2, 10.0, 8)
    prediction = predict_for(result)
    assert prediction.model is not None
    assert prediction.model.interval_s == pytest.approx(8.0)  # checkpoint every 8 steps x 1 s
    assert prediction.model.restart_overhead_s == pytest.approx(10.0)
    assert result.training_s == pytest.approx(25.0)  # first step (1.0) to last (26.0)
    assert prediction.model.job_failure_rate_per_s == pytest.approx(1 / 25.0)
    # Eq. 2 on the run's own numbers lands near what the run measured between its first and last step.
    assert prediction.model.ettr == pytest.approx(1 - (10 + 4) / 25)
    assert result.training_ettr == pytest.approx(13 / 25)
    assert "1 restart" in prediction.reason


def test_timed_checkpoints_move_their_write_out_of_step_time() -> None:
    events = [
        *start(),
        *steps(1, 10, t0=1.0),
        ev(5.0, "target.checkpoint", 0, step=4, path="/c4", duration_s=0.5),
        ev(5.0, "target.checkpoint", 1, step=4, path="/c4", duration_s=0.25),  # same checkpoint, other rank
        ev(9.0, "target.checkpoint", 0, step=8, path="/c8", write_s=0.5),
        ev(11.0, "target.exit", code=0),
    ]
    result = goodput(History.from_events(events))
    assert result.checkpoints == 2 and result.checkpoints_timed == 2
    assert result.checkpoint_s == pytest.approx(1.0)
    assert result.productive_s == pytest.approx(9.0 - 1.0)
    assert result.notes == ()


def test_missing_window_ends_fall_back_to_steps_with_a_note() -> None:
    result = goodput(History.from_events(steps(1, 5, t0=1.0)))
    assert result.wall_s == pytest.approx(4.0) and result.ettr == pytest.approx(1.0)
    assert len(result.notes) == 2


def test_no_steps_is_an_error() -> None:
    with pytest.raises(ValueError, match="no target.step"):
        goodput(History.from_events(start()))


@settings(max_examples=100, deadline=None)
@given(runs())
def test_goodput_accounts_for_every_second_of_simulated_runs(run: Run) -> None:
    result = goodput(History.from_events(run.events))
    parts = result.productive_s + result.recomputed_s + result.restart_s + result.checkpoint_s + result.other_s
    assert parts == pytest.approx(result.wall_s, abs=1e-9)
    assert result.committed_steps == run.total
    reports = sum(1 for e in run.events if e.kind == "target.step" and e.rank == 0)
    assert result.recomputed_steps == reports - run.total
    assert result.restarts == run.kills
    assert 0.0 <= result.ettr <= 1.0


# ---------------------------------------------------------------------------------------------------------
# the CLI


cli = CliRunner()


def test_cli_model_prints_the_optimum_and_a_given_interval() -> None:
    result = cli.invoke(app, ["ettr", "model", "--gpus", "12288", "--interval", "30m"])
    assert result.exit_code == 0, result.output
    assert "1536 nodes" in result.stdout
    assert "37m58.7s" in result.stdout and "0.737" in result.stdout  # Δt* and E[ETTR] there
    assert "30m00.0s" in result.stdout and "0.738" in result.stdout  # the given interval


def test_cli_model_options_take_units_and_rates() -> None:
    result = cli.invoke(
        app,
        [
            "ettr",
            "model",
            "--gpus",
            "4096",
            "--gpus-per-node",
            "8",
            "--rate",
            "6.5e-3",
            "--u0",
            "5m",
            "--checkpoint-write",
            "300s",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "0.848" in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rate", "lots"], "not a failure rate"),
        (["--rate", "1/0"], "not a failure rate"),
        (["--u0", "5 minutes"], "not a duration"),
        (["--gpus", "131072", "--u0", "30m"], "cannot make progress"),
        (["--rate", "0"], "give --interval"),
    ],
)
def test_cli_model_bad_input_exits_2(args: list[str], message: str) -> None:
    base = ["ettr", "model"] + ([] if "--gpus" in args else ["--gpus", "12288"])
    result = cli.invoke(app, base + args)
    assert result.exit_code == 2
    assert message in result.output


def test_cli_run_prints_the_breakdown(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "history.jsonl", five_recomputed())
    result = cli.invoke(app, ["ettr", "run", str(tmp_path)])
    assert result.exit_code == 0, result.output
    for text in ("productive steps", "13.00s", "recomputed steps", "5 steps", "restart downtime", "1 restarts"):
        assert text in result.stdout, text
    assert "measured ETTR = productive / wall = 0.522" in result.stdout
    assert "productive / (first step to last) = 0.565" in result.stdout
    # No scenario inputs, no prediction: the run's own numbers are not one.
    assert "prediction: none" in result.stdout and "E[ETTR]" not in result.stdout
    assert "estimated as 0" in result.stdout


@pytest.mark.parametrize("make", ["missing", "empty"])
def test_cli_run_without_a_history_exits_2(tmp_path: Path, make: str) -> None:
    target = tmp_path / "nope" if make == "missing" else tmp_path
    result = cli.invoke(app, ["ettr", "run", str(target)])
    assert result.exit_code == 2
    assert ("no such run folder" if make == "missing" else "no history.jsonl") in result.output


def test_cli_run_without_steps_exits_2(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "history.jsonl", start())
    result = cli.invoke(app, ["ettr", "run", str(tmp_path)])
    assert result.exit_code == 2 and "no target.step" in result.output
