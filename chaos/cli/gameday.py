"""``mlchaos gameday FILE``: an operator-driven run (see :mod:`chaos.gameday.engine`).

Shows the scenario, seed, plan and blast radius, asks ``Start the game day? [y/N]`` (``--yes`` skips it;
any answer but y/yes, EOF or Ctrl-C there ends with exit 0 and nothing run), then runs the scenario with a
live view (rich, ~4 Hz) and a command line: ``i`` inject the next fault now, ``h`` heal all now,
``n TEXT`` note, ``a [WHY]`` abort, ``?`` help. Everything typed goes into the run's history. When stdout is
not a terminal the view is plain lines (log lines, typed commands and their replies).

Exit codes as ``mlchaos run``: 0 every check passed; 1 a check failed or was unknown; 2 invalid scenario or
a fault unsupported here (nothing applied); 3 the harness failed, or the game day was interrupted (Ctrl-C,
SIGTERM, SIGHUP: every fault is healed first).
"""

from __future__ import annotations

import codecs
import os
import signal
import sys
import threading
import time
from contextlib import suppress
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from chaos.cli.console import stderr_console, stdout_console
from chaos.cluster.hosts import HostsError, HostSet
from chaos.gameday.engine import (
    HELP,
    GameDay,
    LineEditor,
    Reach,
    blast_radius,
    cbreak,
    describe_event,
    host_label,
    safety_lines,
    target_reach,
)
from chaos.plan.build import Plan, make_plan
from chaos.report.html import REPORT_HTML
from chaos.report.restarts import restarts_row_of
from chaos.run.orchestrator import RunOptions
from chaos.run.result import EXIT_HARNESS, EXIT_INVALID, RunResult
from chaos.safety.journal import journal_dir
from chaos.spec.scenario import Scenario, ScenarioError, load_scenario

REFRESH_S = 0.25
KEYS = "i inject next · h heal all · n TEXT note · a abort · ? help · ^C heal, exit"
_STATUS_STYLE = {"pass": "bold green", "fail": "bold red", "unknown": "bold yellow"}

_out = stdout_console()
_err = stderr_console()


def register(app: typer.Typer) -> None:
    """Add the ``gameday`` command to ``app``."""
    app.command("gameday")(gameday)


def gameday(
    file: Annotated[Path, typer.Argument(help="scenario YAML file")],
    seed: Annotated[int | None, typer.Option(help="override the scenario's seed")] = None,  # noqa: UP007
    inventory: Annotated[
        Path | None, typer.Option(help="inventory (SSH hosts or Docker containers) for faults with hosts:")
    ] = None,
    report_dir: Annotated[Path, typer.Option(help="where run folders are written")] = Path("reports"),
    author: Annotated[
        str, typer.Option(help="who is at the keyboard (recorded with every command)", show_default="$USER")
    ] = "",
    yes: Annotated[bool, typer.Option("--yes", "-y", help="start without asking for confirmation")] = False,
) -> None:
    """Run a scenario by hand: see the plan and blast radius, confirm, then watch it live and inject, heal,
    note or abort from the keyboard. Ctrl-C heals every fault before exiting."""
    who = author or os.environ.get("USER") or "operator"
    try:
        scenario = load_scenario(file)
    except ScenarioError as exc:
        for problem in exc.problems:
            _err.print(f"[red]error[/red] {escape(str(problem))}")
        _err.print(f"{len(exc.problems)} problem(s); nothing was run.")
        raise typer.Exit(EXIT_INVALID) from None
    plan = make_plan(scenario, seed)
    try:
        hosts = HostSet.for_scenario(scenario, inventory, file.parent)
    except (HostsError, ScenarioError) as exc:
        _err.print(f"[red]error[/red] {escape(str(exc))}; nothing was run.")
        raise typer.Exit(EXIT_INVALID) from None
    try:
        show_plan(_out, scenario, plan, blast_radius(scenario, plan, hosts), target_reach(scenario, hosts, plan.seed))
    finally:
        hosts.close()
    answer = "--yes" if yes else _ask("Start the game day? [y/N] ")
    if answer.lower() not in ("y", "yes", "--yes"):
        _out.print("not started: nothing was run.")
        raise typer.Exit(0)
    options = RunOptions(report_root=report_dir, seed=seed, inventory=inventory, scenario_file=file)
    session = GameDay(scenario, options, who)
    raise typer.Exit(_run(session, plan, f"game day started by {who} (answer: {answer})"))


