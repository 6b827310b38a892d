"""The run-history store: every run (of a suite or not), its checks, derived timings and free notes, in one
SQLite file, so trends ("is detection getting slower?", "which scenario flakes?") are one query away.

Contracts:
- One file (default ``reports/mlchaos-history.sqlite``; ``$MLCHAOS_HISTORY`` or an explicit path override it),
  in WAL mode with a busy timeout: many processes (parallel suites, a game day writing notes) may write at
  once; every write is one ``BEGIN IMMEDIATE`` transaction, so a writer waits rather than failing.
- The schema is versioned in the ``meta`` table; a file written by a newer mlchaos is refused, never altered.
- ``synchronous=NORMAL``: a power cut may lose the last few runs' rows, never corrupt the file (history is a
  convenience; each run's reports on disk stay the record of truth).
- Derived timings key off check *types*: ``detected_within`` (detection latency), ``recovered_within``
  (recovery), ``failover_within`` / ``failback_within`` (serving), taken from the check's measured seconds.
"""

from __future__ import annotations

import getpass
import os
import socket
import sqlite3
import statistics
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from chaos.checks.base import CheckResult
from chaos.cluster.base import Closing
from chaos.event_kinds import RUNNER_START, RUNNER_VERDICT

if TYPE_CHECKING:
    from chaos.run.result import RunResult

ENV_HISTORY = "MLCHAOS_HISTORY"
ENV_GIT_COMMIT = "MLCHAOS_GIT_COMMIT"  # for images without a .git folder: bake the commit in at build time
DEFAULT_PATH = Path("reports") / "mlchaos-history.sqlite"
SCHEMA_VERSION = 1
BUSY_TIMEOUT_S = 30.0

