"""Suites: many scenario runs in one go, for schedules (cron, systemd timers, Kubernetes CronJobs) and CI.

A suite is a folder (every scenario ``*.yaml``/``*.yml`` in it; other YAML is skipped) or a suite file::

    name: nightly
    description: training faults against staging
    seed: 7                  # seeds the shuffle; --seed overrides
    shuffle: false           # --shuffle turns it on
    repeat: 1                # rounds over the whole list; --repeat overrides
    inventory: staging.yaml  # default inventory for every entry; --inventory overrides it
    scenarios:
      - ../scenarios/kill-rank.yaml
      - file: ../scenarios/s*.yaml     # a glob (or a folder): every scenario it matches
        seed: 3                        # overrides the scenarios' own seed
        repeat: 2                      # runs per round
        inventory: serving.yaml        # this entry's inventory (beats --inventory and the suite's)

Paths are relative to the suite file. Everything is loaded and validated before anything runs: a problem
names file:line:column and nothing starts (exit 2). Runs go one at a time through
:func:`chaos.run.orchestrator.execute` (which heals every fault it applied); each is recorded to the run-history store
as soon as it ends; after the last run (or an interruption, or ``fail_fast``) the Prometheus metrics are
written. Exit code: the worst run's (0 pass, 1 a check failed, 2 a run was refused, 3 harness error), 3 when
interrupted or when the store or the metrics could not be written.
"""

from __future__ import annotations

import dataclasses
import difflib
import glob
import os
import random
import re
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Protocol

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError
from pydantic_core import ErrorDetails

from chaos.run.orchestrator import RunOptions, execute
from chaos.run.result import EXIT_HARNESS, EXIT_PASS, RunResult
from chaos.safety.signals import signals_raise
from chaos.spec.scenario import (
    Path_,
    Problem,
    Scenario,
    ScenarioError,
    load_scenario,
    problem_for,
    read_yaml_mapping,
)
from chaos.suite import metrics
from chaos.suite.store import ENV_HISTORY, VERDICT_MARK, RunStore, StoreError, derived_metrics

NAME_PATTERN = r"^[A-Za-z0-9_.-]+$"
HISTORY_NAME = "mlchaos-history.sqlite"
_STRICT = ConfigDict(extra="forbid", frozen=True)


class SuiteError(ScenarioError):
    """A suite (its file, or a scenario it names) could not be loaded; ``problems`` has file:line:column."""


def _entry_from_string(value: object) -> object:
    return {"file": value} if isinstance(value, str) else value


class SuiteEntry(BaseModel):
    """One line of a suite: a scenario file, a glob or a folder, with optional overrides."""

    model_config = _STRICT
    file: str = Field(min_length=1, description="scenario file, glob or folder, relative to the suite file")
    seed: int | None = Field(default=None, description="overrides each matched scenario's own seed")
    repeat: int = Field(default=1, ge=1, description="runs of each matched scenario per round")
    inventory: str | None = Field(default=None, description="inventory for these runs (relative to the suite file)")


class SuiteSpec(BaseModel):
    """A suite file as written."""

    model_config = _STRICT
    name: str = Field(pattern=NAME_PATTERN)
    description: str = ""
    seed: int | None = Field(default=None, description="seeds the shuffle (--seed overrides)")
    shuffle: bool = False
    repeat: int = Field(default=1, ge=1, description="rounds over the whole list (--repeat overrides)")
    inventory: str | None = Field(default=None, description="default inventory (--inventory overrides)")
    scenarios: list[Annotated[SuiteEntry, BeforeValidator(_entry_from_string)]] = Field(min_length=1)


@dataclass(frozen=True)
class SuiteItem:
    """One scenario of a loaded suite with its entry's overrides (paths resolved against the suite file)."""

    file: Path
    scenario: Scenario
    seed: int | None = None
    repeat: int = 1
    inventory: Path | None = None


@dataclass(frozen=True)
class Suite:
    """A validated suite: every scenario loaded, in file order."""

    name: str
    items: list[SuiteItem]
    file: Path | None = None
    seed: int | None = None
    shuffle: bool = False
    repeat: int = 1
    inventory: Path | None = None


@dataclass(frozen=True)
class PlannedRun:
    """One run the suite will do: which scenario, with which seed (``seed_override`` None: its own)."""

    item: SuiteItem
    round: int
    seed_override: int | None
    inventory: Path | None

    @property
    def seed(self) -> int:
        return self.item.scenario.seed if self.seed_override is None else self.seed_override


