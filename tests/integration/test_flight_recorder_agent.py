"""The agent's flight recorder and hang faults inside a real (1-rank gloo) process group, in this process:

- with ``CHAOS_FLIGHT_DIR`` set, ``attach`` records DDP's gradient all-reduce (through the comm hook it installs)
  and the job's own ``dist.barrier`` with the step and the index inside the step; without it nothing is written;
- a planned ``spin`` really holds the rank for its duration at its step and reports applied/healed;
- a planned ``skip_collective`` really skips the collective at (step, index): the gradient is not reduced there.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from chaos.agent import Agent
from chaos.injob import flight_recorder
from chaos.injob.flight_recorder import ENV_FLIGHT_DIR, flight_path, read_state
from chaos.plan.agent_plan import InJobOp, InJobPlan


@pytest.fixture()
def group() -> Iterator[None]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield
    finally:
        flight_recorder.uninstall()
        dist.destroy_process_group()


def _train(plan: InJobPlan, steps: int) -> tuple[list[tuple[str, dict[str, Any]]], Agent]:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    ddp = DistributedDataParallel(model)
    got: list[tuple[str, dict[str, Any]]] = []
    agent = Agent(model, ddp=ddp, plan=plan, emit=lambda kind, **data: got.append((kind, data)), consistency_every=0)
    for step in range(1, steps + 1):
        agent.begin_step(step)
        ddp(torch.ones(3, 4)).sum().backward()
        agent.after_backward()
        dist.barrier()
        agent.end_step()
    return got, agent


def test_the_gradient_all_reduce_and_user_collectives_are_recorded(
    group: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_FLIGHT_DIR, str(tmp_path))
    _train(InJobPlan(), 3)
    state = read_state(flight_path(tmp_path, 0))
    assert state is not None and state.started == state.completed == 6, state  # 3 x (gradient + barrier)
    assert [(r.step, r.index, r.op) for r in state.recent[-2:]] == [(3, 0, "all_reduce"), (3, 1, "barrier")]
    assert all(r.end_ns >= r.start_ns > 0 for r in state.recent)
    assert state.recent[-2].nbytes == (4 * 2 + 2) * 4  # the gradient bucket: weight and bias, float32


def test_without_the_flight_dir_nothing_is_recorded(
    group: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENV_FLIGHT_DIR, raising=False)
    _, agent = _train(InJobPlan(), 1)
    assert agent.recorder is None and flight_recorder.active() is None


def test_spin_holds_the_rank_for_its_duration(group: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_FLIGHT_DIR, str(tmp_path))
    op = InJobOp(op_id="s1", fault="spin-0", injector="spin", params={"rank": 0}, at_step=2, duration_s=0.5)
    began = time.monotonic()
    got, _ = _train(InJobPlan(ops=[op]), 3)
    assert time.monotonic() - began >= 0.5
    kinds = [(kind, data.get("step")) for kind, data in got if kind.startswith("fault.")]
    assert kinds == [("fault.applied", 2), ("fault.healed", None)], got
    assert [d for k, d in got if k == "fault.healed"][0]["spun_s"] >= 0.5


def test_skip_collective_skips_exactly_that_collective(
    group: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_FLIGHT_DIR, str(tmp_path))
    op = InJobOp(op_id="k1", fault="skip-0", injector="skip_collective", params={"rank": 0, "index": 1}, at_step=2)
    got, _ = _train(InJobPlan(ops=[op]), 3)
    applied = [d for k, d in got if k == "fault.applied"]
    assert len(applied) == 1 and (applied[0]["step"], applied[0]["index"], applied[0]["collective"]) == (
        2,
        1,
        "barrier",
    )
    state = read_state(flight_path(tmp_path, 0))
    assert state is not None and state.started == 5, state  # 6 collectives, the step-2 barrier skipped
    assert [(r.step, r.index, r.op) for r in state.recent] == [
        (1, 0, "all_reduce"),
        (1, 1, "barrier"),
        (2, 0, "all_reduce"),
        (3, 0, "all_reduce"),
        (3, 1, "barrier"),
    ]
