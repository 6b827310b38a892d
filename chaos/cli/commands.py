"""The ``mlchaos`` command line: run, validate, schema, list, plan, cleanup, report; and (registered from their
own modules) testbed, sdc-coverage, ettr, suite, history, gameday.

Exit codes (stable, for CI): 0 every check passed; 1 a check failed (or was unknown); 2 invalid input or a
fault unsupported here (nothing was applied); 3 the harness itself failed or was interrupted (faults healed).
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from chaos import __version__
from chaos.cli import registry_tables
from chaos.cli.console import stderr_console, stdout_console, widen_help
from chaos.cli.ettr import register as register_ettr
from chaos.cli.gameday import register as register_gameday
from chaos.cli.preflight import check_files
from chaos.cli.sdc import register as register_sdc_coverage
from chaos.cli.suite import register as register_suite
from chaos.cli.testbed import register as register_testbed
from chaos.cluster.base import Transport
from chaos.cluster.hosts import parse_node_selector
from chaos.cluster.local import LocalTransport
from chaos.plan.build import make_plan
from chaos.report.html import REPORT_HTML
from chaos.report.restarts import restarts_row_of
from chaos.run.orchestrator import RunOptions, execute
from chaos.run.result import EXIT_INVALID, EXIT_PASS, RunResult, RunStatus
from chaos.safety.cleanup import heal_leftovers
from chaos.spec.problems import Problem
from chaos.spec.scenario import HostSelector, Scenario, ScenarioError, json_schema, load_scenario

app = typer.Typer(
    name="mlchaos",
    help="Fault injection and chaos testing for distributed ML training and serving.",
    no_args_is_help=True,
    add_completion=False,
)
console = stdout_console()
errors = stderr_console()
widen_help()


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"mlchaos {__version__}")
        raise typer.Exit(EXIT_PASS)


@app.callback()
def _options(
    version: Annotated[
        bool, typer.Option("--version", callback=_print_version, is_eager=True, help="print the version and exit")
    ] = False,
) -> None:
    """Fault injection and chaos testing for distributed ML training and serving."""


_STATUS_STYLE = {"pass": "bold green", "fail": "bold red", "unknown": "bold yellow"}


def _load_all(files: list[Path]) -> list[tuple[Path, Scenario]]:
    loaded, problems = [], []
    for file in files:
        try:
            loaded.append((file, load_scenario(file)))
        except ScenarioError as exc:
            problems.extend(exc.problems)
    _refuse(problems)
    return loaded


def _refuse(problems: list[Problem]) -> None:
    """Print every problem and exit 2 (nothing was run); return when there is none."""
    if problems:
        for problem in problems:
            errors.print(f"[red]error[/red] {escape(str(problem))}")
        errors.print(f"{len(problems)} problem(s); nothing was run.")
        raise typer.Exit(EXIT_INVALID)


def _node_selector(nodes: str | None) -> HostSelector | None:
    try:
        return parse_node_selector(nodes) if nodes is not None else None
    except ValueError as exc:
        errors.print(f"[red]{escape(str(exc))}[/red]")
        raise typer.Exit(EXIT_INVALID) from None


_INVENTORY_HELP = "inventory (SSH hosts or Docker containers, e.g. from `mlchaos testbed up`)"
_NODES_HELP = "run the scenario's torchrun job across inventory hosts: all, group:NAME[:COUNT] or host:NAME"


@app.command()
def validate(
    files: Annotated[list[Path], typer.Argument(help="scenario YAML files")],
    inventory: Annotated[
        Path | None, typer.Option(help=_INVENTORY_HELP + "; checks the host selections as `run` would")
    ] = None,
    nodes: Annotated[str | None, typer.Option(help=_NODES_HELP + " (as `run --nodes`)")] = None,
    probe: Annotated[
        bool,
        typer.Option(
            help="also check that this machine supports the faults that land on it (--no-probe: the files only)"
        ),
    ] = True,
) -> None:
    """Check scenario files without running anything: the model, everything `run` would refuse before it
    starts (the same preflight), the inventory's hosts, and what this machine's kernel must support for the
    faults that land on it. Errors name file:line:column and a fix."""
    checked = check_files(files, nodes=_node_selector(nodes), inventory=inventory, hosts=True, probe=probe)
    _refuse(checked.problems)
    for file, scenario in checked.scenarios:
        console.print(
            f"[green]ok[/green] {file}: {scenario.name} "
            f"({len(scenario.faults)} fault(s), {len(scenario.checks)} check(s))"
        )
    for note in checked.notes:
        console.print(f"[yellow]note[/yellow] {escape(note)}")


@app.command()
def schema() -> None:
    """Print the JSON Schema of scenario files (for editor completion)."""
    sys.stdout.write(json.dumps(json_schema(), indent=2) + "\n")


@app.command("list")
def list_plugins(
    markdown: Annotated[bool, typer.Option("--markdown", help="print markdown tables (as docs/ shows them)")] = False,
) -> None:
    """Show every injector and check with its parameters."""
    for title, (header, rows) in (
        ("injectors (faults: type)", registry_tables.injector_rows()),
        ("checks (checks: type)", registry_tables.check_rows()),
    ):
        if markdown:
            sys.stdout.write(f"## {title}\n\n{registry_tables.markdown(header, rows)}\n\n")
            continue
        table = Table(title=title)
        for index, column in enumerate(header):
            table.add_column(column, no_wrap=index == 0)  # a type name is what users copy: never broken
        for row in rows:
            table.add_row(*(escape(cell) for cell in row))
        console.print(table)


@app.command()
def plan(
    file: Annotated[Path, typer.Argument(help="scenario YAML file")],
    seed: Annotated[int | None, typer.Option(help="override the scenario's seed")] = None,  # noqa: UP007
) -> None:
    """Show the fault plan a run would follow (seeded: the same seed gives the same plan). A scenario that
    `run` would refuse is refused here too (the same preflight), so no plan is shown for it."""
    checked = check_files([file])
    _refuse(checked.problems)
    [(_, scenario)] = checked.scenarios
    planned = make_plan(scenario, seed)
    console.print(f"plan for [bold]{scenario.name}[/bold], seed {planned.seed}:")
    for op in planned.ops:
        console.print(f"  {op.describe()}")
    for note in checked.notes:
        console.print(f"[yellow]note[/yellow] {escape(note)}")


@app.command()
def cleanup(
    inventory: Annotated[
        Path | None,
        typer.Option(help="inventory (SSH hosts, containers), to heal faults left on its hosts too"),
    ] = None,
    run: Annotated[
        str | None,
        typer.Option("--run", help="heal only this run's faults (its report folder's name), even while it runs"),
    ] = None,
    include_live: Annotated[
        bool,
        typer.Option("--include-live", help="heal the faults of runs that are still running too"),
    ] = False,
) -> None:
    """Heal every fault a dead run left applied (from the journal). Safe to run any time: runs still alive on
    this machine keep their faults (they heal them themselves) unless named with --run or --include-live."""
    transports: dict[str, Transport] = {"local": LocalTransport()}
    if inventory is not None:
        from chaos.cluster.hosts import open_transport
        from chaos.cluster.inventory import load_inventory

        loaded = load_inventory(inventory)
        transports.update({name: open_transport(loaded, name) for name in loaded.names()})
    lines = heal_leftovers(
        transports,
        log=lambda line: console.print(escape(line)),
        only_dead_owners=not (include_live or run is not None),
        run_id=run,
    )
    if not lines:
        console.print("nothing to heal: no fault is left applied by any mlchaos run")


def _print_results(result: RunResult) -> None:
    table = Table(title=f"{result.scenario.name}: {result.verdict.upper()}")
    for column in ("check", "result", "measured", "bound", "why"):
        table.add_column(column)
    for check in result.results:
        style = _STATUS_STYLE[check.status]
        why = "" if check.status == "pass" else check.reason  # a pass says it all in measured vs bound
        table.add_row(
            escape(check.name),  # names like detected_within[kill-rank1] are not rich markup
            f"[{style}]{check.status}[/{style}]",
            escape(check.measured_text()),
            escape(check.bound or ""),
            escape(why),
        )
    if (restarts := restarts_row_of(result)) is not None:  # every torchrun run: the restarts its launcher used
        table.add_row(*(escape(cell) for cell in restarts.cells()))
    console.print(table)
    if result.error:
        errors.print(f"[red]{escape(result.error)}[/red]")
    console.print(f"ended by: {result.ended_by}; reports: {result.run_dir}")
    if (result.run_dir / REPORT_HTML).exists():
        console.print(f"report: {result.run_dir / REPORT_HTML}")  # the page to open first


@app.command()
def run(
    files: Annotated[list[Path], typer.Argument(help="scenario YAML files")],
    seed: Annotated[int | None, typer.Option(help="override the scenario's seed")] = None,  # noqa: UP007
    repeat: Annotated[int, typer.Option(min=1, help="run each scenario N times; report pass rate per check")] = 1,
    report_dir: Annotated[Path, typer.Option(help="where run folders are written")] = Path("reports"),
    golden: Annotated[bool, typer.Option(help="do the fault-free golden run when a check needs it")] = True,
    golden_cache: Annotated[bool, typer.Option(help="reuse a cached golden digest for the same job")] = True,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="only the verdict table")] = False,
    inventory: Annotated[Path | None, typer.Option(help=_INVENTORY_HELP)] = None,
    nodes: Annotated[str | None, typer.Option(help=_NODES_HELP)] = None,
) -> None:
    """Run scenarios against their targets, inject the faults, heal, judge and write reports."""
    node_selector = _node_selector(nodes)
    # The preflight `validate` runs, on every file before the first run starts (the orchestrator repeats it).
    checked = check_files(files, nodes=node_selector)
    _refuse(checked.problems)
    scenarios = checked.scenarios
    worst = EXIT_PASS
    options = RunOptions(
        report_root=report_dir,
        seed=seed,
        golden=golden,
        golden_cache=golden_cache,
        inventory=inventory,
        nodes=node_selector,
    )
    for file, scenario in scenarios:
        outcomes: list[RunResult] = []
        for index in range(repeat):
            label = f" (run {index + 1}/{repeat})" if repeat > 1 else ""
            console.print(f"[bold]{scenario.name}[/bold]{label}: {escape(scenario.description.strip())}")
            result = _run_one(scenario, replace(options, scenario_file=file), quiet)
            outcomes.append(result)
            _print_results(result)
            worst = max(worst, result.exit_code) if result.exit_code != EXIT_INVALID else EXIT_INVALID
        if repeat > 1:
            _print_pass_rates(scenario, outcomes)
    raise typer.Exit(worst)


def _run_one(scenario: Scenario, options: RunOptions, quiet: bool) -> RunResult:
    def log(line: str) -> None:
        if not quiet:
            console.print(f"  {escape(line)}")

    if console.is_terminal and not quiet:
        with console.status("starting …") as live:

            def status(snapshot: RunStatus) -> None:
                live.update(
                    f"+{snapshot.elapsed_s:5.1f}s  step {snapshot.step if snapshot.step is not None else '-'}  "
                    f"faults {snapshot.fired}/{snapshot.planned}  active: {', '.join(snapshot.active) or 'none'}"
                )

            result = execute(scenario, options, log=log, status=status)
    else:
        result = execute(scenario, options, log=log)
    return result


def _print_pass_rates(scenario: Scenario, outcomes: list[RunResult]) -> None:
    rates: dict[str, list[str]] = defaultdict(list)
    for outcome in outcomes:
        for check in outcome.results:
            rates[check.name].append(check.status)
    table = Table(title=f"{scenario.name}: pass rate over {len(outcomes)} runs")
    for column in ("check", "pass rate", "fail", "unknown"):
        table.add_column(column)
    for name, statuses in rates.items():
        passed = statuses.count("pass")
        table.add_row(
            escape(name),
            f"{passed}/{len(statuses)} ({100 * passed / len(statuses):.0f}%)",
            str(statuses.count("fail")),
            str(statuses.count("unknown")),
        )
    verdicts = [o.verdict for o in outcomes]
    table.caption = f"runs passed: {verdicts.count('pass')}/{len(outcomes)}"
    console.print(table)


@app.command()
def report(
    run_dir: Annotated[
        Path, typer.Argument(metavar="RUN_DIR", help="a run folder, as `mlchaos run` wrote it (holds run.json)")
    ],
    open_report: Annotated[bool, typer.Option("--open", help="also open the page in a web browser")] = False,
) -> None:
    """Write RUN_DIR/report.html from RUN_DIR/run.json (timeline, checks with evidence, plan, replay); print its path."""
    from chaos.report.html import write_html_report

    try:
        path = write_html_report(run_dir)
    except (OSError, ValueError) as exc:
        errors.print(f"[red]cannot build the report of {escape(str(run_dir))}:[/red] {escape(str(exc))}")
        raise typer.Exit(EXIT_INVALID) from exc
    typer.echo(str(path))
    if open_report:
        import webbrowser

        webbrowser.open(path.resolve().as_uri())


register_sdc_coverage(app)
register_testbed(app)
register_ettr(app)
register_suite(app)
register_gameday(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
