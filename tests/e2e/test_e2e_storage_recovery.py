"""The restore-straggler and retry stories through the whole harness, on a real FUSE layer:

- ``scenarios/checkpoint-restore-straggler.yaml``: rank 1's checkpoint reads are delayed 1 s each while rank 0 is
  killed; the reference trainer's restart restores, and ``restore_straggler_named`` names rank 1 from the ranks'
  ``target.restore`` durations and the layer's own ``storage.hit`` (reads of ``ckpt-*/rank-1.pt`` only);
- ``scenarios/checkpoint-save-retry.yaml``: EIO on the checkpoint dir for 4 s across the step-20 save; the
  reference trainer retries with backoff and commits, so ``retried_with_backoff`` passes; the same scenario on a
  user's job (``tests/jobs/user_save_retry.py``) that crashes on the first error, or retries in a tight loop,
  FAILS it (four runs in all, each once per module).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import ROOT

from chaos.history.timeline import Event
from chaos.run.orchestrator import RunOptions, RunResult, execute
from chaos.spec.scenario import load_scenario
from injectors.storage import fuselayer

pytestmark = pytest.mark.slow

STRAGGLER = ROOT / "scenarios" / "checkpoint-restore-straggler.yaml"
RETRY = ROOT / "scenarios" / "checkpoint-save-retry.yaml"
USER_JOB = ROOT / "tests" / "jobs" / "user_save_retry.py"


def _unavailable() -> str | None:
    if os.geteuid() != 0:
        return "the storage fault mounts FUSE with allow_other and needs root"
    if not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None:
        return "no /dev/fuse or fusermount3 here"
    return fuselayer.binding_problem()


def _run(root: Path, source: Path) -> RunResult:
    if reason := _unavailable():
        pytest.skip(reason)
    return execute(load_scenario(source), RunOptions(report_root=root, scenario_file=source))


def _on_user_job(tmp: Path, how: str) -> Path:
    """The shipped retry scenario with its target swapped for the user's job handling errors ``how``."""
    spec: dict[str, Any] = yaml.safe_load(RETRY.read_text())
    spec["name"] = f"checkpoint-save-retry-{how}"
    spec["target"] = {
        "type": "torchrun",
        "script": str(USER_JOB),
        "nproc_per_node": 2,
        "max_restarts": 0,
        "args": [
            "--steps",
            40,
            "--checkpoint-every",
            10,
            "--checkpoint-dir",
            "{run_dir}/checkpoints",
            "--step-time",
            0.1,
            "--on-save-error",
            how,
        ],
    }
    source = tmp / f"retry-{how}.yaml"
    source.write_text(yaml.safe_dump(spec))
    return source


@pytest.fixture(scope="module")
def straggler(e2e_report_root: Path) -> RunResult:
    return _run(e2e_report_root, STRAGGLER)


@pytest.fixture(scope="module")
def retry(e2e_report_root: Path) -> RunResult:
    return _run(e2e_report_root, RETRY)


@pytest.fixture(scope="module", params=["crash", "spin"])
def broken(
    request: pytest.FixtureRequest, e2e_report_root: Path, tmp_path_factory: pytest.TempPathFactory
) -> RunResult:
    return _run(e2e_report_root, _on_user_job(tmp_path_factory.mktemp("retry"), str(request.param)))


def _results(result: RunResult) -> dict[str, Any]:
    return {r.check: r for r in result.results}


def _hits(result: RunResult) -> list[Event]:
    return result.history.of("storage.hit")


def test_the_reference_trainer_names_its_restore_straggler(straggler: RunResult) -> None:
    got = _results(straggler)
    assert {name: r.status for name, r in got.items()} == dict.fromkeys(got, "pass"), got
    named = got["restore_straggler_named"]
    assert named.reason.startswith("rank 1 was the restore straggler"), named.reason
    assert "time to resume" in named.reason
    assert isinstance(named.measured, float) and named.measured > 0.5  # at least one 1 s read over rank 0's restore
    hits = _hits(straggler)
    assert hits and all(h.get_str("op") == "read" and "rank-1.pt" in (h.get_str("path") or "") for h in hits), hits
    restores = {e.rank: e.data["duration_s"] for e in straggler.history.of("target.restore")}
    assert set(restores) == {0, 1}, restores


def test_the_reference_trainer_retries_a_failing_save_with_backoff(retry: RunResult) -> None:
    got = _results(retry)
    assert {name: r.status for name, r in got.items()} == dict.fromkeys(got, "pass"), got
    retries = [e for e in retry.history.of("target.checkpoint_retry") if e.rank == 0]
    assert len(retries) >= 3, retries
    delays = [float(e.data["delay_s"]) for e in retries]  # type: ignore[arg-type]
    assert all(b > a for a, b in zip(delays, delays[1:], strict=False)), delays
    errors = [h for h in _hits(retry) if h.data.get("errno_name") == "EIO"]
    assert errors, "the layer reported no EIO it returned"
    healed = retry.history.of("fault.healed")[0].ts_ns
    step = retries[0].get_int("step")  # 20, or 30 when a loaded machine brought the layer up after the step-20 save
    committed = [e for e in retry.history.of("target.checkpoint") if e.get_int("step") == step]
    assert committed and min(e.ts_ns for e in committed) > max(e.ts_ns for e in retries), committed
    assert committed[0].ts_ns > errors[0].ts_ns and healed > errors[0].ts_ns


def test_a_job_that_crashes_or_spins_on_a_save_error_fails_the_retry_check(broken: RunResult) -> None:
    verdict = _results(broken)["retried_with_backoff"]
    assert verdict.status == "fail", (verdict.reason, verdict.evidence)
    if broken.scenario.name.endswith("crash"):
        assert "after the first storage error" in verdict.reason, verdict.reason
    else:
        assert verdict.reason.startswith("a tight loop"), verdict.reason
        assert sum(h.get_int("count") or 0 for h in _hits(broken)) > 200
