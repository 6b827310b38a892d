"""ETTR from Slurm's record (chaos.slurm.accounting) and Eq. 2 fed only scenario inputs
(chaos.analysis.ettr_inputs): jobcomp lines as slurmctld 22.05 writes them, slurm.job events of the target's
contract, sacct rows, the Q/R/U split with and without the job's checkpoint events, the published test
vectors through the scenario-input path, time compression, and ``mlchaos ettr slurm`` / ``run``."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from chaos.analysis.ettr_inputs import ScenarioInputs, parse_compression, predict, rate_for_mtbf
from chaos.cli.commands import app
from chaos.history.timeline import Event
from chaos.slurm.accounting import (
    attempts_from_events,
    attempts_from_sacct,
    breakdown,
    parse_jobcomp,
)
from chaos.slurm.client import parse_accounting

cli = CliRunner()
T0 = datetime.fromisoformat("2026-11-24T22:23:37").astimezone().timestamp()


def _iso(offset: float) -> str:
    return datetime.fromtimestamp(T0 + offset).astimezone().strftime("%Y-%m-%dT%H:%M:%S")


def jobcomp_line(job: int, state: str, submit: float, eligible: float, start: float, end: float, code: str) -> str:
    """One line as jobcomp/filetxt writes it (slurmctld 22.05, captured on the testbed, times replaced)."""
    return (
        f"JobId={job} UserId=root(0) GroupId=root(0) Name=rq.sh JobState={state} Partition=chaos TimeLimit=525600 "
        f"StartTime={_iso(start)} EndTime={_iso(end)} NodeList=h1 NodeCnt=1 ProcCnt=1 WorkDir=/tmp/c5 "
        "ReservationName= Tres=cpu=1,mem=1M,node=1,billing=1 Account= QOS= WcKey= Cluster=unknown "
        f"SubmitTime={_iso(submit)} EligibleTime={_iso(eligible)} DerivedExitCode=0:0 ExitCode={code} "
    )


# A job requeued twice (RequeueExit=75): submitted at 0, first attempt 2-40, requeued at 40, eligible at 46
# (cred_expire + 1), started 47; second attempt 47-80; third 87-120 completes.
LOG = "\n".join(
    [
        jobcomp_line(1, "FAILED", 0, 0, 2, 40, "75:0"),
        jobcomp_line(9, "COMPLETED", 1, 1, 3, 5, "0:0"),  # another job in the same log
        jobcomp_line(1, "FAILED", 40, 46, 47, 80, "75:0"),
        jobcomp_line(1, "COMPLETED", 80, 86, 87, 120, "0:0"),
    ]
)


def ev(t: float, kind: str, **data: object) -> Event:
    return Event(ts_ns=round((T0 + t) * 1e9), kind=kind, source="target", rank=0, data=data)


def progress() -> list[Event]:
    """The job's own events: start-up of 1 s per attempt, a 1 s checkpoint write every 10 s of training."""
    out = [ev(3, "target.start", attempt=0), ev(13, "target.checkpoint", step=10, attempt=0, duration_s=1.0)]
    out += [ev(24, "target.checkpoint", step=20, attempt=0, duration_s=1.0)]  # then killed at 40: 16 s lost
    out += [ev(48, "target.start", attempt=1), ev(48.5, "target.resume", step=20, attempt=1)]
    out += [ev(59.5, "target.checkpoint", step=30, attempt=1, duration_s=1.0)]  # killed at 80: 20.5 s lost
    out += [
        ev(88, "target.resume", step=30, attempt=2),
        ev(99, "target.checkpoint", step=40, attempt=2, duration_s=1.0),
    ]
    return out


