"""Block checksums of :mod:`chaos.guards.checksum` and their rounding-error bounds, derived here.

Pure tensor functions (nothing distributed), so the bound can be tested on its own. Conventions: ``x`` is a
flat, contiguous tensor; every per-block result is a float64 vector with one entry per block of a
:class:`BlockLayout`; ``u`` is a unit roundoff (half the machine epsilon).

Tolerance derivation (rigorous, IEEE round-to-nearest; u = unit roundoff, gamma_k(u) = k*u / (1 - k*u))
----------------------------------------------------------------------------------------------------------
Let rank r hold x_r (dtype d, unit roundoff u_d: 2^-24 float32, 2^-8 bfloat16, 2^-11 float16) and let a block
have n elements. Sums accumulate in float32 (u_a = 2^-24; float64 for float64 buckets) in sub-blocks of m = 64
elements (strided: a block read as 64 rows of n/64, partial j sums column j), whose sums are then added in float64 (u_64 = 2^-53). Any summation order of k terms errs by at most
gamma_{k-1} * sum|terms| (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., sec. 4.2), so:

1. declared sum  s_r = sum_i x_ri + e1,  |e1| <= (gamma_{m-1}(u_a) + gamma_n(u_64)) * S1_r,  S1_r = sum_i |x_ri|;
2. the reduction (gloo, W ranks, W-1 additions per element in dtype d):
   y_i = sum_r x_ri + e2_i,  |e2_i| <= gamma_{W-1}(u_d) * sum_r |x_ri|  (exact only for sums of subnormals);
3. the check sum over the received block  t = sum_i y_i + e3,  |e3| <= (gamma_{m-1}(u_a) + gamma_n(u_64)) * sum_i |y_i|,
   with sum_i |y_i| <= (1 + gamma_{W-1}(u_d)) * A*,  A* = sum_r S1_r;
4. the reduced declared sums  S = sum_r s_r + e4,  |e4| <= gamma_{W-1}(u_64) * sum_r |s_r|.

Adding up, with A >= A* (below):  |t - S| <= rel * A + abs,  where
``rel = gamma_{W-1}(u_d) + 2 * gamma_{m-1}(u_a) * (1 + gamma_{W-1}(u_d)) + 3 * gamma_{n+W+2}(u_64)`` and
``abs = n * W * 2^-126`` covers a reduction that flushes subnormals to zero. The tolerance is
``tolerance_factor * (rel * A + abs)`` (factor 2 by default: margin, not a fudge; the bound alone is rigorous).
For float32 and W = 2, rel is about 7.6e-6 and A about n * W * RMS(x) for Gaussian-like data, so a block of
2048 tolerates ~0.06 RMS, while every sign or exponent flip of an element with |x| >= RMS moves it by at least
|x| / 2. (The DDP hook's 1/W scaling adds u_d to rel unless W is a power of two, and a subnormal term.)
Checksums carried in a float32 bucket (step 4 in float32, plus their rounding to float32) add
``(u_c + gamma_{W-1}(u_c)(1 + u_c))(1 + gamma_{m-1}(u_a) + gamma_n(u_64))`` to rel (u_c = 2^-24; ~1.2e-7 for
W = 2) and W * 2^-126 per element to abs, and their lower bound is rounded down before and shrunk after the reduction so
that it stays <= A*: steps 5-6, next to their code (:func:`carried_sums_term`).

The exact upper bound A comes from torch's fused float32 2-norm (one fast read) and Cauchy-Schwarz,
sum|x| <= sqrt(n) * ||x||_2: the computed norm N satisfies ``||x||_2 <= (N / (1 - u_a) + sqrt(n * tiny)) /
sqrt(1 - gamma_{n+1}(u_a))`` (squares below ``tiny`` = 2^-126 may underflow to zero), so
``A_r = sqrt(n) * (N / (1 - u_a) + sqrt(n * tiny)) / sqrt(1 - gamma_{n+1}(u_a))``. The cheap lower bound is
``L_r = sum_k |p_k| / ((1 + gamma_{m-1}(u_a)) * (1 + gamma_{n+1}(u_64)))`` over the block's float32 sub-block
partial sums p_k, which the declaring read computes anyway (each |p_k| <= (1 + gamma_{m-1}) * sum_k |x|).
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

    Sums accumulate in sub-blocks of ``sub`` elements, strided (``block`` is a multiple of ``sub``).
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
    """Partial sums of the full blocks, in the accumulation dtype, shaped ``[full, block // sub]``: partial j of a
    block sums its ``sub`` elements j, j + block/sub, j + 2 block/sub, ... (every partial sums ``sub`` elements,
    all the rounding analysis needs)."""
    acc = acc_dtype(x.dtype)
    main = x[: layout.full * layout.block].view(layout.full, layout.sub, -1)
    # One read of the data: torch sums float32 into float32 at memory speed, while float64 accumulation of
    # float32 input runs ~40x slower on CPU. Summing across the middle axis adds whole contiguous rows of
    # block/sub elements (vectorized): ~20% faster than 64-element inner sums. Each partial keeps the float32
    # rounding term of a 64-term sum.
    return main.sum(1) if main.dtype == acc else main.sum(1, dtype=acc)


def block_sums(x: torch.Tensor, layout: BlockLayout) -> torch.Tensor:
    """Per-block sums (float32 sub-block partials added in float64; the tail block wholly in float64)."""
    parts = []
    if layout.full:
        parts.append(_partials(x, layout).sum(1, dtype=torch.float64))
    if layout.tail:
        parts.append(x[layout.full * layout.block :].sum(dtype=torch.float64).reshape(1))
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _copy_and_partials(
    x: torch.Tensor, layout: BlockLayout, out: torch.Tensor, scale: float | None, chunk: int
) -> torch.Tensor:
    """:func:`_partials` of ``x`` while writing ``x`` (times ``scale``) into ``out``, whole blocks at a time in
    pieces of about ``chunk`` elements, so that the sums read each piece from cache right after the copy read
    it from memory."""
    acc = acc_dtype(x.dtype)
    main = layout.full * layout.block
    partial = torch.empty(layout.full, layout.block // layout.sub, dtype=acc)
    rows = max(1, chunk // layout.block)
    dtype = None if x.dtype == acc else acc
    # split() makes every view in one call: the loop is two torch calls per piece.
    pieces = zip(
        torch.split(x[:main].view(layout.full, layout.sub, -1), rows),
        torch.split(out[:main], rows * layout.block),
        torch.split(partial, rows),
        strict=True,
    )
    in_place = out.data_ptr() == x.data_ptr()
    for src, dst, part in pieces:
        # Sum first: ``out`` may be ``x`` itself (the DDP hook scales its bucket in place), and the sums are of x.
        torch.sum(src, 1, dtype=dtype, out=part)
        if scale is None:
            if not in_place:
                dst.copy_(src.view(-1))
        elif in_place:
            dst.mul_(scale)
        else:
            torch.mul(src.view(-1), scale, out=dst)
    if main < x.numel():
        _copy_scaled(x[main:], out[main:], scale)
    return partial


def _copy_scaled(src: torch.Tensor, dst: torch.Tensor, scale: float | None) -> None:
    """``dst = src * scale`` (``src`` when ``scale`` is None); ``dst`` may be ``src`` itself."""
    if dst.data_ptr() == src.data_ptr():
        if scale is not None:
            dst.mul_(scale)
    elif scale is None:
        dst.copy_(src)
    else:
        torch.mul(src, scale, out=dst)


def sums_and_lower_bounds(
    x: torch.Tensor,
    layout: BlockLayout,
    copy_to: torch.Tensor | None = None,
    scale: float | None = None,
    chunk: int = 2**18,
) -> torch.Tensor:
    """``[2, n_blocks]``: per-block sums, and per-block L with ``L <= sum|x|`` guaranteed.

    L is the sum of the sub-blocks' |partial sums| divided by the partials' worst rounding growth, so it
    comes from the same single read as the sums. It can be far below sum|x| (a sub-block whose values cancel
    contributes ~0), which only ever makes the tolerance derived from it smaller: a block within that
    tolerance is certainly within the full one. ``copy_to``: also write ``x`` (times ``scale``) there, fused
    with the sums in ``chunk``-element pieces (one read of ``x`` from memory for both); the sums are of ``x``
    as it was. ``copy_to`` may be ``x`` itself: ``x`` is then scaled in place, each piece after its sums.
    """
    sums, lows = [], []
    tail_sums: list[torch.Tensor] = []
    if layout.tail:  # before any copy: ``copy_to`` may be ``x``
        tail = x[layout.full * layout.block :].to(torch.float64)
        tail_sums = [tail.sum().reshape(1), tail.abs().sum().reshape(1)]
    if copy_to is not None and not layout.full:
        _copy_scaled(x, copy_to, scale)
    if layout.full:
        partial = _partials(x, layout) if copy_to is None else _copy_and_partials(x, layout, copy_to, scale, chunk)
        sums.append(partial.sum(1, dtype=torch.float64))
        lows.append(partial.abs().sum(1, dtype=torch.float64))
    if tail_sums:
        sums.append(tail_sums[0])
        lows.append(tail_sums[1])
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
    return _bound_from_norms(norms, lengths, acc)


def all_abs_sum_bounds(x: torch.Tensor, layout: BlockLayout) -> torch.Tensor:
    """:func:`abs_sum_bounds` of every block (one read of ``x``, no copy): for a reduction that keeps no intact
    copy of its input, whose exact tier cannot look at the data afterwards."""
    acc = acc_dtype(x.dtype)
    parts = []
    if layout.full:
        rows = x[: layout.full * layout.block].view(layout.full, layout.block)
        parts.append(torch.linalg.vector_norm(rows, dim=1, dtype=None if rows.dtype == acc else acc).to(torch.float64))
    if layout.tail:
        parts.append(torch.linalg.vector_norm(x[layout.full * layout.block :].to(torch.float64)).reshape(1))
    norms = parts[0] if len(parts) == 1 else torch.cat(parts)
    return _bound_from_norms(norms, layout.lengths(), acc)


def _bound_from_norms(norms: torch.Tensor, lengths: torch.Tensor, acc: torch.dtype) -> torch.Tensor:
    """``A >= sum|x|`` per block from the computed 2-norms ``norms`` of blocks of ``lengths`` elements."""
    u_a = unit_roundoff(acc)
    tiny = float(torch.finfo(acc).tiny)
    gam = lengths.add(1.0).mul_(u_a)
    gam = gam / (1.0 - gam)
    bound = (norms / (1.0 - u_a) + torch.sqrt(lengths * tiny)) * torch.sqrt(lengths) / torch.sqrt(1.0 - gam)
    return bound.mul_(1.0 + 16 * U64)


def tolerance_coefficients(
    layout: BlockLayout,
    dtype: torch.dtype,
    world: int,
    factor: float,
    scale: float | None,
    checksum_dtype: torch.dtype = torch.float64,
) -> tuple[float, float]:
    """``(rel, abs_per_element)``: a block's tolerance is ``rel * A + abs_per_element * n``.

    ``scale``: the send buffer is ``fl(intact * scale)`` while the checksums were taken from ``intact`` and
    scaled exactly, so elements may differ by the multiplication's rounding: u_d relative (none when
    ``scale`` is a power of two) plus half the dtype's smallest subnormal where the product underflows.
    ``checksum_dtype``: the dtype the declared sums were reduced in (float32 when they ride in a float32
    bucket's own collective: :func:`carried_sums_term` adds their rounding).
    """
    u_d = unit_roundoff(dtype)
    g_red = gamma(world - 1, u_d)
    g_acc = gamma(layout.sub - 1, unit_roundoff(acc_dtype(dtype)))
    rel = g_red + 2.0 * g_acc * (1.0 + g_red) + 3.0 * gamma(layout.block + world + 2, U64)
    absolute = world * TINY32
    if checksum_dtype != torch.float64:
        carried_rel, carried_abs = carried_sums_term(layout, dtype, world, checksum_dtype)
        rel += carried_rel
        absolute += carried_abs
    if scale is not None:
        if math.frexp(scale)[0] != 0.5:
            rel += u_d * (1.0 + g_red)
        finfo = torch.finfo(dtype)
        absolute += world * float(finfo.smallest_normal) * float(finfo.eps) / 2
    return factor * rel, factor * absolute


# -- checksums carried inside the bucket's own collective -------------------------------------------------------
#
# A float32 bucket can carry its blocks' declared (sum, lower bound) pairs appended to its send buffer, so one
# collective moves both; they are then rounded to float32 and reduced in float32 (the bucket's own reduction).
# With u_c = 2^-24 (the carrier's unit roundoff), for each rank r and block:
#
# 5. the sum travels as s'_r = fl_c(s_r): |s'_r - s_r| <= u_c |s_r| (+ 2^-150 if it lands among subnormals);
#    the reduction adds W of them in any order: |S' - sum_r s'_r| <= gamma_{W-1}(u_c) sum_r |s'_r| (a reduction
#    that flushes subnormals errs by < 2^-126 per addition). With |s_r| <= (1 + g_decl) S1_r (step 1's error,
#    g_decl = gamma_{m-1}(u_a) + gamma_n(u_64); the DDP hook's float64 scaling of s_r by 1/W adds a factor
#    1 + u_64, inside step 4's float64 slack) and sum_r S1_r = A*:
#       |S' - sum_r s_r| <= (u_c + gamma_{W-1}(u_c) (1 + u_c)) (1 + g_decl) A* + W 2^-126,
#    which replaces step 4's float64 error (kept in the sum anyway: it only widens the tolerance). So
#    ``rel += (u_c + gamma_{W-1}(u_c)(1 + u_c))(1 + g_decl)`` and W 2^-126 per element (so at least W 2^-126
#    per block) to abs: for W = 2 about 1.2e-7
#    against the ~7.6e-6 the rest of the bound already is (1.6% wider).
# 6. the lower bound must stay below A*: each rank sends ``fl_c(L_r (1 - 2^-23))``, which is <= L_r (rounding to
#    nearest grows a positive value by at most a factor 1 + u_c) up to 2^-150 among subnormals; the reduction
#    of W nonnegative terms gives at most (1 + gamma_{W-1}(u_c)) times their exact sum (flushing only lowers
#    it). So ``L = max(0, L' / ((1 + gamma_{W-1}(u_c)) (1 + 2^-20)) - W 2^-150) <= sum_r L_r <= A*`` (the factor
#    1 + 2^-20 absorbs the few float64 roundings of this computation, each at most 1 + 2^-53).
# A declared value beyond the carrier's range becomes Inf: a non-finite sum or an infinite lower bound makes
# the block unverifiable (counted, never flagged), as a float64 overflow did before.
# Float64 buckets carry float64 checksums (steps 1-4 unchanged). Float16/bfloat16 buckets do NOT carry them:
# u_c = 2^-8 (or 2^-11) would add a term as large as the reduction's own (halving what a block sees), and a
# declared sum of 64 float16 values overflows at 65504; they keep the separate float64 checksum collective.

CARRIER_DTYPES = (torch.float32, torch.float64)
_LOWER_SHRINK = 1.0 - 2.0**-23
_DECODE_SLACK = 1.0 + 2.0**-20
_SUBNORMAL_HALF_ULP32 = 2.0**-150


def carried_sums_term(
    layout: BlockLayout, dtype: torch.dtype, world: int, checksum_dtype: torch.dtype
) -> tuple[float, float]:
    """``(rel, abs_per_element)`` added by step 5 above (declared sums rounded to and reduced in ``checksum_dtype``)."""
    u_c = unit_roundoff(checksum_dtype)
    g_decl = gamma(layout.sub - 1, unit_roundoff(acc_dtype(dtype))) + gamma(layout.block, U64)
    rel = (u_c + gamma(world - 1, u_c) * (1.0 + u_c)) * (1.0 + g_decl)
    return rel, world * float(torch.finfo(checksum_dtype).smallest_normal)


def pack_declared(declared: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[2, n_blocks]`` float64 (sums, lower bounds) as ``dtype`` for carriage; lower bounds rounded down."""
    if dtype == torch.float64:
        return declared.clone()
    packed = declared.to(dtype)
    packed[1] = (declared[1] * _LOWER_SHRINK).to(dtype)
    return packed


def unpack_reduced(carried: torch.Tensor, world: int) -> torch.Tensor:
    """The reduced ``[2, n_blocks]`` carried checksums as float64, the lower bounds made sound again (step 6)."""
    out = carried.to(torch.float64, copy=True)
    if carried.dtype != torch.float64:
        shrink = 1.0 / ((1.0 + gamma(world - 1, unit_roundoff(carried.dtype))) * _DECODE_SLACK)
        out[1].mul_(shrink).sub_(world * _SUBNORMAL_HALF_ULP32).clamp_(min=0.0)
    return out