# -- loading ---------------------------------------------------------------------------------------------


def looks_like_scenario(path: Path) -> bool:
    """Whether ``path`` holds one YAML mapping with ``name`` and ``target`` (what every scenario has). A file
    that does not parse counts as one, so its syntax error is reported rather than the file skipped."""
    try:
        documents = list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
    except yaml.YAMLError:
        return True
    except (OSError, UnicodeDecodeError):
        return False
    return len(documents) == 1 and isinstance(documents[0], dict) and {"name", "target"} <= documents[0].keys()


def _scenario_files(folder: Path) -> list[Path]:
    return sorted(p for p in [*folder.glob("*.yaml"), *folder.glob("*.yml")] if p.is_file() and looks_like_scenario(p))


def _load_items(
    files: list[Path], problems: list[Problem], seed: int | None = None, repeat: int = 1, inventory: Path | None = None
) -> list[SuiteItem]:
    items = []
    for file in files:
        try:
            items.append(SuiteItem(file, load_scenario(file), seed, repeat, inventory))
        except ScenarioError as exc:
            problems.extend(exc.problems)
    return items


def load_suite(path: Path | str) -> Suite:
    """A suite from a folder (every scenario in it), a suite file, or a single scenario file (a suite of
    one). Raises SuiteError listing every problem (the suite file's and its scenarios')."""
    target = Path(path)
    if target.is_dir():
        problems: list[Problem] = []
        files = _scenario_files(target)
        if not files:
            raise SuiteError([Problem(str(target), 1, 1, "no scenario YAML in this folder", "add *.yaml scenarios")])
        items = _load_items(files, problems)
        if problems:
            raise SuiteError(problems)
        name = re.sub(r"[^A-Za-z0-9_.-]", "-", target.resolve().name) or "suite"
        return Suite(name=name, items=items)
    try:
        text = target.read_text(encoding="utf-8")
    except OSError as exc:
        raise SuiteError([Problem(str(target), 1, 1, f"cannot read suite: {exc.strerror}", "check the path")]) from None
    if looks_like_scenario(target):
        scenario = load_scenario(target)  # ScenarioError: a broken scenario given on its own
        return Suite(name=scenario.name, items=[SuiteItem(target, scenario)], file=target)
    return parse_suite(text, str(target), base_dir=target.parent)


def parse_suite(text: str, file: str = "<string>", *, base_dir: Path | None = None) -> Suite:
    """Validate suite YAML ``text`` and load every scenario it names (paths relative to ``base_dir``, default
    the cwd). Raises SuiteError with every problem found: the file's own and those of each entry it could
    read (a typo in one entry does not hide a missing file in another)."""
    base = base_dir if base_dir is not None else Path.cwd()
    data, marks, problems = read_yaml_mapping(
        text, file, what="a suite", hint="start with name: my-suite and a scenarios: list", error=SuiteError
    )
    try:
        spec = SuiteSpec.model_validate(data)
    except ValidationError as exc:
        problems.extend(_entry_hint(problem_for(dict(e), data, marks, file, SuiteSpec), e) for e in exc.errors())
        raw = data.get("scenarios")
        for index, item in enumerate(raw if isinstance(raw, list) else []):
            try:
                entry = SuiteEntry.model_validate(_entry_from_string(item))
            except ValidationError:
                continue  # already reported above
            _resolve_entry(entry, index, base, file, marks, problems)
        raise SuiteError(list(dict.fromkeys(problems))) from None
    items: list[SuiteItem] = []
    for index, entry in enumerate(spec.scenarios):
        items.extend(_resolve_entry(entry, index, base, file, marks, problems))
    if problems:
        raise SuiteError(list(dict.fromkeys(problems)))  # two entries naming one broken file: one report
    return Suite(
        name=spec.name,
        items=items,
        file=Path(file),
        seed=spec.seed,
        shuffle=spec.shuffle,
        repeat=spec.repeat,
        inventory=base / spec.inventory if spec.inventory is not None else None,
    )


def _entry_hint(problem: Problem, error: ErrorDetails) -> Problem:
    """A did-you-mean for an unknown key inside a ``scenarios`` entry (the shared error mapper finds no owner
    model for an item of a plain list, so it offers no hint there)."""
    loc = error["loc"]
    if problem.hint or len(loc) != 3 or loc[0] != "scenarios" or not isinstance(loc[2], str):
        return problem
    close = difflib.get_close_matches(loc[2], sorted(SuiteEntry.model_fields), n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}?" if close else "valid keys: " + ", ".join(sorted(SuiteEntry.model_fields))
    return dataclasses.replace(problem, hint=hint)


