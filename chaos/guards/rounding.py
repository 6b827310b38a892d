"""Block checksums and their rounding-error bounds, as derived in :mod:`chaos.guards.checksum`'s docstring.

Pure tensor functions (nothing distributed), so the bound can be tested on its own. Conventions: ``x`` is a
flat, contiguous tensor; every per-block result is a float64 vector with one entry per block of a
:class:`BlockLayout`; ``u`` is a unit roundoff (half the machine epsilon).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

SUB_BLOCK = 64
U64 = 2.0**-53
# Smallest normal float32: a reduction that flushes subnormals to zero errs by less than this per element.
TINY32 = 2.0**-126


@dataclass(frozen=True)
class BlockLayout:
    """``numel`` elements cut into ``full`` blocks of ``block`` plus one shorter ``tail`` block (if any).

    Sums accumulate in sub-blocks of ``sub`` elements (``block`` is a multiple of ``sub``).
    """

    numel: int
    block: int
    sub: int

    @property
    def full(self) -> int:
        return self.numel // self.block

    @property
    def tail(self) -> int:
        return self.numel - self.full * self.block

    @property
    def n_blocks(self) -> int:
        return self.full + (1 if self.tail else 0)

    def span(self, block: int) -> tuple[int, int]:
        """``[start, stop)`` of block ``block``."""
        start = block * self.block
        return start, min(start + self.block, self.numel)

    def lengths(self) -> torch.Tensor:
        """Elements per block, float64."""
        out = torch.full((self.n_blocks,), float(self.block), dtype=torch.float64)
        if self.tail:
            out[-1] = float(self.tail)
        return out


def unit_roundoff(dtype: torch.dtype) -> float:
    """Half the machine epsilon: the largest relative error of one correctly rounded operation."""
    return float(torch.finfo(dtype).eps) / 2.0


def gamma(k: float, u: float) -> float:
    """Higham's gamma_k = k u / (1 - k u); infinite when k u >= 1 (no bound)."""
    return math.inf if k * u >= 1.0 else k * u / (1.0 - k * u)


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulation dtype of the block sums: float32, or float64 for float64 data."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _partials(x: torch.Tensor, layout: BlockLayout) -> torch.Tensor:
    """Sub-block sums of the full blocks, in the accumulation dtype, shaped ``[full, block // sub]``."""
    acc = acc_dtype(x.dtype)
    main = x[: layout.full * layout.block].view(-1, layout.sub)
    # One read of the data: torch sums float32 into float32 at memory speed, while float64 accumulation of
    # float32 input runs ~40x slower on CPU. 64-element partials keep the float32 rounding term tiny.
    partial = main.sum(1) if main.dtype == acc else main.sum(1, dtype=acc)
    return partial.view(layout.full, -1)


def block_sums(x: torch.Tensor, layout: BlockLayout) -> torch.Tensor:
    """Per-block sums (float32 sub-block partials added in float64; the tail block wholly in float64)."""
    parts = []
    if layout.full:
        parts.append(_partials(x, layout).sum(1, dtype=torch.float64))
    if layout.tail:
        parts.append(x[layout.full * layout.block :].sum(dtype=torch.float64).reshape(1))
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def sums_and_lower_bounds(x: torch.Tensor, layout: BlockLayout) -> torch.Tensor:
    """``[2, n_blocks]``: per-block sums, and per-block L with ``L <= sum|x|`` guaranteed.

    L is the sum of the sub-blocks' |partial sums| divided by the partials' worst rounding growth, so it
    comes from the same single read as the sums. It can be far below sum|x| (a sub-block whose values cancel
    contributes ~0), which only ever makes the tolerance derived from it smaller: a block within that
    tolerance is certainly within the full one.
    """
    sums, lows = [], []
    if layout.full:
        partial = _partials(x, layout)
        sums.append(partial.sum(1, dtype=torch.float64))
        lows.append(partial.abs().sum(1, dtype=torch.float64))
    if layout.tail:
        tail = x[layout.full * layout.block :].to(torch.float64)
        sums.append(tail.sum().reshape(1))
        lows.append(tail.abs().sum().reshape(1))
    out = torch.stack([torch.cat(sums), torch.cat(lows)])
    growth = (1.0 + gamma(layout.sub - 1, unit_roundoff(acc_dtype(x.dtype)))) * (1.0 + gamma(layout.block + 1, U64))
    out[1].div_(growth)
    return out


def abs_sum_bounds(x: torch.Tensor, layout: BlockLayout, blocks: torch.Tensor) -> torch.Tensor:
    """Upper bounds ``A >= sum|x|`` of the given blocks (int64 indices), float64, from fused 2-norms.

    sum|x| <= sqrt(n) * ||x||_2, and the float32 norm N obeys
    ``||x||_2 <= (N / (1 - u) + sqrt(n * tiny)) / sqrt(1 - gamma_{n+1}(u))`` (squares below ``tiny`` may
    underflow to zero). One read of the selected blocks.
    """
    acc = acc_dtype(x.dtype)
    full_sel = blocks[blocks < layout.full]
    norms = torch.zeros(blocks.numel(), dtype=torch.float64)
    lengths = torch.full((blocks.numel(),), float(layout.block), dtype=torch.float64)
    if full_sel.numel():
        rows = x[: layout.full * layout.block].view(layout.full, layout.block).index_select(0, full_sel)
        computed = torch.linalg.vector_norm(rows, dim=1, dtype=None if rows.dtype == acc else acc)
        norms[: full_sel.numel()] = computed.to(torch.float64)
    if full_sel.numel() < blocks.numel():  # the tail block, always last in sorted order
        tail = x[layout.full * layout.block :].to(torch.float64)
        norms[-1] = torch.linalg.vector_norm(tail)
        lengths[-1] = float(layout.tail)
    u_a = unit_roundoff(acc)
    tiny = float(torch.finfo(acc).tiny)
    gam = lengths.add(1.0).mul_(u_a)
    gam = gam / (1.0 - gam)
    bound = (norms / (1.0 - u_a) + torch.sqrt(lengths * tiny)) * torch.sqrt(lengths) / torch.sqrt(1.0 - gam)
    return bound.mul_(1.0 + 16 * U64)


def tolerance_coefficients(
    layout: BlockLayout, dtype: torch.dtype, world: int, factor: float, scale: float | None
) -> tuple[float, float]:
    """``(rel, abs_per_element)``: a block's tolerance is ``rel * A + abs_per_element * n``.

    ``scale``: the send buffer is ``fl(intact * scale)`` while the checksums were taken from ``intact`` and
    scaled exactly, so elements may differ by the multiplication's rounding: u_d relative (none when
    ``scale`` is a power of two) plus half the dtype's smallest subnormal where the product underflows.
    """
    u_d = unit_roundoff(dtype)
    g_red = gamma(world - 1, u_d)
    g_acc = gamma(layout.sub - 1, unit_roundoff(acc_dtype(dtype)))
    rel = g_red + 2.0 * g_acc * (1.0 + g_red) + 3.0 * gamma(layout.block + world + 2, U64)
    absolute = world * TINY32
    if scale is not None:
        if math.frexp(scale)[0] != 0.5:
            rel += u_d * (1.0 + g_red)
        finfo = torch.finfo(dtype)
        absolute += world * float(finfo.smallest_normal) * float(finfo.eps) / 2
    return factor * rel, factor * absolute
