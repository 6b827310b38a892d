"""Torn and corrupt checkpoints, end to end: ``scenarios/checkpoint-torn-write.yaml`` and
``scenarios/checkpoint-corrupt.yaml`` pass on the reference trainer (two-phase commit, every rank verifies its
own file against the manifest, the ranks agree on the newest step that verified everywhere) and FAIL on
``tests/jobs/user_ckpt_unverified.py`` (torch.save over one ``latest.pt`` in place, torch.load of whatever is
there). Four runs and one golden run (the trainer's, shared by both scenarios), each shared by the assertions on it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from support import ROOT

from chaos.run.orchestrator import RunOptions, execute
from chaos.run.result import EXIT_FAIL, EXIT_PASS, RunResult
from chaos.spec.scenario import load_scenario

pytestmark = pytest.mark.slow

BROKEN_JOB = ROOT / "tests" / "jobs" / "user_ckpt_unverified.py"
BROKEN_ARGS = [
    "--steps",
    30,
    "--checkpoint-every",
    10,
    "--checkpoint-dir",
    "{run_dir}/checkpoints",
    "--step-time",
    0.05,
]


def _run(root: Path, tmp: Path, name: str, *, broken: bool) -> RunResult:
    source = ROOT / "scenarios" / f"{name}.yaml"
    if broken:
        spec = yaml.safe_load(source.read_text())
        spec["name"] = f"{name}-unverified-job"
        spec["target"] = {**spec["target"], "script": str(BROKEN_JOB), "args": BROKEN_ARGS}
        del spec["target"]["module"]
        # Its verdict comes from the checkpoint checks and completes; matches_golden would only add a golden run.
        spec["checks"] = [c for c in spec["checks"] if c["type"] != "matches_golden"]
        source = tmp / f"{name}-unverified.yaml"
        source.write_text(yaml.safe_dump(spec))
    return execute(load_scenario(source), RunOptions(report_root=root, scenario_file=source))


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("checkpoint-scenarios")


def _run_once(name: str, *, broken: bool) -> Any:
    """A module-scoped fixture: the shipped scenario NAME run once (on the unverified job when ``broken``)."""

    @pytest.fixture(scope="module")
    def run(e2e_report_root: Path, tmp: Path) -> RunResult:
        return _run(e2e_report_root, tmp, name, broken=broken)

    return run


torn_reference = _run_once("checkpoint-torn-write", broken=False)
corrupt_reference = _run_once("checkpoint-corrupt", broken=False)
torn_broken = _run_once("checkpoint-torn-write", broken=True)
corrupt_broken = _run_once("checkpoint-corrupt", broken=True)


def statuses_of(result: RunResult) -> dict[str, str]:
    return {r.check: r.status for r in result.results}


def _explain(result: RunResult) -> object:
    return result.error, [(r.check, r.status, r.reason, r.evidence[:4]) for r in result.results]


def test_a_torn_save_is_never_loaded_and_the_trainer_falls_back(torn_reference: RunResult) -> None:
    result = torn_reference
    assert result.exit_code == EXIT_PASS, _explain(result)
    [torn] = result.history.of("fault.checkpoint")
    # The writer was really killed mid-file: the file it held open stopped between the cut and the full size.
    assert torn.data["mode"] == "torn_write" and torn.data["path"] and "/ckpt-" in str(torn.data["path"])
    size, cut = torn.get_int("size"), torn.get_int("at_bytes")
    assert size is not None and cut is not None and cut <= size < 2 * cut + 8192, torn.data
    torn_step = int(str(torn.data["checkpoint"]).rsplit("ckpt-", 1)[1])
    rejected = result.history.of("target.checkpoint_rejected")
    assert {e.get_int("step") for e in rejected} == {torn_step}, rejected
    resumes = [e for e in result.history.of("target.resume") if e.ts_ns > torn.ts_ns]
    assert {e.rank for e in resumes} == {0, 1} and all(e.data["verified"] is True for e in resumes)
    assert {e.get_int("step") for e in resumes} == {torn_step - 10}, resumes


def test_a_corrupt_checkpoint_is_rejected_by_its_rank_and_every_rank_falls_back(corrupt_reference: RunResult) -> None:
    result = corrupt_reference
    assert result.exit_code == EXIT_PASS, _explain(result)
    [damage] = result.history.of("fault.checkpoint")
    assert damage.get_int("step") == 20 and len(damage.data["offsets"]) == 8, damage.data  # type: ignore[arg-type]
    rejected = result.history.of("target.checkpoint_rejected")
    assert rejected and all("sha256" in str(e.data["reason"]) and e.get_int("step") == 20 for e in rejected)
    resumes = [e for e in result.history.of("target.resume") if e.ts_ns > damage.ts_ns]
    assert {(e.rank, e.get_int("step")) for e in resumes} == {(0, 10), (1, 10)}, resumes
    assert all(e.data["rejected"] == [20] for e in resumes)
    fell = next(r for r in result.results if r.check == "fell_back_to")
    assert fell.measured == 10.0 and fell.status == "pass", fell
    assert statuses_of(result)["matches_golden"] == "pass"


def test_the_unverified_job_fails_the_torn_write_scenario(torn_broken: RunResult) -> None:
    result = torn_broken
    statuses = statuses_of(result)
    assert result.exit_code == EXIT_FAIL, _explain(result)
    [torn] = result.history.of("fault.checkpoint")
    assert str(torn.data["path"]).endswith("latest.pt"), torn.data
    # Its only checkpoint is torn and nothing older survives: it can never resume, and never completes.
    assert statuses["completes"] == "fail", _explain(result)
    assert statuses["resumed_from_verified_checkpoint"] in ("fail", "unknown"), _explain(result)
    assert statuses["fell_back_to"] in ("fail", "unknown"), _explain(result)


def test_the_unverified_job_fails_the_corrupt_scenario(corrupt_broken: RunResult) -> None:
    result = corrupt_broken
    statuses = statuses_of(result)
    assert result.exit_code == EXIT_FAIL, _explain(result)
    [damage] = result.history.of("fault.checkpoint")
    assert str(damage.data["path"]).endswith("latest.pt") and damage.get_int("step") == 20, damage.data
    resumed = [e for e in result.history.of("target.resume") if e.ts_ns > damage.ts_ns]
    if resumed:  # it loaded the corrupt file without noticing: the property itself is violated
        assert statuses["resumed_from_verified_checkpoint"] == "fail", _explain(result)
        assert statuses["fell_back_to"] == "fail", _explain(result)
    else:  # the flipped bytes hit the zip structure: it crash-loops on the load instead
        assert statuses["completes"] == "fail", _explain(result)