def _resolve_entry(
    entry: SuiteEntry, index: int, base: Path, file: str, marks: dict[Path_, tuple[int, int]], problems: list[Problem]
) -> list[SuiteItem]:
    """The scenarios one entry names: a glob (every scenario it matches, never the suite file itself), a
    folder (every scenario in it) or a file (which must be a valid scenario). Problems go to ``problems``."""
    line, column = marks.get(("scenarios", index, "file"), marks.get(("scenarios", index), (1, 1)))
    inventory = base / entry.inventory if entry.inventory is not None else None
    pattern = base / entry.file
    if glob.has_magic(entry.file):
        matched = [Path(p) for p in sorted(glob.glob(str(pattern), recursive=True))]
        files = [p for p in matched if p.is_file() and p.resolve() != Path(file).resolve() and looks_like_scenario(p)]
        if not files:
            problems.append(Problem(file, line, column, f"{entry.file!r} matches no scenario file", "check the glob"))
    elif pattern.is_dir():
        files = _scenario_files(pattern)
        if not files:
            problems.append(Problem(file, line, column, f"no scenario YAML in folder {entry.file!r}", ""))
    elif not pattern.is_file():
        problems.append(Problem(file, line, column, f"no such scenario file {entry.file!r}", f"looked at {pattern}"))
        files = []
    else:
        files = [pattern]
    return _load_items(files, problems, entry.seed, entry.repeat, inventory)


def plan_runs(
    suite: Suite,
    *,
    repeat: int | None = None,
    shuffle: bool = False,
    seed: int | None = None,
    inventory: Path | None = None,
) -> tuple[list[PlannedRun], int | None]:
    """The runs in order: ``repeat`` rounds (default the suite's) over every item, each item ``item.repeat``
    times in a row; shuffled (the whole list) with ``random.Random(seed)`` when ``shuffle`` or the suite says
    so. Returns the runs and the shuffle seed used (drawn and returned when none was given, so the order can
    be replayed), or None when not shuffled. Inventory: the entry's, else ``inventory``, else the suite's."""
    rounds = repeat if repeat is not None else suite.repeat
    runs = [
        PlannedRun(item, round_, item.seed, item.inventory or inventory or suite.inventory)
        for round_ in range(1, rounds + 1)
        for item in suite.items
        for _ in range(item.repeat)
    ]
    if not (shuffle or suite.shuffle):
        return runs, None
    used = seed if seed is not None else suite.seed if suite.seed is not None else secrets.randbelow(2**31)
    random.Random(used).shuffle(runs)
    return runs, used


# -- running ---------------------------------------------------------------------------------------------


class SuiteListener(Protocol):
    """What a suite reports as it goes (the CLI prints it)."""

    def started(self, position: int, total: int, run: PlannedRun) -> None: ...
    def finished(self, position: int, total: int, run: PlannedRun, result: RunResult, seconds: float) -> None: ...
    def notice(self, line: str) -> None: ...
    def log(self, line: str) -> None: ...  # the runner's own lines (fault applied, healed, ...)


@dataclass
class SuiteOptions:
    """How to run a suite. ``history`` None: ``$MLCHAOS_HISTORY``, else ``<report_dir>/mlchaos-history.sqlite``;
    ``textfile`` None: ``<report_dir>/mlchaos.prom``; ``pushgateway`` None: ``$MLCHAOS_PUSHGATEWAY`` if set."""

    report_dir: Path = Path("reports")
    repeat: int | None = None
    shuffle: bool = False
    seed: int | None = None
    inventory: Path | None = None
    history: Path | None = None
    textfile: Path | None = None
    pushgateway: str | None = None
    fail_fast: bool = False
    golden: bool = True
    golden_cache: bool = True


@dataclass
class CompletedRun:
    """A run the suite did, its result, its wall time (golden run included) and its id in the store."""

    planned: PlannedRun
    result: RunResult
    seconds: float
    run_id: int | None = None
    record_failed: bool = False


