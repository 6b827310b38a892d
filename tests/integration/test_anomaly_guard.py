"""Gradient anomaly guard: local NaN and 1e7 blow-ups are pinned on the right rank; clean training is quiet.

The distributed tests inject into rank 1's LOCAL bucket through the checksum guard's ``local`` site (the one
corruption no checksum of the reduction can see) and let the anomaly guard observe the same buckets.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.distributed as dist
from support import Recorder
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from chaos.guards._dist import Report, run_group
from chaos.guards.anomaly import GradAnomalyGuard, anomaly_hook
from chaos.guards.checksum import ChecksumConfig, ChecksumState, checksum_hook
from chaos.injob.bitflip import scale_block, set_values

TIMEOUT_S = 180.0


class LocalFault:
    """At ``step`` on rank 1, corrupt the first bucket's local gradients: NaN, or 32 values x 1e7."""

    def __init__(self, state: ChecksumState, step: int, kind: str) -> None:
        self.state, self.step, self.kind = state, step, kind

    def __call__(self, site: str, bucket_index: int, tensor: torch.Tensor) -> None:
        if site != "local" or self.state.step != self.step or dist.get_rank() != 1 or bucket_index != 0:
            return
        if self.kind == "nan":
            set_values(tensor, [3], math.nan)
        else:
            scale_block(tensor, 0, 32, 1e7)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 128), nn.Tanh(), nn.Linear(128, 1))


def _train_worker(rank: int, world: int, report: Report, steps: int, fault: str | None, hook: str) -> dict[str, Any]:
    model = _model()
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.02)
    recorder = Recorder()
    guard = GradAnomalyGuard(model, emit=recorder)
    state = None
    if hook == "checksum":
        state = ChecksumState(config=ChecksumConfig(emit=Recorder()), observe=guard.observe)
        if fault is not None:
            state.corrupt = LocalFault(state, 30, fault)
        ddp.register_comm_hook(state, checksum_hook)
    else:
        ddp.register_comm_hook(guard, anomaly_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.02)
    gen = torch.Generator().manual_seed(rank)
    flagged: dict[int, list[str]] = {}
    for step in range(steps):
        if state is not None:
            state.step = step
        x = torch.randn(32, 16, generator=gen)
        loss = nn.functional.mse_loss(ddp(x), x.sum(1, keepdim=True).cos())
        opt.zero_grad()
        loss.backward()
        found = guard.check(step, loss.detach())
        if found:
            flagged[step] = found
            continue  # what a trainer does with an anomaly: skip the update
        opt.step()
    return {"flagged": flagged, "events": recorder.events, "sdc": state.stats.mismatches if state else 0}


def test_clean_training_is_never_flagged() -> None:
    for r in run_group(_train_worker, 2, 120, None, "anomaly", timeout_s=TIMEOUT_S):
        assert r["flagged"] == {} and r["events"] == []


@pytest.mark.parametrize(("fault", "reason"), [("nan", "nonfinite_grad"), ("scale", "peer_norm")])
def test_local_fault_is_flagged_on_the_right_rank_and_only_then(fault: str, reason: str) -> None:
    results = run_group(_train_worker, 2, 40, fault, "checksum", timeout_s=TIMEOUT_S)
    for r in results:
        assert list(r["flagged"]) == [30]  # the same verdict on every rank
        assert any(line.startswith(f"rank 1: {reason}") for line in r["flagged"][30])
        assert not any(line.startswith("rank 0") for line in r["flagged"][30])
        assert r["sdc"] == 0  # faithfully checksummed bad data: invisible to the checksum guard
    assert results[0]["events"] == []
    kinds = {(kind, emitted_rank, data["reason"], data["step"]) for kind, emitted_rank, data in results[1]["events"]}
    assert ("detect.grad_anomaly", 1, reason, 30) in kinds


# -- rules on their own (one process, no group) ------------------------------------------------------------------


def _grads(model: nn.Module, scale: float) -> None:
    for p in model.parameters():
        p.grad = torch.full_like(p, scale)


def test_norm_history_and_loss_spike_rules() -> None:
    model = nn.Linear(8, 8)
    recorder = Recorder()
    guard = GradAnomalyGuard(model, emit=recorder, min_history=5)
    for step in range(10):
        _grads(model, 1e-3 * (1 + 0.1 * (step % 3)))
        assert guard.check(step, 1.0 + 0.05 * step) == []
    _grads(model, 1.0)  # x1000 its history
    [norm_line] = guard.check(10, 1.2)
    assert norm_line.startswith("rank 0: norm_history")
    _grads(model, 1e-3)
    [loss_line] = guard.check(11, 50.0)
    assert loss_line.startswith("rank 0: loss_spike")
    _grads(model, 1e-3)
    assert guard.check(12, float("nan")) == ["rank 0: nonfinite_loss: loss is NaN or Inf"]
    assert [e[2]["reason"] for e in recorder.events] == ["norm_history", "loss_spike", "nonfinite_loss"]
    assert guard.check(13, 1.1) == []  # the anomalous steps did not become the new normal


def test_finite_values_whose_norm_overflows_count_as_a_blow_up_not_nan() -> None:
    model = nn.Linear(4, 4)
    guard = GradAnomalyGuard(model, min_history=2, window=4)
    for step in range(3):
        _grads(model, 1e-3)
        guard.check(step)
    _grads(model, 1e30)  # squares overflow float32; values are finite
    [line] = guard.check(3)
    assert line.startswith("rank 0: norm_history")
