"""A ``kill`` with ``trigger.phase: allreduce`` fires from inside the job (the rank's own agent), inside the gradient
all-reduce, on the planned rank and step, and the history says where it fired.

Real torchrun launches (2 gloo ranks) of ``tests/jobs/user_ddp_adam.py`` (a user-style DDP + Adam script), and
of the reference trainer under the checksum guard (whose hook runs the bucket's all-reduce itself):

- launched directly with a plan file, under ``tests/jobs/collective_probe.py``, which observes every all-reduce
  independently of the agent: the victim's last probe event is an all-reduce it entered and never finished,
  its ``fault.applied`` says phase allreduce at step 3 on rank 1 and came after that entry, and torchrun saw
  that pid die of SIGKILL (the same under the checksum guard's hook);
- through the whole harness (scenario -> plan -> plan file -> agent) with ``max_restarts: 1``: the kill fires
  once, torchrun restarts the job, the restarted worker does not kill itself again (the marker in the run
  folder), and the job completes.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from jobs.launch import launch
from support import ROOT

from chaos.run.orchestrator import RunOptions, execute
from chaos.run.result import EXIT_PASS
from chaos.spec.scenario import parse_scenario

JOB = ROOT / "tests" / "jobs" / "user_ddp_adam.py"
PROBE = ROOT / "tests" / "jobs" / "collective_probe.py"
STEPS = 6
KILL_STEP = 3
VICTIM = 1
TIMEOUT_S = 180


KILL_OP = {
    "op_id": "kill-in-allreduce#1",
    "fault": "kill-in-allreduce",
    "injector": "kill",
    "at_step": KILL_STEP,
    "rank": VICTIM,
    "phase": "allreduce",
    "params": {"rank": VICTIM, "signal": "SIGKILL"},
}


def _launch(workdir: Path, job: list[str] | None = None) -> tuple[int | None, list[dict[str, Any]], str]:
    """One torchrun launch of the probed job (default: the user-style script) with a plan that kills rank VICTIM
    in the all-reduce of KILL_STEP."""
    argv = [str(PROBE), *(job or [str(JOB)]), "--steps", str(STEPS)]
    launcher = ("--max-restarts", "0", "--monitor-interval", "0.1")
    return launch(workdir, argv, [KILL_OP], launcher=launcher, timeout_s=TIMEOUT_S)


@pytest.mark.slow
def test_kill_at_allreduce_fires_inside_the_collective_on_the_planned_rank_and_step(tmp_path: Path) -> None:
    rc, events, log = _launch(tmp_path / "job")
    _assert_killed_inside_the_collective(rc, events, log)


@pytest.mark.slow
def test_under_the_checksum_guard_it_fires_inside_the_guarded_bucket_reduction(tmp_path: Path) -> None:
    trainer = ROOT / "chaos" / "reference" / "trainer.py"
    job = [str(trainer), "--guard", "checksum", "--step-time", "0", "--checkpoint-dir", str(tmp_path / "ckpt")]
    rc, events, log = _launch(tmp_path / "job", job)
    _assert_killed_inside_the_collective(rc, events, log)


def _assert_killed_inside_the_collective(rc: int | None, events: list[dict[str, Any]], log: str) -> None:
    assert rc not in (0, None), log[-3000:]
    applied = [e for e in events if e["kind"] == "fault.applied"]
    assert len(applied) == 1, applied
    [fired] = applied
    data = fired["data"]
    assert (fired["rank"], data["step"], data["phase"], data["site"]) == (VICTIM, KILL_STEP, "allreduce", "in_flight")
    assert data["signal"] == "SIGKILL" and data["fault"] == "kill-in-allreduce"

    # Independent of the agent: what the probe saw on the victim. Its last collective was entered, never done,
    # and the kill's event came after that entry (it fired inside, not before or after, the collective).
    victim = [e for e in events if e["rank"] == VICTIM]
    probes = [e for e in victim if e["kind"] == "probe.collective"]
    assert probes[-1]["data"]["state"] == "enter", probes[-3:]
    assert victim.index(fired) > victim.index(probes[-1])
    assert victim[-1] is fired, "the victim wrote nothing after its kill's event"
    # It died at step KILL_STEP: it reported the steps before and none after.
    assert [e["data"]["step"] for e in victim if e["kind"] == "target.step"] == list(range(1, KILL_STEP))
    # torchrun saw that very pid die of SIGKILL (signal 9).
    assert re.search(rf"exitcode\s*:\s*-9 \(pid: {data['pid']}\)", log), log[-3000:]
    # The peer got no further than that step. (Whether it finished that very all-reduce is timing: gloo may have
    # exchanged the victim's contribution before the signal landed; benchmarks/phase_kill.py counts how often.)
    peer = [e for e in events if e["rank"] == 1 - VICTIM]
    assert all(e["data"]["step"] <= KILL_STEP for e in peer if e["kind"] == "target.step")


@pytest.mark.slow
def test_through_the_harness_the_kill_fires_once_and_the_restarted_job_completes(tmp_path: Path) -> None:
    scenario = {
        "name": "phase-kill",
        "target": {
            "type": "torchrun",
            "script": str(JOB),
            "args": ["--steps", str(STEPS)],
            "nproc_per_node": 2,
            "max_restarts": 1,
            "monitor_interval": "0.1s",
        },
        "faults": [
            {
                "name": "kill-in-allreduce",
                "type": "kill",
                "params": {"rank": VICTIM},
                "trigger": {"at_step": KILL_STEP, "rank": VICTIM, "phase": "allreduce"},
            }
        ],
        "checks": [{"type": "completes"}],
        "safety": {"max_duration": "150s", "no_progress_timeout": "90s"},
    }
    result = execute(parse_scenario(yaml.safe_dump(scenario)), RunOptions(report_root=tmp_path, golden=False))
    history = result.history
    applied = history.of("fault.applied")
    assert len(applied) == 1, [e.data for e in applied]  # the restarted worker recomputed step 3 and did not fire
    [fired] = applied
    assert fired.source == "target" and fired.rank == VICTIM
    assert (fired.get_int("step"), fired.get_str("phase"), fired.get_str("site")) == (
        KILL_STEP,
        "allreduce",
        "in_flight",
    )
    assert result.exit_code == EXIT_PASS, (result.error, [(r.check, r.status, r.reason) for r in result.results])
    steps = [e.get_int("step") for e in history.of("target.step") if e.rank == VICTIM and e.ts_ns > fired.ts_ns]
    assert steps and max(s for s in steps if s is not None) == STEPS, "the job ran to its end after the restart"
