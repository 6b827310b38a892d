"""``mlchaos suite run|plan`` and ``mlchaos history``: many runs in one go, and the trends they leave behind
(see :mod:`chaos.suite.run_suite`, :mod:`chaos.suite.store`, :mod:`chaos.suite.metrics`).

``register(app)`` adds the ``suite`` sub-app and the ``history`` command to the main Typer app.
Exit codes of ``suite run``: 0 every run passed; 1 a check failed; 2 invalid input (nothing ran) or a run
was refused; 3 harness error, interrupted, or the history/metrics could not be written. ``history``: 0, or 2
for invalid input.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from chaos.cli import suite_schedule
from chaos.cli.console import stderr_console, stdout_console
from chaos.run.result import EXIT_INVALID, RunResult
from chaos.spec.scenario import ScenarioError
from chaos.spec.units import format_duration
from chaos.suite.run_suite import (
    PlannedRun,
    SuiteOptions,
    SuiteOutcome,
    load_suite,
    plan_runs,
    progress_end,
    progress_start,
    run_suite,
    summarize,
)
from chaos.suite.store import RunStore, ScenarioTrend, StoreError, default_path

_out = stdout_console()
_err = stderr_console()
_VERDICT_STYLE = {"pass": "bold green", "fail": "bold red", "error": "bold yellow"}


def register(app: typer.Typer) -> None:
    """Add the ``suite`` command group and the ``history`` command to ``app``."""
    group = typer.Typer(
        help="Run many scenarios in one go (a folder or a suite file), for schedules and CI.", no_args_is_help=True
    )
    group.command("run")(run)
    group.command("plan")(plan)
    group.command("schedule")(suite_schedule.schedule)  # a recurring Slurm job (chaos.suite.slurm_schedule)
    app.add_typer(group, name="suite")
    app.command("history")(history)


Target = Annotated[Path, typer.Argument(help="a folder of scenarios, a suite YAML file, or one scenario file")]
Repeat = Annotated[int | None, typer.Option(min=1, help="rounds over the whole suite (default: the suite's repeat)")]
Shuffle = Annotated[bool, typer.Option("--shuffle", help="run in a random order, seeded (see --seed)")]
Seed = Annotated[
    int | None, typer.Option(help="seed of the shuffle (default: the suite's seed, else drawn and printed)")
]
Inventory = Annotated[Path | None, typer.Option(help="inventory for every run whose suite entry names none")]


def _fail_invalid(exc: ScenarioError) -> typer.Exit:
    for problem in exc.problems:
        _err.print(f"[red]error[/red] {escape(str(problem))}")
    _err.print(f"{len(exc.problems)} problem(s); nothing was run.")
    return typer.Exit(EXIT_INVALID)


class _Printer:
    """Progress lines: ``[3/12] kill-rank (seed 7) … pass in 31.2 s``; with ``verbose`` the runner's lines
    go in between, indented."""

    def __init__(self, verbose: bool) -> None:
        self.verbose = verbose

    def started(self, position: int, total: int, run: PlannedRun) -> None:
        line = escape(progress_start(position, total, run))
        if self.verbose:
            _out.print(f"[bold]{line}[/bold]")
        else:
            _out.print(line, end=" ")
            _out.file.flush()

    def finished(self, position: int, total: int, run: PlannedRun, result: RunResult, seconds: float) -> None:
        style = _VERDICT_STYLE.get(result.verdict, "bold")
        text = progress_end(result, seconds)
        verdict, rest = text[: len(result.verdict)], text[len(result.verdict) :]
        prefix = "  → " if self.verbose else ""
        _out.print(f"{prefix}[{style}]{verdict}[/{style}]{escape(rest)}")

    def notice(self, line: str) -> None:
        _out.print(escape(line))

    def log(self, line: str) -> None:
        if self.verbose:
            _out.print(f"    {escape(line)}")


def run(
    target: Target,
    repeat: Repeat = None,
    shuffle: Shuffle = False,
    seed: Seed = None,
    report_dir: Annotated[Path, typer.Option(help="where run folders (and by default history and metrics) go")] = Path(
        "reports"
    ),
    history: Annotated[
        Path | None,
        typer.Option(
            help="run-history SQLite file (default: $MLCHAOS_HISTORY, else REPORT_DIR/mlchaos-history.sqlite)"
        ),
    ] = None,
    textfile: Annotated[
        Path | None, typer.Option(help="Prometheus textfile-collector file (default: REPORT_DIR/mlchaos.prom)")
    ] = None,
    pushgateway: Annotated[
        str | None, typer.Option(help="push the metrics to this Pushgateway (default: $MLCHAOS_PUSHGATEWAY)")
    ] = None,
    inventory: Inventory = None,
    fail_fast: Annotated[bool, typer.Option("--fail-fast", help="stop after the first run that does not pass")] = False,
    golden: Annotated[bool, typer.Option(help="do the fault-free golden run when a check needs it")] = True,
    golden_cache: Annotated[bool, typer.Option(help="reuse a cached golden digest for the same job")] = True,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="also print each run's own log lines")] = False,
) -> None:
    """Run every scenario of a suite in sequence, record each run in the history, write Prometheus metrics."""
    try:
        suite = load_suite(target)
    except ScenarioError as exc:
        raise _fail_invalid(exc) from None
    options = SuiteOptions(
        report_dir=report_dir,
        repeat=repeat,
        shuffle=shuffle,
        seed=seed,
        inventory=inventory,
        history=history,
        textfile=textfile,
        pushgateway=pushgateway,
        fail_fast=fail_fast,
        golden=golden,
        golden_cache=golden_cache,
    )
    try:
        outcome = run_suite(suite, options, _Printer(verbose))
    except StoreError as exc:
        _err.print(f"[red]error[/red] {escape(str(exc))}; nothing was run.")
        raise typer.Exit(EXIT_INVALID) from None
    _print_summary(outcome)
    raise typer.Exit(outcome.exit_code)


def _seconds(value: float | None) -> str:
    return "-" if value is None else format_duration(value)


def _print_summary(outcome: SuiteOutcome) -> None:
    table = Table(title=f"suite {outcome.suite.name}")
    rows = summarize(outcome)
    table.add_column("scenario", no_wrap=True, min_width=max((len(row.scenario) for row in rows), default=8))
    for column in ("runs", "passed", "verdicts", "detection max", "recovery max", "mean time", "failing"):
        table.add_column(column)
    for row in rows:
        style = "green" if row.passed == row.runs else "red"
        failing = ", ".join(f"{name} ×{count}" if count > 1 else name for name, count in row.failing.items())
        table.add_row(
            escape(row.scenario),
            str(row.runs),
            f"[{style}]{row.passed}/{row.runs}[/{style}]",
            row.verdicts,
            _seconds(row.detection_max_s),
            _seconds(row.recovery_max_s),
            f"{row.mean_seconds:.1f} s",
            escape(failing),
        )
    _out.print(table)
    if outcome.stopped_early:
        _err.print(f"[yellow]stopped early: {escape(outcome.stopped_early)}[/yellow]")
    for problem in outcome.problems:
        _err.print(f"[red]error[/red] {escape(problem)}")
    passed = sum(c.result.verdict == "pass" for c in outcome.completed)
    _out.print(
        f"{passed}/{len(outcome.completed)} runs passed ({len(outcome.planned)} planned); exit {outcome.exit_code}; "
        f"history: {outcome.history}; metrics: {outcome.textfile}"
    )


def plan(
    target: Target,
    repeat: Repeat = None,
    shuffle: Shuffle = False,
    seed: Seed = None,
    inventory: Inventory = None,
) -> None:
    """Validate a suite and list the runs it would do, in order (nothing runs)."""
    try:
        suite = load_suite(target)
    except ScenarioError as exc:
        raise _fail_invalid(exc) from None
    runs, used_seed = plan_runs(suite, repeat=repeat, shuffle=shuffle, seed=seed, inventory=inventory)
    order = f", shuffled with seed {used_seed}" if used_seed is not None else ""
    _out.print(f"suite [bold]{escape(suite.name)}[/bold]: {len(runs)} run(s){order}")
    for position, planned in enumerate(runs, start=1):
        where = f" inventory {planned.inventory}" if planned.inventory is not None else ""
        _out.print(escape(f"  {progress_start(position, len(runs), planned)[:-2]}  {planned.item.file}{where}"))


def _ago(ts: float) -> str:
    seconds = max(0.0, time.time() - ts)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit} ago"
    return f"{seconds:.0f}s ago"


def history(
    scenario: Annotated[str | None, typer.Option(help="only this scenario")] = None,
    last: Annotated[int, typer.Option(min=1, help="window: each scenario's newest N runs")] = 20,
    history_file: Annotated[
        Path | None,
        typer.Option(
            "--history", help="run-history file (default: $MLCHAOS_HISTORY, else reports/mlchaos-history.sqlite)"
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
    runs: Annotated[bool, typer.Option("--runs", help="list the runs themselves, not per-scenario trends")] = False,
) -> None:
    """Per-scenario trends from the run history: pass rate, detection latency, recovery time, recent verdicts."""
    path = history_file if history_file is not None else default_path()
    if not path.exists():
        _err.print(f"no run history at {escape(str(path))} yet (mlchaos suite run records one)")
        if as_json:
            sys.stdout.write("[]\n")
        return
    try:
        with RunStore.open(path) as store:
            if runs:
                _print_runs(store, scenario, last, as_json)
                return
            trends = store.trends(scenario, last)
    except StoreError as exc:
        _err.print(f"[red]error[/red] {escape(str(exc))}")
        raise typer.Exit(EXIT_INVALID) from None
    if as_json:
        sys.stdout.write(json.dumps([t.as_dict() for t in trends], indent=2) + "\n")
        return
    if not trends:
        _err.print(f"no runs recorded{f' for {scenario!r}' if scenario else ''} in {escape(str(path))}")
        return
    _print_trends(trends, last, path)


def _print_trends(trends: list[ScenarioTrend], last: int, path: Path) -> None:
    serving = any(t.failover_p50_s is not None or t.failback_p50_s is not None for t in trends)
    table = Table(title=f"run history: each scenario's last {last} runs ({path})")
    columns = ["scenario", "runs", "pass rate", "recent (oldest → newest)", "detect p50", "detect max", "recover p50"]
    columns += ["failover p50", "failback p50"] if serving else []
    # Scenario names are what people scan for: never cut them; rich wraps the other headers instead.
    table.add_column(columns[0], no_wrap=True, min_width=max((len(t.scenario) for t in trends), default=8))
    for column in [*columns[1:], "last", "when"]:
        table.add_column(column)
    for t in trends:
        style = "green" if t.pass_rate == 1 else "yellow" if t.pass_rate >= 0.5 else "red"
        cells = [
            escape(t.scenario),
            str(t.runs),
            f"[{style}]{100 * t.pass_rate:.0f}%[/{style}] ({t.passed}/{t.runs})",
            t.sparkline,
            _seconds(t.detection_p50_s),
            _seconds(t.detection_max_s),
            _seconds(t.recovery_p50_s),
        ]
        cells += [_seconds(t.failover_p50_s), _seconds(t.failback_p50_s)] if serving else []
        verdict_style = _VERDICT_STYLE.get(t.last_verdict, "bold")
        cells += [f"[{verdict_style}]{t.last_verdict}[/{verdict_style}]", _ago(t.last_ts)]
        table.add_row(*cells)
    _out.print(table)


def _print_runs(store: RunStore, scenario: str | None, last: int, as_json: bool) -> None:
    rows = store.runs(scenario=scenario, last=last)
    if as_json:
        sys.stdout.write(json.dumps([{**vars(r), "duration_s": r.duration_s} for r in rows], indent=2) + "\n")
        return
    table = Table(title=f"last {last} runs ({store.path})")
    for column in ("id", "ended", "scenario", "suite", "seed", "verdict", "time", "run folder"):
        table.add_column(column)
    for r in rows:
        style = _VERDICT_STYLE.get(r.verdict, "bold")
        table.add_row(
            str(r.id),
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.ended_ts)),
            escape(r.scenario),
            escape(r.suite or "-"),
            str(r.seed),
            f"[{style}]{r.verdict}[/{style}]",
            f"{r.duration_s:.1f} s",
            escape(r.run_dir),
        )
    _out.print(table)