def test_jobcomp_lines_become_one_attempt_each_in_order() -> None:
    attempts = parse_jobcomp(LOG, 1)
    assert [(a.index, a.state, a.exit_code, a.nodes) for a in attempts] == [
        (0, "FAILED", "75:0", ("h1",)),
        (1, "FAILED", "75:0", ("h1",)),
        (2, "COMPLETED", "0:0", ("h1",)),
    ]
    assert attempts[1].start - T0 == 47 and attempts[1].eligible is not None and attempts[1].eligible - T0 == 46
    assert {a.job_id for a in parse_jobcomp(LOG)} == {1, 9}


def test_split_with_checkpoint_events_counts_every_second_once() -> None:
    measured = breakdown(parse_jobcomp(LOG, 1), progress())
    assert measured.wall_s == pytest.approx(120)
    assert measured.q_s + measured.r_s + measured.u_s == pytest.approx(measured.wall_s)
    # Q: submit -> first start (2 s), eligible -> start after each requeue (1 s each).
    assert measured.q_s == pytest.approx(4)
    parts = measured.u_parts()
    assert parts["restart"] == pytest.approx(12)  # two requeue holds of 6 s
    assert parts["startup"] == pytest.approx(1 + 1.5 + 1)  # start -> target.start / target.resume
    assert parts["checkpoint"] == pytest.approx(4)
    assert parts["lost"] == pytest.approx(16 + 20.5)  # end - last checkpoint of each failed attempt
    assert measured.r_s == pytest.approx(120 - 4 - 12 - 3.5 - 4 - 36.5)
    assert measured.failures == 2
    assert measured.mean_restart_s == pytest.approx((1 + 6 + 1.5 + 1 + 6 + 1) / 2)
    assert measured.ettr == pytest.approx(measured.r_s / 120)


def test_lost_work_grows_when_the_checkpoint_is_older() -> None:
    """The property the split must hold: a failed attempt loses exactly what it did after its last checkpoint."""
    recent = breakdown(parse_jobcomp(LOG, 1), progress())
    older = [e for e in progress() if not (e.kind == "target.checkpoint" and e.data.get("step") == 20)]
    stale = breakdown(parse_jobcomp(LOG, 1), older)
    assert stale.u_parts()["lost"] - recent.u_parts()["lost"] == pytest.approx(11)  # 24 -> 13
    assert stale.ettr < recent.ettr


def test_without_progress_events_a_failed_attempt_is_all_lost_and_says_so() -> None:
    measured = breakdown(parse_jobcomp(LOG, 1))
    assert measured.u_parts()["lost"] == pytest.approx(38 + 33)
    assert measured.r_s == pytest.approx(33)
    assert any("no progress events" in note for note in measured.notes)


def test_events_without_an_attempt_field_are_matched_by_time() -> None:
    stripped = [
        Event(ts_ns=e.ts_ns, kind=e.kind, rank=0, data={k: v for k, v in e.data.items() if k != "attempt"})
        for e in progress()
    ]
    assert breakdown(parse_jobcomp(LOG, 1), stripped).r_s == pytest.approx(
        breakdown(parse_jobcomp(LOG, 1), progress()).r_s
    )


def slurm_job(t: float, state: str, restarts: int = 0, nodes: tuple[str, ...] = ()) -> Event:
    data: dict[str, object] = {"job_id": 1, "state": state, "reason": None, "nodes": list(nodes)}
    data |= {"restarts": restarts, "exit_code": None}
    return Event(ts_ns=round((T0 + t) * 1e9), kind="slurm.job", source="slurm", data=data)