def _ask(prompt: str) -> str:
    try:
        return _out.input(escape(prompt)).strip()
    except (EOFError, KeyboardInterrupt):
        _out.print()
        return ""


def show_plan(console: Console, scenario: Scenario, plan: Plan, reach: list[Reach], target: str) -> None:
    """Print the scenario, seed, every planned op (as ``mlchaos plan`` does) and the blast radius."""
    console.print(f"[bold]game day: {scenario.name}[/bold] {escape(scenario.description.strip())}")
    console.print(f"target: {escape(target)}")
    console.print(f"plan, seed {plan.seed}:")
    by_fault = {item.fault: item for item in reach}
    for op in plan.ops:
        item = by_fault.get(op.fault)
        where = f" -> {item.touches} on {', '.join(host_label(h) for h in item.hosts) or '?'}" if item else ""
        console.print(f"  {escape(op.describe() + where)}")
    if not plan.ops:
        console.print("  (no faults)")
    table = Table(title="blast radius: what each fault may touch")
    for column in ("fault", "type", "ops", "lasts", "hosts", "touches"):
        table.add_column(column)
    for item in reach:
        table.add_row(
            escape(item.fault),
            escape(item.injector),
            str(len(item.ops)),
            f"{item.duration_s:g}s" if item.duration_s is not None else "-",
            escape(", ".join(host_label(h) for h in item.hosts) or "?"),
            escape(item.touches),
        )
    console.print(table)
    for item in reach:
        for warning in item.warnings:
            console.print(f"[yellow]warning[/yellow] {escape(item.fault)}: {escape(warning)}")
    console.print("safety: " + "; ".join(escape(line) for line in safety_lines(scenario)))
    console.print(f"commands during the run: {escape(HELP)}; Ctrl-C heals everything and exits")


# -- the run ------------------------------------------------------------------------------------------------------