# Check type -> derived metric name. Keyed by type, so a new check family only needs a line here.
DERIVED_METRICS: dict[str, str] = {
    "detected_within": "detection_latency_s",
    "recovered_within": "recovery_s",
    "failover_within": "failover_s",
    "failback_within": "failback_s",
}
VERDICT_MARK = {"pass": "✓", "fail": "✗", "error": "!"}

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS suites (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    file TEXT,
    seed INTEGER,
    planned INTEGER NOT NULL,
    started_ts REAL NOT NULL,
    ended_ts REAL,
    exit_code INTEGER,
    host TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    suite_id INTEGER REFERENCES suites(id),
    suite TEXT,
    scenario TEXT NOT NULL,
    scenario_file TEXT,
    seed INTEGER NOT NULL,
    started_ts REAL NOT NULL,
    ended_ts REAL NOT NULL,
    verdict TEXT NOT NULL CHECK (verdict IN ('pass', 'fail', 'error')),
    exit_code INTEGER NOT NULL,
    ended_by TEXT NOT NULL,
    error TEXT NOT NULL DEFAULT '',
    run_dir TEXT NOT NULL,
    host TEXT NOT NULL,
    git_commit TEXT
);
CREATE INDEX IF NOT EXISTS runs_by_scenario ON runs (scenario, started_ts);
CREATE INDEX IF NOT EXISTS runs_by_suite ON runs (suite_id);
CREATE TABLE IF NOT EXISTS checks (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    position INTEGER NOT NULL,
    name TEXT NOT NULL,
    type TEXT NOT NULL,
    status TEXT NOT NULL,
    measured REAL,
    measured_text TEXT NOT NULL,
    bound TEXT,
    unit TEXT NOT NULL,
    reason TEXT NOT NULL,
    PRIMARY KEY (run_id, position)
);
CREATE TABLE IF NOT EXISTS metrics (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    metric TEXT NOT NULL,
    check_name TEXT NOT NULL,
    value REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS metrics_by_run ON metrics (run_id);
CREATE TABLE IF NOT EXISTS notes (
    id INTEGER PRIMARY KEY,
    run_id INTEGER REFERENCES runs(id) ON DELETE SET NULL,
    ts REAL NOT NULL,
    author TEXT NOT NULL,
    kind TEXT NOT NULL,
    text TEXT NOT NULL
);
"""


class StoreError(Exception):
    """The history file cannot be opened, is from a newer mlchaos, or a write was refused (e.g. a bad run id)."""


@dataclass(frozen=True)
class DerivedMetric:
    """One timing taken from a check: ``metric`` (e.g. ``detection_latency_s``), the check's name, seconds."""

    metric: str
    check: str
    value: float


@dataclass(frozen=True)
class StoredRun:
    """One row of ``runs``. Timestamps are Unix seconds."""

    id: int
    suite_id: int | None
    suite: str | None
    scenario: str
    scenario_file: str | None
    seed: int
    started_ts: float
    ended_ts: float
    verdict: str
    exit_code: int
    ended_by: str
    error: str
    run_dir: str
    host: str
    git_commit: str | None

    @property
    def duration_s(self) -> float:
        return self.ended_ts - self.started_ts


@dataclass(frozen=True)
class StoredCheck:
    """One row of ``checks``: ``measured`` is the number when the check measured one, ``measured_text`` always."""

    name: str
    type: str
    status: str
    measured: float | None
    measured_text: str
    bound: str | None
    unit: str
    reason: str


@dataclass(frozen=True)
class Note:
    """A timestamped remark (``kind`` e.g. ``note`` or ``command``), optionally about one run."""

    id: int
    run_id: int | None
    ts: float
    author: str
    kind: str
    text: str


@dataclass(frozen=True)
class ScenarioTrend:
    """A scenario over its last ``runs`` recorded runs. Timings are per run (the worst check of that kind in
    the run), then the median (``p50``, the mean of the middle two for an even count) or max over runs;
    None when no run in the window measured one. ``sparkline`` marks each run oldest first: ✓ pass, ✗ fail,
    ! harness error or refused."""

    scenario: str
    runs: int
    passed: int
    pass_rate: float
    detection_p50_s: float | None
    detection_max_s: float | None
    recovery_p50_s: float | None
    failover_p50_s: float | None
    failback_p50_s: float | None
    last_verdict: str
    last_ts: float
    sparkline: str

    def as_dict(self) -> dict[str, object]:
        return {key: getattr(self, key) for key in self.__dataclass_fields__}


def default_path() -> Path:
    """``$MLCHAOS_HISTORY`` when set, else ``reports/mlchaos-history.sqlite`` (relative to the cwd)."""
    env = os.environ.get(ENV_HISTORY)
    return Path(env) if env else DEFAULT_PATH


def derived_metrics(results: Sequence[CheckResult]) -> list[DerivedMetric]:
    """The timings in ``results``: every check of a type in :data:`DERIVED_METRICS` that measured seconds
    (passed or failed: a too-slow detection is still a latency; an ``unknown`` one measured nothing)."""
    found = []
    for result in results:
        metric = DERIVED_METRICS.get(result.check)
        measured = result.measured
        if metric is not None and isinstance(measured, (int, float)) and not isinstance(measured, bool):
            found.append(DerivedMetric(metric, result.name, float(measured)))
    return found


def run_span(result: RunResult) -> tuple[float, float]:
    """(started, ended) Unix seconds of a run: its ``runner.start`` and ``runner.verdict`` events (first and
    last event when those are missing; now when the history is empty)."""
    events = result.history.events
    if not events:
        now = time.time()
        return now, now
    start = next((e for e in events if e.kind == RUNNER_START), events[0])
    end = next((e for e in reversed(events) if e.kind == RUNNER_VERDICT), events[-1])
    return start.ts_ns / 1e9, max(end.ts_ns, start.ts_ns) / 1e9


@cache
def git_commit(where: Path) -> str | None:
    """``$MLCHAOS_GIT_COMMIT``, else the HEAD commit of the git checkout holding ``where``; None outside one."""
    env = os.environ.get(ENV_GIT_COMMIT)
    if env:
        return env
    try:
        done = subprocess.run(
            ["git", "-C", str(where), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    commit = done.stdout.strip()
    return commit if done.returncode == 0 and commit else None


def _author() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # a container user without a passwd entry
        return "unknown"


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


class RunStore(Closing):
    """A connection to one history file. Open with :meth:`open`; usable as a context manager."""

    def __init__(self, connection: sqlite3.Connection, path: Path) -> None:
        self._db = connection
        self.path = path

    # -- opening -----------------------------------------------------------------------------------------
    @classmethod
    def open(cls, path: Path | str | None = None, *, timeout: float = BUSY_TIMEOUT_S) -> RunStore:
        """Open (creating it and its folder if needed) the history at ``path`` (default :func:`default_path`).
        Raises StoreError when it cannot be opened or was written by a newer schema."""
        file = Path(path) if path is not None else default_path()
        try:
            file.parent.mkdir(parents=True, exist_ok=True)
            # isolation_level=None: we issue BEGIN IMMEDIATE ourselves (a deferred transaction that later
            # writes can fail with SQLITE_BUSY under WAL instead of waiting for the busy timeout).
            db = sqlite3.connect(file, timeout=timeout, isolation_level=None, check_same_thread=False)
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"cannot open run history {file}: {exc}") from None
        store = cls(db, file)
        try:
            store._prepare()
        except sqlite3.Error as exc:
            db.close()
            raise StoreError(f"cannot use run history {file}: {exc}") from None
        except StoreError:
            db.close()
            raise
        return store

    def _prepare(self) -> None:
        self._db.execute("PRAGMA foreign_keys = ON")
        mode = self._db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":  # e.g. a filesystem without shared memory: still works, one writer
            self._db.execute("PRAGMA journal_mode = DELETE")
        self._db.execute("PRAGMA synchronous = NORMAL")
        with self._write("creating the schema"):
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    self._db.execute(statement)
            row = self._db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            if row is None:
                self._db.execute("INSERT INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            elif int(row[0]) > SCHEMA_VERSION:
                raise StoreError(
                    f"run history {self.path} has schema {row[0]}, newer than this mlchaos reads ({SCHEMA_VERSION}); "
                    "upgrade mlchaos or point --history at another file"
                )

    @contextmanager
    def _write(self, what: str) -> Iterator[None]:
        """One write transaction, taken up front (``BEGIN IMMEDIATE``) so concurrent writers queue on the
        busy timeout; rolled back on any error. SQLite errors become StoreError naming ``what`` failed."""
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise StoreError(f"{what} failed ({self.path}): {exc}") from exc
        try:
            yield
            self._db.execute("COMMIT")
        except BaseException as exc:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise StoreError(f"{what} failed ({self.path}): {exc}") from exc
            raise

    def close(self) -> None:
        self._db.close()

    @property
    def schema_version(self) -> int:
        row = self._db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        return int(row[0])

    # -- writing -----------------------------------------------------------------------------------------
    def begin_suite(self, name: str, *, file: str | None, seed: int | None, planned: int) -> int:
        """Record that a suite started ``planned`` runs; returns its id for :meth:`record_run`/:meth:`end_suite`."""
        with self._write("recording a suite"):
            cursor = self._db.execute(
                "INSERT INTO suites (name, file, seed, planned, started_ts, host) VALUES (?, ?, ?, ?, ?, ?)",
                (name, file, seed, planned, time.time(), socket.gethostname()),
            )
        return int(cursor.lastrowid or 0)

    def end_suite(self, suite_id: int, exit_code: int) -> None:
        with self._write("ending a suite"):
            self._db.execute(
                "UPDATE suites SET ended_ts = ?, exit_code = ? WHERE id = ?", (time.time(), exit_code, suite_id)
            )

    def record_run(self, result: RunResult, suite: str | None = None, *, suite_id: int | None = None) -> int:
        """Store one finished run with its checks and derived timings (one transaction); returns the run id."""
        started, ended = run_span(result)
        source = result.extra.get("scenario_file")
        scenario_file = str(source) if source is not None else None
        where = Path(scenario_file).resolve().parent if scenario_file else Path.cwd()
        row = (
            suite_id,
            suite,
            result.scenario.name,
            scenario_file,
            result.plan.seed,
            started,
            ended,
            result.verdict,
            result.exit_code,
            result.ended_by,
            result.error,
            str(result.run_dir),
            socket.gethostname(),
            git_commit(where),
        )
        checks = [
            (
                index,
                r.name,
                r.check,
                r.status,
                float(r.measured) if isinstance(r.measured, (int, float)) else None,
                r.measured_text(),
                r.bound,
                r.unit,
                r.reason,
            )
            for index, r in enumerate(result.results)
        ]
        with self._write(f"recording a run of {result.scenario.name!r}"):
            cursor = self._db.execute(
                "INSERT INTO runs (suite_id, suite, scenario, scenario_file, seed, started_ts, ended_ts, verdict, "
                "exit_code, ended_by, error, run_dir, host, git_commit) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                row,
            )
            run_id = int(cursor.lastrowid or 0)
            self._db.executemany(
                "INSERT INTO checks (run_id, position, name, type, status, measured, measured_text, bound, "
                "unit, reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(run_id, *check) for check in checks],
            )
            self._db.executemany(
                "INSERT INTO metrics (run_id, metric, check_name, value) VALUES (?, ?, ?, ?)",
                [(run_id, m.metric, m.check, m.value) for m in derived_metrics(result.results)],
            )
        return run_id

    def add_note(
        self,
        text: str,
        *,
        run_id: int | None = None,
        author: str | None = None,
        kind: str = "note",
        ts: float | None = None,
    ) -> int:
        """Store a note (``kind`` says what it is, e.g. ``note`` or ``command``); ``run_id`` must exist when
        given. Returns the note's id."""
        with self._write("adding a note"):
            if run_id is not None and self._db.execute("SELECT 1 FROM runs WHERE id = ?", (run_id,)).fetchone() is None:
                raise StoreError(f"no run with id {run_id} to attach the note to")
            cursor = self._db.execute(
                "INSERT INTO notes (run_id, ts, author, kind, text) VALUES (?, ?, ?, ?, ?)",
                (run_id, time.time() if ts is None else ts, author or _author(), kind, text),
            )
        return int(cursor.lastrowid or 0)

    # -- reading -----------------------------------------------------------------------------------------
    def runs(
        self,
        *,
        scenario: str | None = None,
        suite: str | None = None,
        suite_id: int | None = None,
        last: int | None = None,
    ) -> list[StoredRun]:
        """Runs matching every given filter, oldest first; ``last`` keeps only the newest N of them."""
        where, args = self._filters(scenario=scenario, suite=suite, suite_id=suite_id)
        limit = "" if last is None else f" LIMIT {int(last)}"
        rows = self._db.execute(
            f"SELECT * FROM (SELECT id, suite_id, suite, scenario, scenario_file, seed, started_ts, ended_ts, verdict, "
            f"exit_code, ended_by, error, run_dir, host, git_commit FROM runs{where} "
            f"ORDER BY started_ts DESC, id DESC{limit}) ORDER BY started_ts, id",
            args,
        ).fetchall()
        return [StoredRun(*row) for row in rows]

    @staticmethod
    def _filters(**given: str | int | None) -> tuple[str, list[str | int]]:
        clauses = [f"{column} = ?" for column, value in given.items() if value is not None]
        values = [value for value in given.values() if value is not None]
        return (" WHERE " + " AND ".join(clauses) if clauses else ""), values

    def checks(self, run_id: int) -> list[StoredCheck]:
        rows = self._db.execute(
            "SELECT name, type, status, measured, measured_text, bound, unit, reason FROM checks "
            "WHERE run_id = ? ORDER BY position",
            (run_id,),
        ).fetchall()
        return [StoredCheck(*row) for row in rows]

    def metrics(self, run_id: int) -> list[DerivedMetric]:
        rows = self._db.execute(
            "SELECT metric, check_name, value FROM metrics WHERE run_id = ? ORDER BY rowid", (run_id,)
        ).fetchall()
        return [DerivedMetric(*row) for row in rows]

    def notes(self, *, run_id: int | None = None, last: int | None = None) -> list[Note]:
        """Notes (of one run when ``run_id`` is given), oldest first; ``last`` keeps the newest N."""
        where, args = self._filters(run_id=run_id)
        limit = "" if last is None else f" LIMIT {int(last)}"
        rows = self._db.execute(
            f"SELECT * FROM (SELECT id, run_id, ts, author, kind, text FROM notes{where} "
            f"ORDER BY ts DESC, id DESC{limit}) ORDER BY ts, id",
            args,
        ).fetchall()
        return [Note(*row) for row in rows]

    def scenarios(self) -> list[str]:
        return [row[0] for row in self._db.execute("SELECT DISTINCT scenario FROM runs ORDER BY scenario")]

    def trends(self, scenario: str | None = None, last: int = 20) -> list[ScenarioTrend]:
        """Per scenario (all, or one), over its newest ``last`` runs: see :class:`ScenarioTrend`."""
        names = [scenario] if scenario is not None else self.scenarios()
        trends = []
        for name in names:
            window = self.runs(scenario=name, last=last)
            if window:
                trends.append(self._trend(name, window))
        return trends

    def _trend(self, name: str, window: list[StoredRun]) -> ScenarioTrend:
        marks = ",".join("?" * len(window))
        per_run: dict[str, dict[int, float]] = {}
        for run_id, metric, value in self._db.execute(
            f"SELECT run_id, metric, value FROM metrics WHERE run_id IN ({marks})", [r.id for r in window]
        ):
            worst = per_run.setdefault(metric, {})
            worst[run_id] = max(value, worst.get(run_id, value))  # several faults in a run: its worst timing

        def values(metric: str) -> list[float]:
            return list(per_run.get(metric, {}).values())

        detection = values("detection_latency_s")
        passed = sum(run.verdict == "pass" for run in window)
        return ScenarioTrend(
            scenario=name,
            runs=len(window),
            passed=passed,
            pass_rate=passed / len(window),
            detection_p50_s=_median(detection),
            detection_max_s=max(detection) if detection else None,
            recovery_p50_s=_median(values("recovery_s")),
            failover_p50_s=_median(values("failover_s")),
            failback_p50_s=_median(values("failback_s")),
            last_verdict=window[-1].verdict,
            last_ts=window[-1].ended_ts,
            sparkline="".join(VERDICT_MARK.get(run.verdict, "?") for run in window),
        )
