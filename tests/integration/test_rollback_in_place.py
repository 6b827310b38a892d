"""The trainer side of the SDC rollback (chaos.reference.rollback.SdcRollback) on a real one-rank gloo group
and real checkpoints (chaos.reference.checkpoint_store): which checkpoint it loads, that it loads it into
the live model and optimizer, deletes the suspect ones, rewinds the loop and reports it. The guard's verdicts are
set by hand (one rank never disagrees with itself); the 3-rank story runs in tests/e2e/test_e2e_sdc_rollback.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from chaos.guards.consistency import ConsistencyGuard, Judgement, judge
from chaos.reference import checkpoint_store
from chaos.reference.rollback import SdcRollback, Steps
from chaos.reference.trainer_state import build_model, build_optimizer, make_batch, state_digest

SEED, LR = 1234, 0.05


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    store = tmp_path_factory.mktemp("pg") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


class Job:
    """A one-rank training state trained to step 20 with checkpoints at ``saves`` (the store keeps the newest 3),
    and the rollback watching it."""

    def __init__(
        self, directory: Path, policy: str = "clean", max_rollbacks: int = 3, saves: tuple[int, ...] = (5, 10, 15, 20)
    ) -> None:
        self.model = build_model(SEED)
        self.optimizer = build_optimizer(self.model, LR)
        self.guard = ConsistencyGuard(self.model, every=10)
        self.steps = Steps(1, 30)
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.digests: dict[int, str] = {}
        self.rollback = SdcRollback(
            self.guard,
            self.steps,
            model=self.model,
            optimizer=self.optimizer,
            directory=directory,
            seed=SEED,
            lr=LR,
            rank=0,
            world_size=1,
            policy=policy,
            max_rollbacks=max_rollbacks,  # type: ignore[arg-type]
            emit=lambda kind, **data: self.events.append((kind, data)),
        )
        for step in range(1, 21):
            self.train(step)
            if step in saves:
                state = {
                    "format": 1,
                    "step": step,
                    "model": self.model.state_dict(),
                    "optimizer": self.optimizer.state_dict(),
                    "rng": torch.get_rng_state(),
                }
                checkpoint_store.save(directory, step, state, rank=0, world_size=1, attempt=0)
                self.digests[step] = state_digest(self.model, self.optimizer)

    def train(self, step: int) -> None:
        x, y = make_batch(SEED, list(range(step * 4, step * 4 + 4)))
        self.optimizer.zero_grad()
        torch.nn.functional.mse_loss(self.model(x), y).backward()
        self.optimizer.step()

    def verdict(self, verdict: Judgement) -> None:
        """What the guard would have judged at its last exchange."""
        self.guard.last = verdict
        self.guard.checks += 1


def _split(step: int) -> Judgement:
    return Judgement(step, False, ("a", "b", "a"), (0, 0, 0), ((0, 2), (1,)), "a", (1,))


def test_rolls_back_in_place_to_the_newest_checkpoint_the_guard_verified_clean(group: None, tmp_path: Path) -> None:
    job = Job(tmp_path)
    job.verdict(judge(10, ["a"], [0]))
    assert job.rollback.after_step(11) is False and job.rollback.last_clean == 10
    with torch.no_grad():
        next(job.model.parameters()).view(-1)[0] += 1.0  # the corruption the guard is about to find
    job.verdict(_split(20))
    assert job.rollback.after_step(21) is True
    assert state_digest(job.model, job.optimizer) == job.digests[10]  # the live model and momentum, in place
    assert next(iter(job.steps)) == 11
    assert checkpoint_store.committed_steps(tmp_path) == [10]  # 15 and 20 may hold the corruption: deleted
    [(kind, data)] = job.events
    assert kind == "target.rollback"
    assert (data["from_step"], data["to_step"], data["detected_step"], data["last_clean_step"]) == (21, 10, 20, 10)
    assert data["removed"] == [15, 20] and data["odd_ranks"] == [1] and "rank 1" in data["reason"]
    assert job.rollback.last_clean == 10  # the replay's own checks verify what comes after


def test_without_a_clean_step_it_starts_again_from_scratch(group: None, tmp_path: Path) -> None:
    job = Job(tmp_path)
    job.verdict(_split(10))  # the very first check already disagrees: nothing was ever verified clean
    assert job.rollback.after_step(11) is True
    fresh = build_model(SEED)
    assert state_digest(job.model, job.optimizer) == state_digest(fresh, build_optimizer(fresh, LR))
    assert job.events[0][1]["to_step"] == 0 and job.events[0][1]["path"] is None
    assert next(iter(job.steps)) == 1 and checkpoint_store.committed_steps(tmp_path) == []


def test_a_clean_checkpoint_that_fails_verification_falls_back_to_an_older_one(group: None, tmp_path: Path) -> None:
    job = Job(tmp_path, saves=(3, 6, 9, 20))  # kept: 6, 9, 20
    job.verdict(judge(10, ["a"], [0]))
    job.rollback.after_step(11)
    part = checkpoint_store.step_dir(tmp_path, 9) / checkpoint_store.part_name(0)
    data = part.read_bytes()
    part.write_bytes(data[:100] + bytes([data[100] ^ 0xFF]) + data[101:])  # the manifest's sha256 no longer holds
    job.verdict(_split(20))
    assert job.rollback.after_step(21) is True
    assert state_digest(job.model, job.optimizer) == job.digests[6]
    assert job.events[0][1]["to_step"] == 6 and job.events[0][1]["rejected"] == [9]


def test_the_broken_policy_rolls_back_to_the_newest(group: None, tmp_path: Path) -> None:
    job = Job(tmp_path, policy="newest")
    job.verdict(judge(10, ["a"], [0]))
    job.rollback.after_step(11)
    job.verdict(_split(20))
    assert job.rollback.after_step(21) is True
    assert state_digest(job.model, job.optimizer) == job.digests[20]
    assert job.events[0][1]["to_step"] == 20 and job.events[0][1]["removed"] == []


def test_a_job_that_keeps_diverging_gives_up(group: None, tmp_path: Path) -> None:
    job = Job(tmp_path, max_rollbacks=1)
    job.verdict(_split(10))
    assert job.rollback.after_step(11) is True
    job.verdict(_split(10))
    with pytest.raises(RuntimeError, match="diverged again at step 10 after 1 rollback"):
        job.rollback.after_step(11)


def test_agreeing_verdicts_change_nothing(group: None, tmp_path: Path) -> None:
    job = Job(tmp_path)
    before = state_digest(job.model, job.optimizer)
    job.verdict(judge(10, ["a"], [0]))
    assert job.rollback.after_step(11) is False
    assert job.rollback.after_step(12) is False  # no new verdict: nothing to read
    job.verdict(judge(20, ["b"], [0]))
    assert job.rollback.after_step(21) is False and job.rollback.last_clean == 20
    assert state_digest(job.model, job.optimizer) == before and not job.events
    assert checkpoint_store.committed_steps(tmp_path) == [10, 15, 20]