def test_slurm_job_events_give_the_same_attempts_as_the_log() -> None:
    history = [
        slurm_job(0, "PENDING"),
        slurm_job(2, "RUNNING", 0, ("h1",)),
        slurm_job(40, "REQUEUED", 0),
        slurm_job(41, "PENDING", 1),
        slurm_job(47, "RUNNING", 1, ("h2",)),
        slurm_job(80, "REQUEUED", 1),
        slurm_job(87, "RUNNING", 2, ("h1",)),
        slurm_job(120, "COMPLETED", 2, ("h1",)),
    ]
    attempts = attempts_from_events(history)
    assert [(a.index, a.state, a.nodes, a.start - T0, a.end - T0) for a in attempts] == [
        (0, "REQUEUED", ("h1",), 2, 40),
        (1, "REQUEUED", ("h2",), 47, 80),
        (2, "COMPLETED", ("h1",), 87, 120),
    ]
    from_events = breakdown(attempts, progress())
    from_log = breakdown(parse_jobcomp(LOG, 1), progress())
    # The events carry no eligible time: the hold and the queue wait both count as restart (U); the sum agrees.
    assert from_events.r_s == pytest.approx(from_log.r_s)
    assert from_events.wall_s == pytest.approx(from_log.wall_s)
    assert from_events.failures == 2


def test_sacct_rows_number_the_attempts() -> None:
    rows = [
        parse_accounting(f"1|rq.sh|FAILED|75:0|h1|{_iso(2)}|{_iso(2)}|{_iso(40)}"),
        parse_accounting(f"1|rq.sh|COMPLETED|0:0|h1|{_iso(47)}|{_iso(47)}|{_iso(80)}"),
    ]
    attempts = attempts_from_sacct(rows)
    assert [(a.index, a.state, a.exit_code) for a in attempts] == [(0, "FAILED", "75:0"), (1, "COMPLETED", "0:0")]
    assert breakdown(attempts).wall_s == pytest.approx(78)


def test_bad_records_are_refused() -> None:
    with pytest.raises(ValueError, match="no attempt"):
        breakdown([])
    with pytest.raises(ValueError, match="several jobs"):
        breakdown(parse_jobcomp(LOG))


# ---------------------------------------------------------------------------------------------------------
# the model side: scenario inputs only