def _run(session: GameDay, plan: Plan, first_note: str) -> int:
    """Start the run, drive the view and the keyboard until it ends, print the outcome; the exit code."""
    editor = LineEditor() if sys.stdout.isatty() and sys.stdin.isatty() else None
    handlers = {s: signal.signal(s, session.on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        session.start(first_note)
        keys = threading.Thread(target=_read_input, args=(session, editor), name="mlchaos-gameday-keys", daemon=True)
        try:
            if editor is not None:
                with cbreak(sys.stdin.fileno()):  # before the reader starts, so no keystroke is echoed
                    keys.start()
                    _live(session, plan, editor)
            else:
                keys.start()
                _plain(session)
        except Exception as exc:  # the view failed (say the terminal went away): the run must still end, healed
            session.control.abort(f"the game day view failed: {exc}", session.author)
        # Signals during the final wait only add a "still healing" line: the worker is never abandoned.
        while session.running:
            session.join(REFRESH_S)
            with suppress(Exception):
                for line in session.service():
                    _out.print(escape(line))
    finally:
        for signum, previous in handlers.items():
            signal.signal(signum, previous)
    return _outcome(session)


def _read_input(session: GameDay, editor: LineEditor | None) -> None:
    """Read typed lines until EOF (daemon thread): keystrokes through ``editor`` in live mode, else lines."""

    def submit(line: str) -> None:
        reply = session.submit(line)
        if reply:
            session.logs.put(f"> {line.strip()}  ({reply})")
        session.wake.set()

    if editor is None:
        for line in sys.stdin:
            submit(line)
        return
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    while True:
        try:
            data = os.read(sys.stdin.fileno(), 1024)
        except OSError:
            return
        if not data:
            return
        for line in editor.feed(decoder.decode(data)):
            submit(line)
        session.wake.set()


def _live(session: GameDay, plan: Plan, editor: LineEditor) -> None:
    began = time.monotonic()
    with Live(console=_out, auto_refresh=False, transient=False) as live:
        while session.running:
            session.wake.wait(REFRESH_S)
            session.wake.clear()
            for line in session.service():
                live.console.print(f"  {escape(line)}")
            live.update(_view(session, plan, editor.buffer, time.monotonic() - began, _out.size.height), refresh=True)
        for line in session.service():
            live.console.print(f"  {escape(line)}")
        live.update(_view(session, plan, None, time.monotonic() - began, _out.size.height), refresh=True)


def _plain(session: GameDay) -> None:
    """Plain lines for logs: what the runner says, what was typed and a status line when it changes."""
    last = ""
    while session.running:
        session.wake.wait(REFRESH_S)
        session.wake.clear()
        for line in session.service():
            _out.print(f"  {escape(line)}")
        status = session.status
        if status is not None:
            line = f"faults {status.fired}/{status.planned}, active: {', '.join(status.active) or 'none'}"
            if line != last:
                _out.print(f"  +{status.elapsed_s:.1f}s {escape(line)}")
                last = line


def _view(session: GameDay, plan: Plan, typing: str | None, waited_s: float, height: int) -> RenderableType:
    state, status = session.state, session.status
    now_ns = time.time_ns()
    head = Text()
    head.append(f"seed {plan.seed}  ")
    head.append(f"+{status.elapsed_s:.1f}s" if status is not None else f"starting … {waited_s:.0f}s", style="bold")
    if state.step is not None:
        head.append(f"  step {state.step}")
    rate = state.request_rate(now_ns)
    if rate is not None:
        head.append(f"  {rate[0]:.1f} req/s, {rate[1]:.1%} errors", style="red" if rate[1] > 0 else "")
    fired = status.fired if status is not None else state.fired
    head.append(f"  faults fired {fired}/{len(plan.ops)}")
    if state.ended is not None:
        head.append("  run over: healing, checks, reports", style="yellow")
    parts: list[RenderableType] = [head]
    # The runner's list is the truth (irreversible faults such as a kill never enter it); the history adds
    # host, age and description, and drops a fault as soon as its heal is recorded.
    active = [v for v in state.applied.values() if status is None or v.op in status.active]
    if active:
        table = Table(
            box=None, pad_edge=False, expand=True, title_justify="left", title="active faults", title_style="bold red"
        )
        table.add_column("op", no_wrap=True, min_width=max(len(v.op) for v in active))
        table.add_column("host", no_wrap=True, min_width=max(len(v.host) for v in active))
        table.add_column("for", no_wrap=True, justify="right", min_width=4)
        table.add_column("heals in", no_wrap=True, justify="right")
        table.add_column("what", no_wrap=True, overflow="ellipsis", ratio=1)
        for view in active:
            since = (now_ns - view.applied_ns) / 1e9
            left = view.duration_s - since if view.duration_s is not None else None
            table.add_row(
                escape(view.op),
                escape(view.host),
                f"{since:.0f}s",
                f"{max(left, 0):.0f}s" if left is not None else "-",
                escape(view.description),
            )
        parts.append(table)
    else:
        parts.append(Text("active faults: none", style="green"))
    per_host = {h: sum(1 for v in state.applied.values() if v.host == h) for h in sorted(state.hosts)}
    parts.append(Text("hosts: " + ", ".join(f"{host_label(h)} ({n} active)" for h, n in per_host.items())))
    workers = [
        f"rank {r}: pid {w.pid}" + (f" @{w.host}" if w.host != "local" else "") for r, w in sorted(state.ranks.items())
    ]
    workers += [f"{name}: pid {w.pid} {w.detail}".rstrip() for name, w in sorted(state.replicas.items())]
    if workers:
        parts.append(Text(("ranks: " if state.ranks else "replicas: ") + "; ".join(workers)))
    room = max(2, min(10, height - 12 - len(active)))
    recent = list(state.recent)[-room:]
    events = Table(
        box=None, pad_edge=False, expand=True, show_header=False, title="recent events", title_justify="left"
    )
    events.add_column("at", no_wrap=True, min_width=7, justify="right")
    events.add_column("kind", no_wrap=True, min_width=min(24, max((len(e.kind) for e in recent), default=0)))
    events.add_column("detail", no_wrap=True, overflow="ellipsis", ratio=1)
    for event in recent:
        at, kind, detail = describe_event(event, state.started_ns)
        events.add_row(at, escape(kind), escape(detail))
    parts.append(events if recent else Text("recent events: none yet"))
    parts.append(Text(KEYS, style="dim", no_wrap=True, overflow="ellipsis"))
    if typing is not None:
        parts.append(Text(f"> {typing}▌", style="bold"))
    return Panel(Group(*parts), title=f"game day: {session.scenario.name}", title_align="left")


# -- the outcome --------------------------------------------------------------------------------------------------


def _outcome(session: GameDay) -> int:
    """Print how the run ended; the exit code (3 when interrupted, else the run's own)."""
    result = session.result
    if result is None:
        _err.print(f"[red]harness error: {escape(repr(session.crash))}[/red]")
        return EXIT_HARNESS
    if session.interrupted:
        _out.print(f"interrupted: healed {session.healed_since_signal()} fault(s)")
    print_results(_out, result)
    leftover = journal_dir() / f"{result.run_dir.name}.jsonl"
    if leftover.exists():
        _err.print(
            f"[red]the journal {escape(str(leftover))} still lists faults: run `mlchaos cleanup` to heal them[/red]"
        )
        return EXIT_HARNESS
    if session.interrupted:
        _out.print(f"exit {EXIT_HARNESS}: the game day was interrupted (every fault it applied is healed)")
        return EXIT_HARNESS
    return result.exit_code


def print_results(console: Console, result: RunResult) -> None:
    """The verdict table, error and report folder, as ``mlchaos run`` prints them."""
    table = Table(title=f"{result.scenario.name}: {result.verdict.upper()}")
    for column in ("check", "result", "measured", "bound", "why"):
        table.add_column(column)
    for check in result.results:
        style = _STATUS_STYLE[check.status]
        table.add_row(
            escape(check.name),
            f"[{style}]{check.status}[/{style}]",
            escape(check.measured_text()),
            escape(check.bound or ""),
            escape("" if check.status == "pass" else check.reason),
        )
    if (restarts := restarts_row_of(result)) is not None:  # every torchrun run: the restarts its launcher used
        table.add_row(*(escape(cell) for cell in restarts.cells()))
    if result.results or restarts is not None:
        console.print(table)
    else:
        console.print(f"{escape(result.scenario.name)}: {result.verdict.upper()} (the scenario has no checks)")
    if result.error:
        _err.print(f"[red]{escape(result.error)}[/red]")
    console.print(f"ended by: {escape(result.ended_by)}; reports: {result.run_dir}")
    if (result.run_dir / REPORT_HTML).exists():
        console.print(f"report: {result.run_dir / REPORT_HTML}")  # the page to open first


def main() -> None:
    """``python -m chaos.cli.gameday gameday FILE …``: the command without the rest of the CLI."""
    app = typer.Typer(add_completion=False)

    @app.callback()
    def _group() -> None:
        """mlchaos game day (standalone)."""

    register(app)
    app()


if __name__ == "__main__":
    main()
