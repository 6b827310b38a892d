"""The ``collective_fault`` fault on user-style jobs (hand-written data parallelism, 3 ranks, the one ``attach``
line) under torchrun, through the whole harness; one run per fixture:

- ``scenarios/collective-error-retry.yaml`` (kind ``error``) against ``tests/jobs/user_allreduce.py``: rank
  1's gradient all-reduce of step 12 raises DistBackendError once; the job retries it and the run passes,
  bit-identical to golden, no restart;
- the same scenario with the job's ``--on-allreduce-error local`` (the handler goes on with local
  gradients): the job hangs, the hang watch names rank 1 at step 12, nothing passes step 12 before the
  process-group timeout, and the run fails on recovery and restarts; it then trains apart and exits 0 with a
  model unlike the retry run's golden one (its own golden run is skipped: the same job but for the handler);
- ``scenarios/collective-abort.yaml`` (kind ``abort``, the retry job): every rank's retries fail with gloo's own
  error, torchrun restarts the group, and the run passes.

Each run: exactly one ``fault.applied`` of the op, from rank 1's agent, at step 12.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from support import ROOT, verdicts

from chaos.run.orchestrator import RunOptions, execute
from chaos.run.result import RunResult
from chaos.spec.scenario import load_scenario

pytestmark = pytest.mark.slow

SCENARIO = ROOT / "scenarios" / "collective-error-retry.yaml"


def _run(source: Path, report_root: Path, golden: bool = True) -> RunResult:
    return execute(load_scenario(source), RunOptions(report_root=report_root, scenario_file=source, golden=golden))


@pytest.fixture(scope="module")
def retried(e2e_report_root: Path) -> RunResult:
    return _run(SCENARIO, e2e_report_root)


@pytest.fixture(scope="module")
def moved_on(e2e_report_root: Path, tmp_path_factory: pytest.TempPathFactory) -> RunResult:
    spec = yaml.safe_load(SCENARIO.read_text())
    assert "--on-allreduce-error" not in spec["target"]["args"]  # the job's default handler retries
    spec["target"]["script"] = str(ROOT / spec["target"]["script"])
    spec["target"]["args"] += ["--on-allreduce-error", "local"]
    source = tmp_path_factory.mktemp("moves-on") / "collective-error-moves-on.yaml"
    source.write_text(yaml.safe_dump(spec))
    return _run(source, e2e_report_root, golden=False)


@pytest.fixture(scope="module")
def aborted(e2e_report_root: Path) -> RunResult:
    return _run(ROOT / "scenarios" / "collective-abort.yaml", e2e_report_root)


def _fired_once(result: RunResult, kind: str) -> dict[str, object]:
    applied = result.history.of("fault.applied")
    assert len(applied) == 1, [e.data for e in applied]
    [event] = applied
    assert (event.source, event.rank, event.get_int("step"), event.get_int("index")) == ("target", 1, 12, 0), event
    assert (event.get_str("collective"), event.get_str("collective_kind")) == ("all_reduce", kind), event.data
    return event.data


def test_a_job_that_retries_the_failed_all_reduce_passes(retried: RunResult) -> None:
    _fired_once(retried, "error")
    got = verdicts(retried)
    assert retried.verdict == "pass" and all(status == "pass" for status, _ in got.values()), got
    assert retried.history.of("target.restart") == []
    log = (retried.run_dir / "target.log").read_text()
    assert "rank 1: gradient all_reduce failed (collective_fault 'allreduce-error-rank1'" in log
    assert "retry 1/2" in log and "retry 2/2" not in log  # one retry was enough


def test_a_job_that_moves_on_hangs_fails_recovery_and_ends_unlike_golden(
    moved_on: RunResult, retried: RunResult
) -> None:
    _fired_once(moved_on, "error")
    got = verdicts(moved_on)
    assert moved_on.verdict == "fail", got
    assert got["detected_within"][0] == "pass", got  # it saw the error: its own log line
    for check in ("recovered_within", "restarts_at_most"):
        assert got[check][0] == "fail", (check, got[check])
    assert "step 12" in got["recovered_within"][1], got["recovered_within"]
    # Rank 1 waits in the metrics group's all-reduce while ranks 0 and 2 wait in the gradient all-reduce it left.
    first = moved_on.history.of("detect.hang")[0]
    assert (first.rank, first.get_str("reason"), first.get_int("step")) == (1, "wrong_collective", 12), first.data
    assert moved_on.history.of("detect.collective_timeout"), "the process-group timeout ended the hang"
    # It then trained on local gradients and still exited 0: its model is not the retry job's golden one (the two
    # jobs differ only in the handler, so a run without the fault ends with the same digest).
    assert got["completes"][0] == "pass", got
    final = {e.get_str("digest") for e in moved_on.history.of("target.digest")}
    assert retried.golden_digest is not None and final and retried.golden_digest not in final, final


def test_an_aborted_process_group_fails_every_ranks_retries_and_the_restart_recovers(aborted: RunResult) -> None:
    applied = _fired_once(aborted, "abort")
    assert applied["groups"] == 2 and applied["connections"] == 4, applied  # world + metrics, to ranks 0 and 2
    got = verdicts(aborted)
    assert aborted.verdict == "pass" and all(status == "pass" for status, _ in got.values()), got
    assert len(aborted.history.of("target.restart")) >= 1
    log = (aborted.run_dir / "target.log").read_text()
    for rank in (0, 1, 2):  # gloo's own error, on the aborted rank and on its peers
        assert f"rank {rank}: gradient all_reduce failed ([" in log and "Connection closed by peer" in log
