"""What one run produces, apart from the orchestrator that produces it: the verdict, exit codes, check results,
live status snapshots. Reporters, suites and the ways in read these without importing the orchestrator.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from chaos.checks.base import CheckResult
from chaos.history.timeline import History
from chaos.plan.build import Plan
from chaos.spec.scenario import Scenario

Verdict = Literal["pass", "fail", "error"]
EXIT_PASS, EXIT_FAIL, EXIT_INVALID, EXIT_HARNESS = 0, 1, 2, 3


@dataclass
class RunStatus:
    """A snapshot for live progress displays."""

    elapsed_s: float
    step: int | None
    active: list[str]
    fired: int
    planned: int


@dataclass
class RunResult:
    """The outcome of one run: verdict, exit code, check results and where the reports are."""

    scenario: Scenario
    plan: Plan
    run_dir: Path
    history: History
    results: list[CheckResult]
    verdict: Verdict
    exit_code: int
    ended_by: str
    error: str = ""
    golden_digest: str | None = None
    extra: dict[str, object] = field(default_factory=dict)
