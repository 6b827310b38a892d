"""End-to-end tests of the reference DDP job under real torchrun: determinism, kill-and-resume, sabotage.

Every job is a real ``torch.distributed.run`` subprocess with 2 gloo ranks on CPU. Timeouts are generous
and nothing asserts on speed (timing belongs in benchmarks/). Leftover processes are killed in ``finally``:
torchrun itself and every worker pid the job reported (workers run in their own sessions, so killing
torchrun's process group would not reach them).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest
from jobs.launch import torchrun_argv
from support import ROOT

STEPS = 60
BATCH = 16
WORLD = 2
SEED = 1234
CHECKPOINT_EVERY = 10
KILL_AT_STEP = 25  # after the checkpoint at 20, well before the one at 30
JOB_TIMEOUT_S = 180.0


@dataclass
class Job:
    """One torchrun launch of chaos.reference.trainer and the files it writes."""

    proc: subprocess.Popen[bytes]
    events_path: Path
    checkpoint_dir: Path
    log_path: Path
    log: IO[bytes]
    extra_pids: list[int] = field(default_factory=list)

    def events(self) -> list[dict[str, Any]]:
        """Complete event lines written so far (a line still being appended is skipped)."""
        try:
            raw = self.events_path.read_bytes()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in raw.split(b"\n")[:-1] if line.strip()]

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except FileNotFoundError:
            return ""

    def wait(self, timeout: float = JOB_TIMEOUT_S) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"job did not finish within {timeout}s; log tail:\n{self.log_tail()}")

    def final_digest(self) -> str:
        return (self.checkpoint_dir / "final-digest.txt").read_text().strip()

    def cleanup(self) -> None:
        """Kill torchrun and any worker still alive; only pids this job reported, checked by cmdline."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        pids = {e["data"]["pid"] for e in self.events() if e["kind"] == "target.start"}
        for pid in sorted(pids | set(self.extra_pids)):
            if _is_our_worker(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.log.close()


def _is_our_worker(pid: int) -> bool:
    # Guards against pid reuse: only kill a process that is still a ddp_trainer worker.
    try:
        return b"chaos.reference.trainer" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def start_job(
    workdir: Path, *, seed: int = SEED, steps: int = STEPS, env: dict[str, str] | None = None, monitor_s: float = 0.5
) -> Job:
    """Launch torchrun (2 ranks, up to 3 restarts, a worker poll every ``monitor_s``) writing events, checkpoints
    and a log under ``workdir``."""
    workdir.mkdir(parents=True, exist_ok=True)
    events_path = workdir / "events.jsonl"
    checkpoint_dir = workdir / "ckpt"
    log_path = workdir / "torchrun.log"
    child_env = {k: v for k, v in os.environ.items() if k not in ("CHAOS_SABOTAGE", "RANK", "WORLD_SIZE")}
    child_env.update(
        {
            "CHAOS_EVENTS": str(events_path),
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
    )
    child_env.update(env or {})
    argv = torchrun_argv(
        workdir,
        WORLD,
        "--max-restarts",
        "3",
        "--monitor-interval",
        str(monitor_s),
        "-m",
        "chaos.reference.trainer",
        "--steps",
        str(steps),
        "--batch-size",
        str(BATCH),
        "--checkpoint-every",
        str(CHECKPOINT_EVERY),
        "--checkpoint-dir",
        str(checkpoint_dir),
        "--seed",
        str(seed),
        "--step-time",
        "0.05",
        "--pg-timeout",
        "30",
    )
    log = open(log_path, "wb")  # noqa: SIM115 - closed by Job.cleanup
    proc = subprocess.Popen(argv, cwd=ROOT, env=child_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return Job(proc, events_path, checkpoint_dir, log_path, log)


def run_to_completion(workdir: Path, **kwargs: Any) -> tuple[int, list[dict[str, Any]], str]:
    """Run a job fault-free; return (exit code, events, final digest)."""
    job = start_job(workdir, **kwargs)
    try:
        rc = job.wait()
        assert rc == 0, job.log_tail()
        return rc, job.events(), job.final_digest()
    finally:
        job.cleanup()


def run_kill_resume(workdir: Path, env: dict[str, str] | None = None) -> tuple[int, list[dict[str, Any]], str]:
    """SIGKILL rank 1 once it reports step >= KILL_AT_STEP, let torchrun restart the group, wait for exit.

    torchrun polls its workers every 2 s here: once it sees rank 1 dead it SIGTERMs rank 0, and the tests read
    rank 0's own detection of the dead peer (its failed collective), which a loaded machine can delay past a
    0.5 s poll (seen once: rank 0 terminated before it recorded anything)."""
    job = start_job(workdir, env=env, monitor_s=2.0)
    try:
        deadline = time.monotonic() + JOB_TIMEOUT_S
        victim: int | None = None
        while victim is None:
            assert job.proc.poll() is None, f"job exited before the kill:\n{job.log_tail()}"
            assert time.monotonic() < deadline, f"rank 1 never reached step {KILL_AT_STEP}:\n{job.log_tail()}"
            events = job.events()
            if any(e["kind"] == "target.step" and e["rank"] == 1 and e["data"]["step"] >= KILL_AT_STEP for e in events):
                victim = next(
                    e["data"]["pid"]
                    for e in events
                    if e["kind"] == "target.start" and e["rank"] == 1 and e["data"]["attempt"] == 0
                )
            else:
                time.sleep(0.02)
        os.kill(victim, signal.SIGKILL)
        rc = job.wait()
        digest = job.final_digest() if rc == 0 else ""
        assert rc == 0, job.log_tail()
        return rc, job.events(), digest
    finally:
        job.cleanup()


def _of(events: list[dict[str, Any]], kind: str) -> Iterator[dict[str, Any]]:
    return (e for e in events if e["kind"] == kind)


def _last_attempt_digests(events: list[dict[str, Any]]) -> dict[int, str]:
    digests = list(_of(events, "target.digest"))
    last = max(e["data"]["attempt"] for e in digests)
    return {e["rank"]: e["data"]["digest"] for e in digests if e["data"]["attempt"] == last}


@dataclass(frozen=True)
class Baseline:
    events: list[dict[str, Any]]
    digest: str


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Baseline:
    """One fault-free run with the default seed, shared by every test that compares against it."""
    _, events, digest = run_to_completion(tmp_path_factory.mktemp("baseline"))
    return Baseline(events, digest)


@pytest.mark.slow
def test_the_digest_is_the_replicas_and_another_seed_changes_it(baseline: Baseline, tmp_path: Path) -> None:
    assert len(baseline.digest) == 64
    # Both ranks hold the same replica, and the file rank 0 writes matches what the events say.
    assert _last_attempt_digests(baseline.events) == {0: baseline.digest, 1: baseline.digest}
    # The same seed giving the same digest is what test_kill_rank_and_resume_is_bit_identical's resumed run shows
    # (and every golden comparison of the e2e tests): one more fault-free run here would only repeat it.
    _, _, other = run_to_completion(tmp_path / "other-seed", seed=SEED + 1)
    assert other != baseline.digest


@pytest.mark.slow
def test_kill_rank_and_resume_is_bit_identical(baseline: Baseline, tmp_path: Path) -> None:
    _, events, digest = run_kill_resume(tmp_path)

    restarts = list(_of(events, "target.restart"))
    assert restarts and all(e["rank"] == 0 and e["data"]["attempt"] >= 1 for e in restarts)
    # The survivor noticed the dead peer through its failed collective, in the first attempt.
    detections = [e for e in events if e["kind"].startswith("detect.") and e["rank"] == 0]
    assert detections, "rank 0 reported no detect.* event"
    assert detections[0]["data"]["detector"] == "gloo" and detections[0]["data"]["message"]
    # Both ranks resumed from the last checkpoint committed before the kill (20 unless the machine
    # stalled long enough for rank 0 to commit 30 between our poll and the kill).
    committed = max(e["data"]["step"] for e in _of(events, "target.checkpoint") if e["data"]["attempt"] == 0)
    assert committed >= 20
    resumes = [e for e in _of(events, "target.resume") if e["data"]["attempt"] == 1]
    assert sorted(e["rank"] for e in resumes) == [0, 1]
    assert {e["data"]["step"] for e in resumes} == {committed}
    assert all(e["data"]["path"].endswith(f"ckpt-{committed:06d}") for e in resumes)
    assert all(e["data"]["verified"] is True and e["data"]["rejected"] == [] for e in resumes)
    # Each rank read its own file, verified against the manifest, before loading it.
    restores = [e for e in _of(events, "target.restore") if e["data"]["step"] == committed]
    assert sorted(e["rank"] for e in restores) == [0, 1] and all(e["data"]["bytes"] > 0 for e in restores)
    # The resumed attempt continued at committed+1 and no further back.
    first_resumed = min(e["data"]["step"] for e in _of(events, "target.step") if e["data"]["attempt"] == 1)
    assert first_resumed == committed + 1

    assert digest == baseline.digest
    assert set(_last_attempt_digests(events).values()) == {baseline.digest}


@pytest.mark.slow
def test_sabotaged_optimizer_restore_changes_digest(baseline: Baseline, tmp_path: Path) -> None:
    _, events, digest = run_kill_resume(tmp_path, env={"CHAOS_SABOTAGE": "skip-optimizer-restore"})
    # Recovery "looked" fine (restart, resume, exit 0), yet the lost momentum shows in the digest.
    assert any(e["data"]["attempt"] == 1 for e in _of(events, "target.resume"))
    assert digest != baseline.digest


@pytest.mark.slow
def test_fault_free_run_consumes_each_sample_once(baseline: Baseline) -> None:
    steps = list(_of(baseline.events, "target.step"))
    assert sorted((e["rank"], e["data"]["step"]) for e in steps) == sorted(
        (rank, step) for rank in range(WORLD) for step in range(1, STEPS + 1)
    )
    consumed = [sample for e in steps for sample in e["data"]["samples"]]
    assert sorted(consumed) == list(range(STEPS * BATCH * WORLD))
    assert all(isinstance(e["data"]["loss"], float) for e in steps)


# --- fast in-process checks of the job's pure parts (no torchrun) -------------------------------------------


def test_sample_is_a_pure_function_of_seed_and_id() -> None:
    import torch

    from chaos.reference.trainer import make_batch, sample

    x1, y1 = sample(SEED, 12345)
    x2, y2 = sample(SEED, 12345)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert not torch.equal(sample(SEED, 12346)[0], x1)
    assert not torch.equal(sample(SEED + 1, 12345)[0], x1)
    # A sample is the same whichever batch (rank, step, attempt) it is read in.
    features, labels = make_batch(SEED, [7, 12345])
    assert torch.equal(features[1], x1) and torch.equal(labels[1], y1)


def test_step_sample_ids_partition_the_id_space() -> None:
    from chaos.reference.trainer import step_sample_ids

    ids = [i for step in range(1, 6) for rank in range(3) for i in step_sample_ids(step, rank, 4, 3)]
    assert ids == list(range(5 * 4 * 3))


def test_checkpoints_are_pruned_and_a_corrupt_newest_falls_back(tmp_path: Path) -> None:
    import torch

    from chaos.reference import checkpoint_store as store
    from chaos.reference import trainer

    def save(step: int, state: dict[str, Any]) -> None:
        store.commit(tmp_path, step, [store.write_part(tmp_path, step, 0, state)], 1)

    for step in (10, 20, 30, 40):
        save(step, {"format": trainer.CHECKPOINT_FORMAT, "step": step})
    assert store.committed_steps(tmp_path) == [20, 30, 40]  # the newest KEEP
    assert not list(tmp_path.glob("ckpt-*/.rank-*"))  # no temp files left behind
    assert store.read_pointer(tmp_path) == 40

    def restore() -> tuple[int, Any] | None:
        found = store.restore(tmp_path, rank=0, world_size=1, attempt=1, reduce_min=lambda value: value)
        return None if found is None else (found[0], found[2])

    # A truncated newest checkpoint (a storage fault) must not stop recovery from the previous one.
    newest = store.step_dir(tmp_path, 40) / store.part_name(0)
    newest.write_bytes(newest.read_bytes()[:10])
    found = restore()
    assert found is not None and found[0] == 30 and found[1]["step"] == 30
    # weights_only loading refuses arbitrary pickles, even ones the manifest vouches for: it falls back too.
    torch.save({"format": trainer.CHECKPOINT_FORMAT, "obj": object.__new__(Job)}, tmp_path / "evil.pt")
    save(50, {"format": trainer.CHECKPOINT_FORMAT, "step": 50})
    (tmp_path / "evil.pt").replace(store.step_dir(tmp_path, 50) / store.part_name(0))
    manifest = store.step_dir(tmp_path, 50) / store.MANIFEST
    evil = (store.step_dir(tmp_path, 50) / store.part_name(0)).read_bytes()
    body = json.loads(manifest.read_text())
    body["files"][store.part_name(0)] = {"sha256": hashlib.sha256(evil).hexdigest(), "size": len(evil)}
    manifest.write_text(json.dumps(body))
    found = restore()
    assert found is not None and found[0] == 30