@pytest.mark.parametrize(
    ("gpus", "rate", "w", "published"),
    [
        (12_288, 6.5e-3, 300, 0.74),
        (12_288, 6.5e-3, 10, 0.92),
        (12_288, 1e-3, 300, 0.90),
        (4096, 6.5e-3, 300, 0.85),
        (2048, 6.5e-3, 300, 0.89),
    ],
)
def test_scenario_inputs_reproduce_the_field_notes_vectors(gpus: int, rate: float, w: float, published: float) -> None:
    prediction = predict(ScenarioInputs(gpus // 8, rate, 300.0, w))
    assert round(prediction.ettr, 2) == published
    if (gpus, rate, w) == (12_288, 6.5e-3, 300):
        assert prediction.model.interval_s / 60 == pytest.approx(38.0, abs=0.05)


@pytest.mark.parametrize("c", [1.0, 60.0, 3600.0])
def test_compression_moves_the_schedule_not_the_prediction(c: float) -> None:
    base = predict(ScenarioInputs(3072, 6.5e-3, 480.0, 30.0))
    squeezed = predict(ScenarioInputs(3072, 6.5e-3, 480.0, 30.0, compression=c))
    assert squeezed.ettr == pytest.approx(base.ettr)
    assert squeezed.run.mtbf_s == pytest.approx(base.model.mtbf_s / c)
    assert squeezed.run.interval_s * c == pytest.approx(base.model.interval_s)
    assert rate_for_mtbf(3072, squeezed.run.mtbf_s, c) == pytest.approx(6.5e-3)


def test_compression_syntax() -> None:
    assert parse_compression("60") == parse_compression("60x") == parse_compression("1s=1m") == 60.0
    with pytest.raises(ValueError, match="time compression"):
        parse_compression("fast")


# ---------------------------------------------------------------------------------------------------------
# the CLI


def _record(tmp_path: Path) -> tuple[Path, Path]:
    log, events = tmp_path / "jobcomp.log", tmp_path / "events.jsonl"
    log.write_text(LOG + "\n")
    events.write_text("".join(e.model_dump_json() + "\n" for e in progress()))
    return log, events


def test_cli_slurm_measures_from_the_log_and_predicts_from_inputs(tmp_path: Path) -> None:
    log, events = _record(tmp_path)
    args = ["ettr", "slurm", "--jobcomp", str(log), "--job-id", "1", "--events", str(events)]
    args += [
        "--nodes",
        "3072",
        "--rate",
        "6.5/1000",
        "--u0",
        "8m",
        "--checkpoint-write",
        "30s",
        "--compression",
        "1s=1m",
    ]
    result = cli.invoke(app, args)
    assert result.exit_code == 0, result.output
    expected = breakdown(parse_jobcomp(LOG, 1), progress()).ettr
    assert f"measured ETTR = R / (Q + R + U) = {expected:.3f}" in result.stdout
    assert "2 failure(s)" in result.stdout
    assert "predicted E[ETTR] = 0.784" in result.stdout and "compression 60x" in result.stdout


def test_cli_slurm_without_inputs_prints_no_prediction(tmp_path: Path) -> None:
    log, events = _record(tmp_path)
    result = cli.invoke(app, ["ettr", "slurm", "--jobcomp", str(log), "--job-id", "1", "--events", str(events)])
    assert result.exit_code == 0, result.output
    assert "prediction: none" in result.stdout


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([], "pick one with --job-id"),
        (["--job-id", "1", "--nodes", "8"], "both --nodes and --rate"),
        (["--job-id", "1", "--nodes", "8", "--rate", "1", "--compression", "0"], "time compression"),
        (["--job-id", "5"], "no attempt"),
    ],
)
def test_cli_slurm_bad_input_exits_2(tmp_path: Path, extra: list[str], message: str) -> None:
    log, _ = _record(tmp_path)
    result = cli.invoke(app, ["ettr", "slurm", "--jobcomp", str(log), *extra])
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_cli_slurm_reads_a_history(tmp_path: Path) -> None:
    history = [slurm_job(0, "PENDING"), slurm_job(2, "RUNNING", 0, ("h1",)), slurm_job(40, "COMPLETED", 0, ("h1",))]
    path = tmp_path / "history.jsonl"
    path.write_text("".join(json.dumps(e.model_dump()) + "\n" for e in history))
    result = cli.invoke(app, ["ettr", "slurm", "--history", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "0 failure(s)" in result.stdout and "no progress events" in result.stdout


def test_cli_run_predicts_from_the_inputs_not_from_the_run(tmp_path: Path) -> None:
    from test_ettr import five_recomputed

    from chaos.history.timeline import write_jsonl

    write_jsonl(tmp_path / "history.jsonl", five_recomputed())
    base = ["ettr", "run", str(tmp_path)]
    inputs = ["--nodes", "1536", "--rate", "6.5/1000", "--u0", "5m", "--checkpoint-write", "5m"]
    result = cli.invoke(app, [*base, *inputs])
    assert result.exit_code == 0, result.output
    # The 12,288-GPU published vector, whatever this tiny run did: the prediction reads only the inputs.
    assert "predicted E[ETTR] = 0.737" in result.stdout
    assert "measured ETTR (first step to last) 0.565 vs predicted 0.737" in result.stdout


def test_an_event_after_the_floored_end_extends_the_attempt() -> None:
    """jobcomp times are whole seconds: a checkpoint 0.4 s after the logged end (the kill came 0.5 s later)
    still saved the work before it; the next attempt's wait starts after it, so the total stays the wall."""
    events = [e for e in progress() if e.get_int("attempt") != 0 or e.kind == "target.start"]
    events.append(ev(40.4, "target.checkpoint", step=36, attempt=0, duration_s=1.0))
    measured = breakdown(parse_jobcomp(LOG, 1), events)
    first = measured.attempts[0]
    assert first.lost_s == pytest.approx(0.0)
    assert first.productive_s == pytest.approx(40.4 - 3 - 1.0)
    assert measured.attempts[1].restart_s == pytest.approx(46 - 40.4)
    assert measured.q_s + measured.r_s + measured.u_s == pytest.approx(measured.wall_s) == pytest.approx(120)
