"""The consistency digest's batched sums (``chaos.guards.sum_batch``) equal the per-tensor ones bit for bit, so the
digest a rank computes does not depend on which path took its tensors; non-finite tensors are flagged exactly."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from chaos.guards.consistency import ConsistencyGuard, TensorSums
from chaos.guards.sum_batch import SMALL, SumBatch


def _mixed(seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [
        torch.randn(64, 16, generator=gen),
        torch.randn(64, generator=gen) * 1e30,  # large magnitudes: squares of big integer views wrap in int64
        torch.randn(7, generator=gen, dtype=torch.float64),
        torch.randn(33, generator=gen).to(torch.bfloat16),
        torch.randn(5, generator=gen).to(torch.float16),
        torch.arange(10),  # integer: left to the per-tensor path
        torch.randn(SMALL + 1, generator=gen),  # large: left to the per-tensor path
        torch.randn(0),  # empty: left to the per-tensor path
        torch.randn(3, 4, generator=gen).t(),  # not contiguous
        torch.randn(300, generator=gen),
    ]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_batched_sums_equal_the_per_tensor_sums(seed: int) -> None:
    tensors = _mixed(seed)
    batch = SumBatch(TensorSums().buffer)
    for _ in range(2):  # the second call runs on the cached plan
        got = batch.sums(tensors)
        assert sorted(got.positions) == [0, 1, 2, 3, 4, 8, 9]  # grouped by dtype
        s1, s2 = torch.cat(got.s1).tolist(), torch.cat(got.s2).tolist()
        for position, a, b in zip(got.positions, s1, s2, strict=True):
            e1, e2 = TensorSums().sums(tensors[position])
            assert (a, b) == (int(e1), int(e2)), position
        assert got.flagged == []


def test_a_changed_tensor_storage_makes_a_new_plan_and_nonfinite_tensors_are_flagged() -> None:
    tensors = _mixed(3)
    batch = SumBatch(TensorSums().buffer)
    batch.sums(tensors)
    tensors[3] = torch.full((33,), float("nan"), dtype=torch.bfloat16)  # replaced: new storage
    tensors[0][5, 5] = float("inf")  # in place: same storage, the cached view sees it
    got = batch.sums(tensors)
    assert sorted(got.flagged) == [0, 3]
    index = got.positions.index(3)
    e1, _ = TensorSums().sums(tensors[3])
    assert int(torch.cat(got.s1)[index]) == int(e1)


def test_the_guard_digest_is_the_same_with_and_without_the_batch() -> None:
    torch.manual_seed(0)
    first = nn.Linear(16, 64)
    model = nn.Sequential(first, nn.Tanh(), nn.Linear(64, 128 * 1024), nn.Linear(128 * 1024, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 16)).sum().backward()
    optimizer.step()
    with torch.no_grad():
        first.bias[3] = float("nan")
    guard = ConsistencyGuard(model, optimizer=optimizer, every=1, emit=lambda *a, **k: None, optimizer_state=True)
    named = guard.tensors()
    batched = guard._local(named)
    guard.batch.sums = lambda tensors: SumBatch(TensorSums().buffer).sums([])  # type: ignore[method-assign]  # every tensor one by one
    single = guard._local(named)
    assert torch.equal(batched[0], single[0]) and torch.equal(batched[1], single[1])
    assert batched[2] == single[2] == [("0.bias", 1)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_flags_exactly_the_tensors_holding_nan_or_inf_whatever_their_sum_does(dtype: torch.dtype) -> None:
    # The group is screened by one float sum: a sum that overflows on finite values must flag nothing, and
    # opposite infinities (whose sum is NaN) or an infinity beside huge finite values must still be flagged.
    big = torch.finfo(dtype).max
    tensors = [
        torch.full((8,), big, dtype=dtype),  # finite; the group's sum overflows (float16/bfloat16: summed in float32)
        torch.tensor([float("inf"), float("-inf")], dtype=dtype),  # sums to NaN
        torch.tensor([1.0, 2.0], dtype=dtype),
        torch.tensor([-big, float("inf")], dtype=dtype),
        torch.tensor([3.0, float("nan")], dtype=dtype),
    ]
    got = SumBatch(TensorSums().buffer).sums(tensors)
    assert sorted(got.flagged) == [1, 3, 4]
    clean = SumBatch(TensorSums().buffer).sums([tensors[0], tensors[2], torch.full((4,), -big, dtype=dtype)])
    assert clean.flagged == []