@dataclass
class SuiteOutcome:
    """What a suite did: the runs it completed (fewer than planned when stopped early) and its exit code."""

    suite: Suite
    planned: list[PlannedRun]
    completed: list[CompletedRun] = field(default_factory=list)
    shuffle_seed: int | None = None
    exit_code: int = EXIT_PASS
    interrupted: bool = False
    stopped_early: str = ""
    problems: list[str] = field(default_factory=list)  # store/metrics failures (exit 3)
    history: Path | None = None
    textfile: Path | None = None
    suite_id: int | None = None


def history_path(options: SuiteOptions) -> Path:
    """``options.history``, else ``$MLCHAOS_HISTORY``, else ``<report_dir>/mlchaos-history.sqlite``."""
    env = os.environ.get(ENV_HISTORY)
    return options.history or (Path(env) if env else options.report_dir / HISTORY_NAME)


def run_suite(suite: Suite, options: SuiteOptions, listener: SuiteListener) -> SuiteOutcome:
    """Run every planned run in order, recording each to the store; then write the metrics. Never raises
    for a run's failure, an interruption (Ctrl-C/SIGTERM: the current run heals, the loop stops) or a
    store/metrics failure: all end up in the outcome and its exit code. Raises StoreError when the store
    cannot be opened at all (before anything ran)."""
    planned, shuffle_seed = plan_runs(
        suite, repeat=options.repeat, shuffle=options.shuffle, seed=options.seed, inventory=options.inventory
    )
    outcome = SuiteOutcome(suite, planned, shuffle_seed=shuffle_seed, history=history_path(options))
    store = RunStore.open(outcome.history)
    started_ts = time.time()
    try:
        try:
            outcome.suite_id = store.begin_suite(
                suite.name, file=str(suite.file) if suite.file else None, seed=shuffle_seed, planned=len(planned)
            )
        except StoreError as exc:  # runs are still recorded, without their suite id
            outcome.problems.append(f"run history: {exc}")
        if shuffle_seed is not None:
            listener.notice(
                f"shuffled with seed {shuffle_seed} (replay this order with --shuffle --seed {shuffle_seed})"
            )
        # SIGTERM/SIGHUP between runs act like Ctrl-C: the loop stops and what ran is recorded. During a run,
        # execute() installs its own handlers (heal first), then restores these.
        with signals_raise(KeyboardInterrupt):
            _loop(outcome, options, listener, store)
        for completed in outcome.completed:  # a signal inside a store write rolled it back: record it now
            if completed.run_id is None and not completed.record_failed:
                _record(completed, outcome, store)
        outcome.exit_code = _exit_code(outcome)
        _write_metrics(outcome, options, listener, started_ts)
        outcome.exit_code = _exit_code(outcome)
        if outcome.suite_id is not None:
            try:
                store.end_suite(outcome.suite_id, outcome.exit_code)
            except StoreError as exc:
                outcome.problems.append(f"run history: {exc}")
                outcome.exit_code = _exit_code(outcome)
    finally:
        store.close()
    return outcome


def _loop(outcome: SuiteOutcome, options: SuiteOptions, listener: SuiteListener, store: RunStore) -> None:
    total = len(outcome.planned)
    position = 0
    try:
        for position, run in enumerate(outcome.planned, start=1):
            if not _one_run(position, total, run, outcome, options, listener, store):
                return
    except KeyboardInterrupt as exc:  # outside execute's own handling (golden run, reports, between runs)
        outcome.interrupted = True
        outcome.stopped_early = f"interrupted ({exc or 'SIGINT'}) during run {position}/{total}"


def _one_run(
    position: int,
    total: int,
    run: PlannedRun,
    outcome: SuiteOutcome,
    options: SuiteOptions,
    listener: SuiteListener,
    store: RunStore,
) -> bool:
    """Do and record one run; False when the suite must stop (interrupted, harness error, --fail-fast)."""
    listener.started(position, total, run)
    run_options = RunOptions(
        report_root=options.report_dir,
        seed=run.seed_override,
        golden=options.golden,
        golden_cache=options.golden_cache,
        scenario_file=run.item.file,
        inventory=run.inventory,
    )
    began = time.monotonic()
    try:
        result = execute(run.item.scenario, run_options, log=listener.log)
    except Exception as exc:  # e.g. an unwritable report folder: the next run would fail the same way
        outcome.problems.append(f"harness error in run {position}/{total}: {type(exc).__name__}: {exc}")
        outcome.stopped_early = f"harness error in run {position}/{total}"
        return False
    completed = CompletedRun(run, result, time.monotonic() - began)
    outcome.completed.append(completed)
    _record(completed, outcome, store)
    listener.finished(position, total, run, result, completed.seconds)
    if result.ended_by == "interrupted":
        outcome.interrupted = True
        outcome.stopped_early = f"interrupted during run {position}/{total} (its faults were healed)"
        return False
    if options.fail_fast and result.verdict != "pass":
        outcome.stopped_early = f"--fail-fast: run {position}/{total} ({run.item.scenario.name}) did not pass"
        return False
    return True


