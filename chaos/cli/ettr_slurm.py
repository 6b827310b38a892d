"""``mlchaos ettr slurm``, and the scenario-input options ``ettr run``/``ettr slurm`` share.

Measured and predicted come from independent sources: the measurement from the scheduler's record (the
job-completion log, or the ``slurm.job`` events of a run's history) and the job's own progress events; the
prediction (:mod:`chaos.analysis.ettr_inputs`) from the scenario's inputs only (N, r_f, u0, w, Δt and the
time compression), never from what the run measured.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from chaos.analysis.ettr_inputs import Prediction, ScenarioInputs, parse_compression, parse_rate, predict
from chaos.cli.console import stderr_console, stdout_console
from chaos.history.timeline import Event, History
from chaos.slurm.accounting import Breakdown, attempts_from_events, breakdown, parse_jobcomp
from chaos.spec.units import parse_duration

EXIT_INVALID = 2
HISTORY_FILE = "history.jsonl"

_out = stdout_console()
_err = stderr_console()

NodesOpt = Annotated[int | None, typer.Option("--nodes", min=1, help="scenario input N: nodes of the job")]  # noqa: UP007
RateOpt = Annotated[str | None, typer.Option("--rate", help="scenario input r_f per node-day, e.g. 6.5/1000")]  # noqa: UP007
U0Opt = Annotated[str, typer.Option("--u0", help="scenario input: restart overhead, cluster time")]
WriteOpt = Annotated[str, typer.Option("--checkpoint-write", help="scenario input w, cluster time")]
IntervalOpt = Annotated[
    str | None,  # noqa: UP007
    typer.Option("--interval", help="scenario input Δt, cluster time (default: Daly-Young Δt*)"),
]
CompressionOpt = Annotated[
    str, typer.Option("--compression", help="cluster seconds per run second: 60, 60x or 1s=1m (default 1)")
]


def _fail(message: str) -> typer.Exit:
    _err.print(f"[red]error[/red] {escape(message)}")
    return typer.Exit(EXIT_INVALID)


def scenario_prediction(
    nodes: int | None, rate: str | None, u0: str, write: str, interval: str | None, compression: str
) -> Prediction | None:
    """The prediction for the scenario inputs given on the command line; None when N and r_f are not given."""
    if nodes is None and rate is None:
        return None
    if nodes is None or rate is None:
        raise _fail("give both --nodes and --rate (the scenario's N and r_f), or neither")
    try:
        inputs = ScenarioInputs(
            nodes,
            parse_rate(rate),
            parse_duration(u0),
            parse_duration(write),
            None if interval is None else parse_duration(interval),
            parse_compression(compression),
        )
        return predict(inputs)
    except ValueError as exc:
        raise _fail(str(exc)) from None


def print_comparison(measured: float, prediction: Prediction | None, what: str) -> None:
    """The measured ETTR next to the prediction (or why there is none)."""
    if prediction is None:
        _out.print(
            "prediction: none. Give the scenario's inputs (--nodes, --rate, --u0, --checkpoint-write, [--interval], "
            "[--compression]); a model fed the run's own numbers would only restate the run."
        )
        return
    gap = (measured - prediction.ettr) / prediction.ettr
    _out.print(f"predicted E[ETTR] = [bold]{prediction.ettr:.3f}[/bold]: {escape(prediction.describe())}")
    _out.print(f"{what} {measured:.3f} vs predicted {prediction.ettr:.3f}: {100 * gap:+.1f}%")


def slurm(
    jobcomp: Annotated[
        Path | None,  # noqa: UP007
        typer.Option(help="a jobcomp/filetxt log (the testbed's: <state dir>/chaos-tb-slurm/jobcomp.log)"),
    ] = None,
    history: Annotated[
        Path | None,  # noqa: UP007
        typer.Option(help=f"a run folder (or its {HISTORY_FILE}) with the slurm target's slurm.job events"),
    ] = None,
    job_id: Annotated[int | None, typer.Option(help="the job (default: the only one in the record)")] = None,  # noqa: UP007
    events: Annotated[
        Path | None,  # noqa: UP007
        typer.Option(help="the job's progress events (JSON lines; default: the target.* events of --history)"),
    ] = None,
    nodes: NodesOpt = None,
    rate: RateOpt = None,
    u0: U0Opt = "5m",
    checkpoint_write: WriteOpt = "5m",
    interval: IntervalOpt = None,
    compression: CompressionOpt = "1",
) -> None:
    """ETTR = R / (Q + R + U) of a Slurm job from the scheduler's record, next to Eq. 2 for the scenario's inputs."""
    if (jobcomp is None) == (history is None):
        raise _fail("give exactly one of --jobcomp and --history")
    prediction = scenario_prediction(nodes, rate, u0, checkpoint_write, interval, compression)
    progress: list[Event] = []
    try:
        if history is not None:
            path = history / HISTORY_FILE if history.is_dir() else history
            loaded = History.load(path).events
            attempts = attempts_from_events(loaded, job_id)
            progress = [e for e in loaded if e.kind.startswith("target.")]
            source = f"slurm.job events of {path}"
        else:
            assert jobcomp is not None
            attempts = parse_jobcomp(jobcomp.read_text(), job_id)
            source = str(jobcomp)
        if events is not None:
            progress = list(History.load(events).events)
        jobs = sorted({a.job_id for a in attempts})
        if len(jobs) > 1:
            raise ValueError(f"the record holds jobs {jobs}: pick one with --job-id")
        measured = breakdown(attempts, progress)
    except (OSError, ValueError) as exc:
        raise _fail(str(exc)) from None
    _print_breakdown(measured, f"job {attempts[0].job_id} from {source}")
    print_comparison(measured.ettr, prediction, "measured ETTR")


def _print_breakdown(measured: Breakdown, title: str) -> None:
    table = Table(title=escape(title))
    for column in ("", "seconds", "share"):
        table.add_column(column)
    wall = measured.wall_s

    def row(label: str, value: float) -> None:
        table.add_row(label, f"{value:.1f}", f"{100 * value / wall:.1f}%" if wall > 0 else "-")

    row("Q: queued while eligible", measured.q_s)
    row("R: productive (kept by a checkpoint or the end)", measured.r_s)
    parts = measured.u_parts()
    row("U: requeue hold", parts["restart"])
    row("U: start-up to training again", parts["startup"])
    row("U: checkpoint writes", parts["checkpoint"])
    row("U: lost work (after the last checkpoint)", parts["lost"])
    row("wall: first submit to last end", wall)
    _out.print(table)
    restart = measured.mean_restart_s
    _out.print(
        f"{len(measured.attempts)} attempt(s), {measured.failures} failure(s)"
        + (f", mean failure-to-training {restart:.1f} s" if restart is not None else "")
    )
    for note in measured.notes:
        _out.print(f"note: {escape(note)}")
    _out.print(f"measured ETTR = R / (Q + R + U) = [bold]{measured.ettr:.3f}[/bold]")
