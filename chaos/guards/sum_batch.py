"""The consistency digest's per-tensor integer sums for many small tensors at once.

A model's parameters and optimizer state are mostly small tensors (biases, norms, small layers), and per tensor
the digest takes about nine torch calls (view, widen, sum, square, sum, float sum, ...): on a CPU that is
dispatch, not arithmetic (docs/design/sdc-guards.md, "The consistency guard", has the cost). Here the small
floating-point CPU tensors of one dtype are read as one: their integer views are concatenated
(one copy), widened to int64 once, and summed per tensor with ``index_add_`` over a cached segment index, then
squared in place and summed again. The sums are the same int64 values :class:`chaos.guards.consistency.TensorSums`
computes tensor by tensor (integer addition is exact and, wrapping mod 2^64, independent of order), so the
digest does not change: ``tests/unit/test_sum_batch.py`` holds them equal.

Non-finite values: one float sum over the concatenation (not finite when any element is NaN/Inf) instead of a
float sum per tensor; only when it is not finite are the group's tensors looked at one by one (the rare path).

The plan (which tensors are batched, their views and segment index) is cached while the tensors keep their
storage, size and dtype, which is every step of a training loop (optimizers update in place); a parameter
replaced by a new tensor, or optimizer state appearing after the first step, makes a new plan.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

BATCHED_DTYPES = {
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
    torch.float32: torch.int32,
    torch.float64: torch.int64,
}
_FLOAT_SUM = {
    torch.float16: torch.float32,  # summed wider: a half's sum of many ones overflows at 65504
    torch.bfloat16: torch.float32,
    torch.float32: torch.float32,
    torch.float64: torch.float64,
}
SMALL = 1 << 16
"""Tensors of at most this many elements are batched; larger ones cost arithmetic, not dispatch."""
GROUP_LIMIT = 1 << 18
"""The most elements in one batch (its int64 widening stays in cache, like the per-tensor path's chunks)."""

Key = tuple[tuple[int, int, torch.dtype, torch.device], ...]
Scratch = Callable[[torch.device, int], torch.Tensor]
"""An int64 scratch buffer of at least the given size on the device (the per-tensor path's, shared)."""


@dataclass(frozen=True)
class _Group:
    positions: list[int]  # indices into the hashed list
    views: list[torch.Tensor]  # detached flat integer views of those tensors
    segments: torch.Tensor  # int64 tensor index of every element of the concatenation
    dtype: torch.dtype  # the tensors' floating dtype
    numel: int


@dataclass(frozen=True)
class BatchResult:
    """Per-tensor ``s1``/``s2`` for the batched positions, and the positions holding non-finite values."""

    positions: list[int]
    s1: list[torch.Tensor]  # one int64 vector per group, aligned with that group's positions
    s2: list[torch.Tensor]
    flagged: list[int]


def _key(tensors: list[torch.Tensor]) -> Key:
    return tuple((t.data_ptr(), t.numel(), t.dtype, t.device) for t in tensors)


class SumBatch:
    """Batched ``s1``/``s2`` of the small floating-point CPU tensors of a list (see the module docstring);
    ``scratch`` lends the int64 buffer the widening goes through."""

    def __init__(self, scratch: Scratch) -> None:
        self._key: Key | None = None
        self._groups: list[_Group] = []
        self._scratch = scratch

    def _plan(self, tensors: list[torch.Tensor], key: Key) -> None:
        open_groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
        sizes: dict[tuple[torch.device, torch.dtype], int] = {}
        groups: list[list[int]] = []
        for index, tensor in enumerate(tensors):
            # CPU only: on an accelerator the per-tensor kernels are launched asynchronously (no dispatch wait),
            # and index_add_ there may refuse torch.use_deterministic_algorithms.
            if tensor.dtype not in BATCHED_DTYPES or tensor.device.type != "cpu" or not 0 < tensor.numel() <= SMALL:
                continue
            where = (tensor.device, tensor.dtype)
            if where not in open_groups or sizes[where] + tensor.numel() > GROUP_LIMIT:
                open_groups[where] = []
                sizes[where] = 0
                groups.append(open_groups[where])
            open_groups[where].append(index)
            sizes[where] += tensor.numel()
        self._groups = []
        for positions in groups:
            first = tensors[positions[0]]
            views = [tensors[i].detach().reshape(-1).view(BATCHED_DTYPES[first.dtype]) for i in positions]
            lengths = torch.tensor([v.numel() for v in views], dtype=torch.int64, device=first.device)
            segments = torch.repeat_interleave(torch.arange(len(views), device=first.device), lengths)
            self._groups.append(_Group(positions, views, segments, first.dtype, int(lengths.sum())))
        self._key = key

    def sums(self, tensors: list[torch.Tensor]) -> BatchResult:
        """``s1``/``s2`` of every small floating-point tensor of ``tensors`` and which of them hold NaN/Inf
        (exactly those with at least one non-finite element; a host sync per group). The others (large, integer,
        empty) are left to the caller: their positions are not in the result. Reads its inputs only."""
        key = _key(tensors)
        if key != self._key:
            self._plan(tensors, key)
        result = BatchResult([], [], [], [])
        for group in self._groups:
            joined = torch.cat(group.views)
            wide = self._scratch(joined.device, group.numel)[: group.numel]
            wide.copy_(joined)  # widen first: the square of a 32-bit value is exact in int64
            count = len(group.positions)
            s1 = torch.zeros(count, dtype=torch.int64, device=joined.device).index_add_(0, group.segments, wide)
            wide.mul_(wide)
            s2 = torch.zeros(count, dtype=torch.int64, device=joined.device).index_add_(0, group.segments, wide)
            result.positions.extend(group.positions)
            result.s1.append(s1)
            result.s2.append(s2)
            # One float sum says whether the group may hold NaN/Inf (a sum with one is never finite); a finite
            # group whose sum overflowed is then looked at tensor by tensor and flags nothing. A tenth of the
            # cost of isfinite().all() on a small group (~5 against ~47 us here): the check runs every N steps.
            total = joined.view(group.dtype).sum(dtype=_FLOAT_SUM[group.dtype])
            if not math.isfinite(float(total)):
                result.flagged.extend(
                    i
                    for i, view in zip(group.positions, group.views, strict=True)
                    if not bool(torch.isfinite(view.view(group.dtype)).all())
                )
        return result


__all__ = ["BATCHED_DTYPES", "GROUP_LIMIT", "SMALL", "BatchResult", "Scratch", "SumBatch"]
