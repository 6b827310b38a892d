"""Suite-wide fixtures: every test's journals live in a temporary state directory, never /var/lib/mlchaos;
one report root for the end-to-end training runs (their golden runs are cached there once), and one real
kill-rank run shared by the tests that only read its outcome."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from chaos.run.result import RunResult

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True, scope="session")
def _private_state_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("mlchaos-state")
    previous = os.environ.get("MLCHAOS_STATE_DIR")
    os.environ["MLCHAOS_STATE_DIR"] = str(path)
    try:
        yield path
    finally:
        if previous is None:
            os.environ.pop("MLCHAOS_STATE_DIR", None)
        else:
            os.environ["MLCHAOS_STATE_DIR"] = previous


@pytest.fixture(scope="session")
def e2e_report_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One report root for end-to-end runs of the shipped training scenarios: a golden run is computed once
    per job and seed and then read from ``.golden/`` by every later run."""
    return tmp_path_factory.mktemp("e2e-reports")


@pytest.fixture(scope="session")
def kill_rank_run(e2e_report_root: Path) -> RunResult:
    """``scenarios/kill-rank.yaml`` run for real once per session (about 30 s with its golden run)."""
    from chaos.run.orchestrator import RunOptions, execute
    from chaos.spec.scenario import load_scenario

    source = ROOT / "scenarios" / "kill-rank.yaml"
    return execute(load_scenario(source), RunOptions(report_root=e2e_report_root, scenario_file=source))
