"""A suite as a recurring Slurm job: a self-resubmitting ``sbatch --begin`` script (``mlchaos suite schedule --slurm``).

Why not ``scrontab``: it needs ``ScronParameters=enable`` in the cluster's slurm.conf, which a chaos team
rarely controls on a shared cluster, and Debian 12's ``slurm-client`` (22.05) does not ship the ``scrontab``
command at all. A batch script that submits its own next run needs nothing but ``sbatch``.

The script (:func:`script_text`), each time it runs:

1. submits its next run first, ``sbatch --begin=now+<every>`` of the same file, so a suite that crashes or
   is killed still leaves the schedule in place; with ``runs`` set it counts down in ``MLCHAOS_RUNS_LEFT``
   and the last run submits nothing;
2. runs ``mlchaos suite run`` with the given report folder, run-history file, textfile and inventory.

``--dependency=singleton`` (same job name, same user) keeps two runs from overlapping when a suite takes
longer than the interval: the next one waits in the queue. Every value in the script is shell-quoted. The
job's own exit code is the suite's (1: a check failed), so ``sacct`` shows a failing suite as FAILED.
Stop the schedule with ``scancel --name <job name>`` (the pending next run).
"""

from __future__ import annotations

import math
import re
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

RUNS_LEFT_ENV = "MLCHAOS_RUNS_LEFT"
_JOB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")


@dataclass(frozen=True)
class SlurmSchedule:
    """What the recurring job runs and how often."""

    suite: Path
    """The suite file or folder (absolute: the job runs in its own working directory)."""
    script: Path
    """Where the script is written; the job resubmits this very file (absolute)."""
    every_s: float
    """Seconds from the start of one run to the earliest start of the next."""
    job_name: str = "mlchaos-suite"
    runs: int | None = None
    """Stop after this many runs (None: until cancelled)."""
    workdir: Path = field(default_factory=Path.cwd)
    output: Path | None = None
    """The job's stdout/stderr (``%j`` is the job id); default ``<workdir>/<job name>-%j.out``."""
    suite_args: tuple[str, ...] = ()
    """Further ``mlchaos suite run`` options (``--report-dir``, ``--history``, ``--textfile``, ``--inventory``)."""
    slurm_conf: Path | None = None
    """Export ``SLURM_CONF`` in the job (a testbed's conf; None: the cluster's default)."""
    partition: str | None = None
    mlchaos: tuple[str, ...] = (sys.executable, "-m", "chaos.cli")
    """How the job starts mlchaos (default: this interpreter, so the same install and venv)."""

    def check(self) -> None:
        """ValueError naming the first setting the script cannot hold."""
        if not self.suite.is_absolute() or not self.script.is_absolute() or not self.workdir.is_absolute():
            raise ValueError("the suite, the script and the working directory must be absolute paths")
        if not math.isfinite(self.every_s) or self.every_s < 1:
            raise ValueError(f"the interval must be at least 1 second, got {self.every_s!r}")
        if not _JOB_NAME.match(self.job_name):
            raise ValueError(f"job name {self.job_name!r}: letters, digits, '_', '.', '-' only")
        if self.runs is not None and self.runs < 1:
            raise ValueError(f"runs must be at least 1, got {self.runs}")
        if self.partition is not None and not _JOB_NAME.match(self.partition):
            raise ValueError(f"partition {self.partition!r}: letters, digits, '_', '.', '-' only")
        if any("\n" in word for word in (*self.suite_args, *self.mlchaos)):
            raise ValueError("arguments must be single lines")
        for path in (self.workdir, self.output):  # #SBATCH lines are not shell: no quoting there
            if path is not None and re.search(r"\s", str(path)):
                raise ValueError(f"{path}: a path in an #SBATCH line cannot hold whitespace")


def begin_option(seconds: float) -> str:
    """``--begin=now+N`` (Slurm counts seconds by default)."""
    return f"--begin=now+{max(1, math.ceil(seconds))}"


def script_text(schedule: SlurmSchedule) -> str:
    """The batch script of ``schedule`` (module doc); ValueError from :meth:`SlurmSchedule.check`."""
    schedule.check()
    q = shlex.quote
    output = schedule.output or schedule.workdir / f"{schedule.job_name}-%j.out"
    header = [
        "#!/bin/bash",
        f"#SBATCH --job-name={schedule.job_name}",
        "#SBATCH --nodes=1",
        "#SBATCH --ntasks=1",
        "#SBATCH --dependency=singleton",
        f"#SBATCH --chdir={schedule.workdir}",
        f"#SBATCH --output={output}",
        "#SBATCH --open-mode=append",
    ]
    if schedule.partition is not None:
        header.append(f"#SBATCH --partition={schedule.partition}")
    runs = "" if schedule.runs is None else str(schedule.runs)
    sbatch = ["sbatch", "--parsable", begin_option(schedule.every_s)]
    run = [*schedule.mlchaos, "suite", "run", str(schedule.suite), *schedule.suite_args]
    body = [
        "# Written by `mlchaos suite schedule --slurm`: runs the suite, and submits its own next run first.",
        "# Stop the schedule: scancel --name " + q(schedule.job_name),
        "set -u",
    ]
    if schedule.slurm_conf is not None:
        body.append(f"export SLURM_CONF={q(str(schedule.slurm_conf))}")
    body += [
        f'left="${{{RUNS_LEFT_ENV}-{runs}}}"',
        'if [ -z "$left" ] || [ "$left" -gt 1 ]; then',
        '  next=""',
        '  if [ -n "$left" ]; then next=$((left - 1)); fi',
        f'  {" ".join(q(w) for w in sbatch)} --export=ALL,{RUNS_LEFT_ENV}="$next" '
        f"{q(str(schedule.script))} || echo 'mlchaos: could not submit the next run' >&2",
        "fi",
        'echo "mlchaos: suite run (job ${SLURM_JOB_ID:-?}, runs left counting this one: ${left:-unbounded})"',
        "exec " + " ".join(q(w) for w in run),
    ]
    return "\n".join(header + body) + "\n"


def write_script(schedule: SlurmSchedule) -> Path:
    """Write the script (mode 0755) and return its path."""
    text = script_text(schedule)
    schedule.script.parent.mkdir(parents=True, exist_ok=True)
    schedule.script.write_text(text)
    schedule.script.chmod(0o755)
    return schedule.script


def first_submit_options(begin: str | None) -> Sequence[str]:
    """sbatch options of the first submission: ``--begin=<begin>`` when given (``now``, ``03:17``, ``now+1hour``)."""
    if begin is None:
        return ()
    if not re.match(r"^[A-Za-z0-9:+\-T]+$", begin):
        raise ValueError(f"--begin {begin!r}: Slurm's time forms only (now, now+1hour, 03:17, 2026-12-01T03:17)")
    return (f"--begin={begin}",)
