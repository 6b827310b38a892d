"""``mlchaos ettr model|run|slurm``: the ETTR model at a given scale, a run's measured goodput (see
:mod:`chaos.analysis.ettr`), and a Slurm job's ETTR from the scheduler's record (:mod:`chaos.cli.ettr_slurm`).
A measured ETTR is only ever compared with Eq. 2 fed the scenario's inputs (``--nodes --rate --u0
--checkpoint-write [--interval] [--compression]``), never with a model fed the run's own numbers.

``register(app)`` adds the ``ettr`` sub-app to the main Typer app. Exit codes: 0 done; 2 invalid input (a
malformed duration or rate, a scale at which the model predicts no progress, a missing run folder or
history, a history without steps).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from chaos.analysis.ettr import (
    DEFAULT_GPUS_PER_NODE,
    EttrModel,
    eq2_best_interval,
    expected_ettr,
    goodput,
    nodes_for_gpus,
)
from chaos.analysis.ettr_inputs import parse_rate as parse_rate  # re-exported: this CLI's rate syntax
from chaos.cli import ettr_slurm
from chaos.cli.console import stderr_console, stdout_console
from chaos.history.timeline import History
from chaos.spec.units import format_duration, parse_duration

EXIT_INVALID = 2
HISTORY_FILE = "history.jsonl"
SOURCE = "Kokolis et al., Eq. 2: E[ETTR] ≈ [1 − N r_f (u0 + Δt/2)] / (1 + w/Δt); Daly-Young Δt* = sqrt(2w / (N r_f))"

_out = stdout_console()
_err = stderr_console()


def register(app: typer.Typer) -> None:
    """Add the ``ettr`` command group to ``app``."""
    group = typer.Typer(
        help="Effective training time ratio: the analytical model, and the goodput measured in a run.",
        no_args_is_help=True,
    )
    group.command("model")(model)
    group.command("run")(run)
    group.command("slurm")(ettr_slurm.slurm)
    app.add_typer(group, name="ettr")


def _fail(message: str) -> typer.Exit:
    _err.print(f"[red]error[/red] {escape(message)}")
    return typer.Exit(EXIT_INVALID)


def _duration(option: str, text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise _fail(f"{option}: {exc}") from None


def _pct(value: float) -> str:
    return f"{100 * value:.1f}%"


def _model_row(table: Table, label: str, m: EttrModel) -> None:
    table.add_row(
        label,
        format_duration(m.interval_s),
        f"{m.ettr:.3f}",
        _pct(m.failure_loss),
        _pct(m.checkpoint_overhead),
    )


def _model_table(title: str) -> Table:
    table = Table(title=title, caption=SOURCE)
    for column in ("interval", "Δt", "E[ETTR]", "lost to failures N r_f (u0+Δt/2)", "checkpoint overhead w/Δt"):
        table.add_column(column)
    return table


def model(
    gpus: Annotated[int, typer.Option(min=1, help="GPUs in the job")],
    gpus_per_node: Annotated[int, typer.Option(min=1, help="GPUs per node (N = ceil(gpus / this))")] = (
        DEFAULT_GPUS_PER_NODE
    ),
    rate: Annotated[str, typer.Option(help="failures per node-day, e.g. 6.5/1000 (Meta RSC-1) or 2.34/1000")] = (
        "6.5/1000"
    ),
    u0: Annotated[str, typer.Option("--u0", help="restart overhead per failure, e.g. 5m")] = "5m",
    checkpoint_write: Annotated[str, typer.Option(help="time one checkpoint write stalls training, e.g. 5m")] = "5m",
    interval: Annotated[
        str | None,  # noqa: UP007
        typer.Option(help="also evaluate this checkpoint interval, e.g. 30m"),
    ] = None,
) -> None:
    """Expected ETTR of a job at this scale: Daly-Young optimal checkpoint interval and E[ETTR] there."""
    try:
        per_node_day = parse_rate(rate)
    except ValueError as exc:
        raise _fail(f"--rate: {exc}") from None
    restart = _duration("--u0", u0)
    write = _duration("--checkpoint-write", checkpoint_write)
    given = None if interval is None else _duration("--interval", interval)
    nodes = nodes_for_gpus(gpus, gpus_per_node)
    results: list[tuple[str, EttrModel]] = []
    try:
        if per_node_day > 0:
            optimum = expected_ettr(nodes, per_node_day, restart, write)
            results.append(("Daly-Young optimum Δt*", optimum))
            if write > 0:
                # Eq. 2 peaks a little below Δt*; showing where explains why a given interval can beat Δt*.
                best = eq2_best_interval(optimum.job_failure_rate_per_s, restart, write)
                results.append(("Eq. 2's own maximum", expected_ettr(nodes, per_node_day, restart, write, best)))
        elif given is None:
            raise ValueError("with --rate 0 no finite interval is optimal; give --interval to evaluate one")
        if given is not None:
            results.append(("given", expected_ettr(nodes, per_node_day, restart, write, given)))
    except ValueError as exc:
        raise _fail(str(exc)) from None
    first = results[0][1]
    mtbf = "never" if math.isinf(first.mtbf_s) else format_duration(first.mtbf_s)
    table = _model_table(
        f"{gpus} GPUs = {nodes} nodes × ≤{gpus_per_node}; r_f {per_node_day * 1000:g}/1000 node-days "
        f"(job MTBF {mtbf}); u0 {format_duration(restart)}; w {format_duration(write)}"
    )
    for label, result in results:
        _model_row(table, label, result)
    _out.print(table)


def run(
    run_dir: Annotated[Path, typer.Argument(help=f"a run folder holding {HISTORY_FILE} (or the file itself)")],
    nodes: ettr_slurm.NodesOpt = None,
    rate: ettr_slurm.RateOpt = None,
    u0: ettr_slurm.U0Opt = "5m",
    checkpoint_write: ettr_slurm.WriteOpt = "5m",
    interval: ettr_slurm.IntervalOpt = None,
    compression: ettr_slurm.CompressionOpt = "1",
) -> None:
    """Goodput of a finished run: where its wall time went, measured ETTR, and Eq. 2 for the scenario's inputs."""
    prediction = ettr_slurm.scenario_prediction(nodes, rate, u0, checkpoint_write, interval, compression)
    path = run_dir if run_dir.is_file() else run_dir / HISTORY_FILE
    if not run_dir.exists():
        raise _fail(f"{run_dir}: no such run folder")
    if not path.is_file():
        raise _fail(f"{run_dir}: no {HISTORY_FILE} in this folder; is it a run folder (reports/<run>)?")
    try:
        measured = goodput(History.load(path))
    except ValueError as exc:
        raise _fail(f"{path}: {exc}") from None
    table = Table(title=f"goodput of {escape(str(path))}")
    for column in ("where the time went", "time", "share", "count"):
        table.add_column(column)
    wall = measured.wall_s

    def row(label: str, value: float, count: str = "") -> None:
        share = _pct(value / wall) if wall > 0 else "-"
        table.add_row(label, format_duration(value), share, count)

    row("productive steps (committed lineage)", measured.productive_s, f"{measured.committed_steps} steps")
    row("recomputed steps (rolled back)", measured.recomputed_s, f"{measured.recomputed_steps} steps")
    row("restart downtime", measured.restart_s, f"{measured.restarts} restarts")
    row(
        "checkpoint writes",
        measured.checkpoint_s,
        f"{measured.checkpoints} checkpoints ({measured.checkpoints_timed} timed)",
    )
    row("other (start-up before the first step, teardown after the last)", measured.other_s)
    row("wall (first target.start to last exit/digest)", wall)
    _out.print(table)
    _out.print(f"measured ETTR = productive / wall = [bold]{measured.ettr:.3f}[/bold]")
    _out.print(
        f"without start-up and teardown: productive / (first step to last) = [bold]{measured.training_ettr:.3f}[/bold]"
    )
    for note in measured.notes:
        _out.print(f"note: {escape(note)}")
    ettr_slurm.print_comparison(measured.training_ettr, prediction, "measured ETTR (first step to last)")
