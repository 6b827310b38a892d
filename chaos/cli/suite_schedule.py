"""``mlchaos suite schedule --slurm``: write (and optionally submit) a self-resubmitting Slurm batch script that
runs a suite every interval (:mod:`chaos.suite.slurm_schedule`). Exit codes: 0 written (and submitted);
2 invalid input; 3 sbatch failed."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from chaos.cli.console import stderr_console, stdout_console
from chaos.spec.units import parse_duration
from chaos.suite.slurm_schedule import SlurmSchedule, first_submit_options, script_text, write_script

EXIT_INVALID = 2
EXIT_SBATCH = 3

_out = stdout_console()
_err = stderr_console()

_OptPath = Path | None  # noqa: UP007


def schedule(
    suite: Annotated[Path, typer.Argument(help="a suite file or a folder of scenarios")],
    slurm: Annotated[bool, typer.Option("--slurm", help="as a recurring Slurm job (the only kind here)")] = False,
    every: Annotated[
        str, typer.Option(help="from one run's start to the next's earliest start, e.g. 1d, 6h, 30s")
    ] = "1d",
    script: Annotated[_OptPath, typer.Option(help="where to write the batch script")] = None,
    submit: Annotated[bool, typer.Option("--submit", help="also submit the first run now (sbatch)")] = False,
    begin: Annotated[
        str | None,  # noqa: UP007
        typer.Option(help="with --submit: the first run's --begin (now, 03:17, now+1hour); default: at once"),
    ] = None,
    runs: Annotated[
        int | None, typer.Option(min=1, help="stop after this many runs (default: until cancelled)")
    ] = None,  # noqa: UP007
    job_name: Annotated[str, typer.Option(help="the Slurm job name (scancel --name stops the schedule)")] = (
        "mlchaos-suite"
    ),
    partition: Annotated[str | None, typer.Option(help="the Slurm partition")] = None,  # noqa: UP007
    slurm_conf: Annotated[_OptPath, typer.Option(help="export SLURM_CONF in the job (a testbed's slurm.conf)")] = None,
    report_dir: Annotated[_OptPath, typer.Option(help="suite run --report-dir")] = None,
    history: Annotated[_OptPath, typer.Option(help="suite run --history")] = None,
    textfile: Annotated[_OptPath, typer.Option(help="suite run --textfile")] = None,
    inventory: Annotated[_OptPath, typer.Option(help="suite run --inventory")] = None,
    output: Annotated[_OptPath, typer.Option(help="the job's log (%j = job id)")] = None,
) -> None:
    """Run a suite as a recurring Slurm job: a batch script that submits its own next run (sbatch --begin)."""
    if not slurm:
        _err.print(
            "[red]error[/red] only --slurm is scheduled by mlchaos itself; for cron, systemd timers and Kubernetes "
            "CronJobs see docs/scheduling.md"
        )
        raise typer.Exit(EXIT_INVALID)
    if not suite.exists():
        _err.print(f"[red]error[/red] {escape(str(suite))}: no such suite file or folder")
        raise typer.Exit(EXIT_INVALID)
    args: list[str] = []
    for option, value in (("--report-dir", report_dir), ("--history", history), ("--textfile", textfile)):
        if value is not None:
            args += [option, str(value.resolve())]
    if inventory is not None:
        args += ["--inventory", str(inventory.resolve())]
    try:
        plan = SlurmSchedule(
            suite=suite.resolve(),
            script=(script or Path(f"{job_name}.sbatch")).resolve(),
            every_s=parse_duration(every),
            job_name=job_name,
            runs=runs,
            output=None if output is None else output.resolve(),
            suite_args=tuple(args),
            slurm_conf=None if slurm_conf is None else slurm_conf.resolve(),
            partition=partition,
        )
        script_text(plan)
        first = first_submit_options(begin)
    except ValueError as exc:
        _err.print(f"[red]error[/red] {escape(str(exc))}")
        raise typer.Exit(EXIT_INVALID) from None
    path = write_script(plan)
    _out.print(f"wrote {escape(str(path))}: runs {escape(str(plan.suite))} every {every} as Slurm job {job_name}")
    if not submit:
        _out.print(f"start it with: sbatch {escape(str(path))}   stop it with: scancel --name {job_name}")
        return
    from chaos.cluster.local import LocalTransport
    from chaos.slurm.client import SlurmClient, SlurmError

    client = SlurmClient(LocalTransport(), conf=None if plan.slurm_conf is None else str(plan.slurm_conf))
    try:
        job_id = client.submit(path, extra=first)
    except SlurmError as exc:
        _err.print(f"[red]error[/red] {escape(str(exc))}")
        raise typer.Exit(EXIT_SBATCH) from None
    _out.print(f"submitted job {job_id}; stop the schedule with: scancel --name {job_name}")
