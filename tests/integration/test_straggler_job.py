"""The straggler guard in one real 3-rank torchrun job (gloo, CPU) slowed by a SIGSTOP duty cycle on rank 1: rank 1
is named and nobody else; a control run without faults names no straggler. The guard's pure logic is in
tests/unit/test_straggler_guard.py.

These tests are ``slow``; they assert on who is named, never on how fast anything ran.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jobs.launch import torchrun_argv, with_repo_on_path
from support import ROOT

# --- one real job: 3 gloo ranks under torchrun, rank 1 slowed by a SIGSTOP duty cycle ------------------------

WORLD = 3
STEPS = 150
WARM_STEP = 8  # the duty cycle starts once rank 1 reports this step (a full window of normal steps)
DUTY_PERIOD_S, DUTY_STOPPED_S, DUTY_CYCLES = 1.0, 0.5, 6
JOB_TIMEOUT_S = 120.0


def _read_events(path: Path) -> list[dict[str, Any]]:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in raw.split(b"\n")[:-1] if line.strip()]


def _is_worker(pid: int) -> bool:
    try:  # pid reuse: only signal a process that is still a ddp_trainer worker
        return b"chaos.reference.trainer" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _signal(pid: int, sig: signal.Signals) -> None:
    if _is_worker(pid):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


class _Job:
    def __init__(self, workdir: Path) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.events_path = workdir / "events.jsonl"
        self.log_path = workdir / "torchrun.log"
        env = {k: v for k, v in os.environ.items() if k not in ("CHAOS_SABOTAGE", "CHAOS_PLAN", "RANK", "WORLD_SIZE")}
        env.update(
            {
                "CHAOS_EVENTS": str(self.events_path),
                "OMP_NUM_THREADS": "1",
                "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
            }
        )
        env = with_repo_on_path(env)
        argv = torchrun_argv(
            workdir,
            WORLD,
            "--nnodes",
            "1",
            "--max-restarts",
            "0",
            "--monitor-interval",
            "0.5",
            "-m",
            "chaos.reference.trainer",
            "--steps",
            str(STEPS),
            "--step-time",
            "0.05",
            # No checkpoint inside the run: rank 0's checkpoint write is local work of rank 0 only.
            "--checkpoint-every",
            "1000",
            "--checkpoint-dir",
            str(workdir / "ckpt"),
            "--pg-timeout",
            "30",
            "--straggler-guard",
        )
        self.log = open(self.log_path, "wb")  # noqa: SIM115 - closed in cleanup
        self.proc = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def events(self) -> list[dict[str, Any]]:
        return _read_events(self.events_path)

    def pids(self) -> dict[int, int]:
        return {e["rank"]: e["data"]["pid"] for e in self.events() if e["kind"] == "target.start"}

    def last_step(self, rank: int) -> int:
        return max(
            (e["data"]["step"] for e in self.events() if e["kind"] == "target.step" and e["rank"] == rank), default=0
        )

    def tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:] if self.log_path.exists() else ""

    def wait(self) -> int:
        try:
            return self.proc.wait(timeout=JOB_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"job did not finish within {JOB_TIMEOUT_S}s:\n{self.tail()}")

    def cleanup(self) -> None:
        pids = self.pids().values()
        for pid in pids:  # a stopped worker must never outlive the test, not even a killed one
            _signal(pid, signal.SIGCONT)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        for pid in pids:
            _signal(pid, signal.SIGKILL)
        self.log.close()


@pytest.fixture
def job_factory() -> Iterator[Any]:
    jobs: list[_Job] = []

    def make(workdir: Path) -> _Job:
        jobs.append(_Job(workdir))
        return jobs[-1]

    try:
        yield make
    finally:
        for job in jobs:
            job.cleanup()


def _stragglers(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["kind"] == "detect.straggler"]


@pytest.mark.slow
def test_sigstop_duty_cycle_on_rank_1_is_named_and_nobody_else(job_factory: Any, tmp_path: Path) -> None:
    job: _Job = job_factory(tmp_path)
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while job.last_step(1) < WARM_STEP:
        assert job.proc.poll() is None, f"job exited early:\n{job.tail()}"
        assert time.monotonic() < deadline, f"rank 1 never reached step {WARM_STEP}:\n{job.tail()}"
        time.sleep(0.05)
    victim = job.pids()[1]
    started_at_step = max(job.last_step(r) for r in range(WORLD))
    try:
        for _ in range(DUTY_CYCLES):
            if job.proc.poll() is not None:
                break
            _signal(victim, signal.SIGSTOP)
            time.sleep(DUTY_STOPPED_S)
            _signal(victim, signal.SIGCONT)
            time.sleep(DUTY_PERIOD_S - DUTY_STOPPED_S)
    finally:
        _signal(victim, signal.SIGCONT)
    assert job.wait() == 0, job.tail()

    detections = _stragglers(job.events())
    assert detections, f"no detect.straggler:\n{job.tail()}"
    assert {e["rank"] for e in detections} == {1}, detections
    first = detections[0]["data"]
    assert first["detector"] == "straggler" and first["reporter"] == 0 and first["window"] == 5
    assert first["step"] > started_at_step, (first, started_at_step)  # caused by the duty cycle, not before it
    assert len(first["compute_s"]) == len(first["wait_s"]) == WORLD
    assert first["compute_s"][1] == max(first["compute_s"])
    assert first["wait_s"][1] == min(first["wait_s"])  # the straggler arrives last and waits least
    print(f"detect.straggler at step {first['step']}, duty cycle began after step {started_at_step}: {first}")


@pytest.mark.slow
def test_control_run_without_faults_names_no_straggler(job_factory: Any, tmp_path: Path) -> None:
    job: _Job = job_factory(tmp_path)
    assert job.wait() == 0, job.tail()
    events = job.events()
    assert max(e["data"]["step"] for e in events if e["kind"] == "target.step") == STEPS
    assert _stragglers(events) == []
