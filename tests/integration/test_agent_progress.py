"""The agent's own progress reports (:mod:`chaos.injob.progress`) in one real process: what a job with only the
``attach`` line and the loop hooks reports, from real ``torch.save``/``torch.load`` calls and real DataLoaders.

Multi-rank behaviour (DDP, a kill, a torchrun restart, a golden comparison) is end to end in
``tests/e2e/test_e2e_user_resume.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from support import Recorder
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset

from chaos import events
from chaos.agent import Agent
from chaos.injob.progress import holds_model, state_digest
from chaos.plan.agent_plan import InJobPlan

ORIGINAL_SAVE, ORIGINAL_LOAD = torch.save, torch.load


class Indexed(Dataset[torch.Tensor]):
    """Sample i is the tensor [i]: a delivered batch names its own indices, to compare with what was reported."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([index])


class Stream(IterableDataset[torch.Tensor]):
    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter([torch.tensor([0])])


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))


def _agent(model: nn.Module, recorder: Recorder, **kwargs: Any) -> tuple[Agent, torch.optim.Optimizer]:
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    agent = Agent(model, optimizer=optimizer, plan=InJobPlan(), emit=recorder, consistency_every=0, **kwargs)
    return agent, optimizer


def _train_step(agent: Agent, model: nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    agent.begin_step(step)
    optimizer.zero_grad()
    loss = model(torch.ones(2, 4)).pow(2).mean()
    loss.backward()
    agent.after_backward(loss)
    if agent.allow_optimizer_step():
        optimizer.step()
    agent.end_step()


def _of(recorder: Recorder, kind: str) -> list[dict[str, Any]]:
    return [data for k, _, data in recorder.events if k == kind]


@pytest.fixture(autouse=True)
def _first_attempt(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    yield
    assert torch.save is ORIGINAL_SAVE and torch.load is ORIGINAL_LOAD, "a test left torch.save/load wrapped"


def test_start_steps_checkpoints_and_digest_from_the_hooks_and_torch_save(tmp_path: Path) -> None:
    model, recorder = _model(), Recorder()
    agent, optimizer = _agent(model, recorder)
    [start] = _of(recorder, "target.start")
    assert start["attempt"] == 0 and isinstance(start["pid"], int) and start["pid"] > 0
    assert torch.save is not ORIGINAL_SAVE  # watching while attached
    for step in (1, 2, 3, 4):
        _train_step(agent, model, optimizer, step)
        if step % 2 == 0:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, tmp_path / "c")
            torch.save({"model": model.state_dict()}, tmp_path / "again")  # same step: reported once
        torch.save({"note": torch.zeros(3)}, tmp_path / "other")  # not the model's state: not a checkpoint
    agent.close()
    assert torch.save is ORIGINAL_SAVE and torch.load is ORIGINAL_LOAD  # originals back at close
    steps = _of(recorder, "target.step")
    assert [s["step"] for s in steps] == [1, 2, 3, 4]
    assert all(isinstance(s["loss"], float) and s["attempt"] == 0 for s in steps)
    assert "samples" not in steps[0]  # no data handed over: no sample ids
    checkpoints = _of(recorder, "target.checkpoint")
    assert [(c["step"], c["path"], c["seen"]) for c in checkpoints] == [
        (2, str(tmp_path / "c"), "torch.save"),
        (4, str(tmp_path / "c"), "torch.save"),
    ]
    [digest] = _of(recorder, "target.digest")
    assert digest["digest"] == state_digest(model, optimizer) and digest["step"] == 4
    assert not _of(recorder, "target.resume")  # started at step 1: nothing resumed
    agent.close()
    assert len(_of(recorder, "target.digest")) == 1  # close is idempotent


def test_a_restarted_attempt_reports_its_resume_from_the_first_step_and_the_load_it_saw(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _model()
    torch.save({"model": model.state_dict(), "step": 6}, tmp_path / "ckpt-6.pt")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    recorder = Recorder()
    agent, optimizer = _agent(model, recorder)
    state = torch.load(tmp_path / "ckpt-6.pt")  # a load after attach is seen (before it, it cannot be)
    model.load_state_dict(state["model"])
    for step in (7, 8):
        _train_step(agent, model, optimizer, step)
    agent.close()
    [resume] = _of(recorder, "target.resume")
    assert resume == {"step": 6, "attempt": 2, "path": str(tmp_path / "ckpt-6.pt"), "seen": "torch.load"}
    assert [(s["step"], s["attempt"]) for s in _of(recorder, "target.step")] == [(7, 2), (8, 2)]
    assert _of(recorder, "target.start")[0]["attempt"] == 2


def test_resume_without_a_seen_load_comes_from_the_loop_and_an_explicit_call_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    model, recorder = _model(), Recorder()
    agent, optimizer = _agent(model, recorder)
    _train_step(agent, model, optimizer, 5)
    agent.close()
    assert _of(recorder, "target.resume") == [{"step": 4, "attempt": 1, "path": None, "seen": "first step"}]

    recorder = Recorder()
    agent, optimizer = _agent(model, recorder)
    agent.resumed(3, "/ckpt/3")  # the job's own word: no inferred second report
    agent.checkpoint_saved(3, "/ckpt/3")
    _train_step(agent, model, optimizer, 5)
    agent.close()
    assert _of(recorder, "target.resume") == [{"step": 3, "attempt": 1, "path": "/ckpt/3", "seen": "explicit"}]
    assert _of(recorder, "target.checkpoint") == [{"step": 3, "path": "/ckpt/3", "attempt": 1, "seen": "explicit"}]
    # A job that checked its checkpoint before loading it says so (resumed_from_verified_checkpoint reads it).
    recorder = Recorder()
    agent, optimizer = _agent(model, recorder)
    agent.resumed(3, "/ckpt/3", verified=True)
    agent.close()
    assert _of(recorder, "target.resume")[0]["verified"] is True


def test_job_emits_leaves_out_what_the_job_reports_itself(tmp_path: Path) -> None:
    model, recorder = _model(), Recorder()
    agent, optimizer = _agent(model, recorder, job_emits={"target.step", "target.digest"})
    _train_step(agent, model, optimizer, 1)
    torch.save({"model": model.state_dict()}, tmp_path / "c")
    agent.close()
    assert [k for k, _, _ in recorder.events] == ["target.start", "target.checkpoint"]

    recorder = Recorder()
    agent, optimizer = _agent(model, recorder, job_emits="all")
    assert torch.save is ORIGINAL_SAVE  # nothing to report: nothing wrapped
    _train_step(agent, model, optimizer, 1)
    agent.close()
    assert recorder.events == []
    with pytest.raises(ValueError, match="job_emits"):
        _agent(model, recorder, job_emits={"target.stpe"})
    with pytest.raises(ValueError, match="job_emits"):
        _agent(model, recorder, job_emits="target.step")  # a string is not a set of kinds


def test_outside_a_chaos_run_nothing_is_wrapped_or_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(events.ENV_EVENTS, raising=False)
    model = _model()
    loader = DataLoader(Indexed(8), batch_size=2)
    agent = Agent(model, plan=InJobPlan(), consistency_every=0, data=loader)  # the real emit, CHAOS_EVENTS unset
    assert not agent.progress.active
    assert torch.save is ORIGINAL_SAVE and type(loader) is DataLoader
    agent.close()


def test_samples_are_the_indices_of_each_delivered_batch_even_with_prefetching_workers() -> None:
    dataset = Indexed(32)
    sampler = DistributedSampler(dataset, num_replicas=2, rank=1, shuffle=True, seed=3)
    loader = DataLoader(dataset, batch_size=4, sampler=sampler, num_workers=2, prefetch_factor=2)
    model, recorder = _model(), Recorder()
    agent, optimizer = _agent(model, recorder, data=loader)
    seen: list[list[int]] = []
    for step, batch in enumerate(loader, start=1):
        seen.append(batch.reshape(-1).tolist())
        _train_step(agent, model, optimizer, step)
    agent.close()
    reported = [s["samples"] for s in _of(recorder, "target.step")]
    assert reported == seen and len(seen) == 4  # rank 1's half of the epoch, batch by batch
    assert sorted(i for batch in reported for i in batch) == sorted(sampler)
    assert type(loader) is DataLoader and type(loader.batch_sampler).__name__ == "BatchSampler"  # classes restored
    assert type(loader.batch_sampler) is torch.utils.data.BatchSampler


def test_a_resume_that_skips_trained_batches_reports_only_the_batch_it_trains(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    loader = DataLoader(Indexed(12), batch_size=3)
    model, recorder = _model(), Recorder()
    agent, optimizer = _agent(model, recorder, data=loader)
    for step, batch in enumerate(loader, start=1):
        if step < 3:
            continue  # trained before the restart
        assert batch.reshape(-1).tolist() == [3 * (step - 1), 3 * (step - 1) + 1, 3 * (step - 1) + 2]
        _train_step(agent, model, optimizer, step)
    agent.close()
    assert [(s["step"], s["samples"]) for s in _of(recorder, "target.step")] == [(3, [6, 7, 8]), (4, [9, 10, 11])]


def test_a_second_epoch_gets_new_ids_and_a_batch_fetched_inside_the_step_counts() -> None:
    dataset = Indexed(4)
    sampler = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=False)
    loader = DataLoader(dataset, batch_size=2, sampler=sampler)
    model, recorder = _model(), Recorder()
    agent, optimizer = _agent(model, recorder, data=loader)
    step = 0
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        it = iter(loader)
        for _ in range(2):
            step += 1
            agent.begin_step(step)
            next(it)  # fetched inside the step
            agent.allow_optimizer_step()
            agent.end_step()
    agent.close()
    assert [s["samples"] for s in _of(recorder, "target.step")] == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_a_bare_sampler_is_tracked_per_index_and_bad_data_is_refused() -> None:
    sampler = torch.utils.data.SequentialSampler(range(6))
    model, recorder = _model(), Recorder()
    agent, optimizer = _agent(model, recorder)
    agent.track(sampler)
    it = iter(sampler)
    for step in (1, 2):
        agent.begin_step(step)
        [next(it) for _ in range(3)]
        agent.end_step()
    agent.close()
    assert [s["samples"] for s in _of(recorder, "target.step")] == [[0, 1, 2], [3, 4, 5]]
    with pytest.raises(ValueError, match="IterableDataset"):
        _agent(model, Recorder(), data=DataLoader(Stream()))
    with pytest.raises(ValueError, match="DataLoader or a sampler"):
        _agent(model, Recorder(), data=42)


def test_holds_model_knows_the_models_state_in_its_usual_shapes() -> None:
    model = _model()
    ddp_keys = {f"module.{k}": v.clone() for k, v in model.state_dict().items()}
    assert holds_model(model.state_dict(), model)
    assert holds_model({"state": {"model": model.state_dict()}, "step": 3}, model)
    assert holds_model([{"weights": ddp_keys}], model)  # a DDP state_dict, copied: matched by its keys
    assert not holds_model({"model": {"0.weight": torch.zeros(1)}}, model)  # some keys only, not the model's
    assert not holds_model({"a": {"b": {"c": {"d": model.state_dict()}}}}, model)  # deeper than anyone saves it


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # single-process dcp: what this test wants
def test_torch_distributed_checkpoint_saves_and_loads_are_seen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed.checkpoint as dcp  # imported by the job before attach, as jobs do

    original = dcp.save
    model, recorder = _model(), Recorder()
    agent, optimizer = _agent(model, recorder)
    _train_step(agent, model, optimizer, 1)
    dcp.save({"model": model.state_dict()}, checkpoint_id=tmp_path / "dcp-1")
    agent.close()
    assert dcp.save is original
    assert _of(recorder, "target.checkpoint") == [
        {"step": 1, "path": str(tmp_path / "dcp-1"), "attempt": 0, "seen": "torch.distributed.checkpoint.save"}
    ]

    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    recorder = Recorder()
    agent, optimizer = _agent(model, recorder)
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=tmp_path / "dcp-1")  # in place, into the live model's tensors
    _train_step(agent, model, optimizer, 2)
    agent.close()
    [resume] = _of(recorder, "target.resume")
    assert resume["step"] == 1 and resume["seen"] == "torch.distributed.checkpoint.load", resume
    assert resume["path"] == str(tmp_path / "dcp-1")


def test_a_plans_digest_every_reports_the_state_after_every_kth_step_and_at_close() -> None:
    model, recorder = _model(), Recorder()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    agent = Agent(model, optimizer=optimizer, plan=InJobPlan(digest_every=2), emit=recorder, consistency_every=0)
    digests = []
    for step in range(1, 6):
        _train_step(agent, model, optimizer, step)
        digests.append(state_digest(model, optimizer))
    agent.close()
    got = [(d["step"], d["digest"]) for d in _of(recorder, "target.digest")]
    # after steps 2 and 4 (the state then: each differs), and the final one at close (step 5)
    assert got == [(2, digests[1]), (4, digests[3]), (5, digests[4])], got
    assert len({digest for _, digest in got}) == 3