def _record(completed: CompletedRun, outcome: SuiteOutcome, store: RunStore) -> None:
    try:
        completed.run_id = store.record_run(completed.result, outcome.suite.name, suite_id=outcome.suite_id)
    except StoreError as exc:  # keep running: the run's reports are on disk regardless
        completed.record_failed = True
        outcome.problems.append(f"run history: {completed.result.scenario.name}: {exc}")


def _exit_code(outcome: SuiteOutcome) -> int:
    worst = max((c.result.exit_code for c in outcome.completed), default=EXIT_PASS)
    if outcome.interrupted or outcome.problems:
        worst = EXIT_HARNESS
    return worst


def _write_metrics(outcome: SuiteOutcome, options: SuiteOptions, listener: SuiteListener, started_ts: float) -> None:
    results = [c.result for c in outcome.completed]
    registry = metrics.suite_registry(outcome.suite.name, results, exit_code=outcome.exit_code, started_ts=started_ts)
    outcome.textfile = options.textfile or options.report_dir / metrics.TEXTFILE_NAME
    try:
        metrics.write_textfile(registry, outcome.textfile)
    except metrics.MetricsError as exc:
        outcome.problems.append(str(exc))
    url = metrics.pushgateway_url(options.pushgateway)
    if url is not None:
        try:
            metrics.push(registry, url, outcome.suite.name)
            listener.notice(f"metrics pushed to {url} (job {metrics.JOB}, suite {outcome.suite.name})")
        except metrics.MetricsError as exc:
            outcome.problems.append(str(exc))


# -- summaries -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScenarioSummary:
    """One scenario over a suite's completed runs (the summary table's row)."""

    scenario: str
    runs: int
    passed: int
    verdicts: str
    detection_max_s: float | None
    recovery_max_s: float | None
    mean_seconds: float
    failing: dict[str, int]  # check name -> runs in which it failed or was unknown


def summarize(outcome: SuiteOutcome) -> list[ScenarioSummary]:
    """Per scenario, in order of first appearance."""
    grouped: dict[str, list[CompletedRun]] = {}
    for completed in outcome.completed:
        grouped.setdefault(completed.result.scenario.name, []).append(completed)
    summaries = []
    for name, runs in grouped.items():
        timings: dict[str, list[float]] = {}
        failing: dict[str, int] = {}
        for completed in runs:
            for metric in derived_metrics(completed.result.results):
                timings.setdefault(metric.metric, []).append(metric.value)
            for check in completed.result.results:
                if check.status == "fail" or (
                    check.status == "unknown" and not completed.result.scenario.allow_unknown
                ):
                    failing[check.name] = failing.get(check.name, 0) + 1
            if completed.result.verdict == "error":
                failing["(harness)"] = failing.get("(harness)", 0) + 1
        detection, recovery = timings.get("detection_latency_s"), timings.get("recovery_s")
        summaries.append(
            ScenarioSummary(
                scenario=name,
                runs=len(runs),
                passed=sum(c.result.verdict == "pass" for c in runs),
                verdicts="".join(VERDICT_MARK.get(c.result.verdict, "?") for c in runs),
                detection_max_s=max(detection) if detection else None,
                recovery_max_s=max(recovery) if recovery else None,
                mean_seconds=sum(c.seconds for c in runs) / len(runs),
                failing=failing,
            )
        )
    return summaries


def progress_start(position: int, total: int, run: PlannedRun) -> str:
    """``[3/12] kill-rank (seed 7) …``"""
    width = len(str(total))
    return f"[{position:>{width}}/{total}] {run.item.scenario.name} (seed {run.seed}) …"


def progress_end(result: RunResult, seconds: float) -> str:
    """``pass in 31.2 s``, with what failed when it did not pass."""
    text = f"{result.verdict} in {seconds:.1f} s"
    bad = [r.name for r in result.results if r.status != "pass"]
    if result.verdict == "error":
        text += f" ({result.error or result.ended_by})"
    elif bad:
        text += f" ({', '.join(bad)})"
    return text
