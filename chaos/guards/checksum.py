"""Checksummed all-reduce: catch silent data corruption (SDC) in a gradient reduction, and recover from it.

Two entry points share one verified reduction:

- :func:`checksum_hook`, a DDP communication hook (``ddp.register_comm_hook(state, checksum_hook)``), which
  averages like DDP's default hook and returns the same values bit for bit when nothing is corrupted;
- :func:`checksummed_all_reduce`, an in-place SUM all-reduce for code that calls collectives itself.

What it does, per bucket
------------------------
The bucket is cut into blocks of ``block_elems`` elements. Each rank keeps an intact copy of its local data
(the DDP hook gets one for free: the bucket itself, since the scaled send buffer is built out of place) and,
in one read of it, declares per block its sum ``s`` and a cheap LOWER bound ``L <= sum|x|``. The ``(s, L)``
vectors are all-reduced (float64, a small collective running concurrently with the bucket's); then every rank
sums each block of the reduced bucket it received and compares with the reduced ``s``. A block within the
tolerance built from ``L`` is certainly within the exact one (built from an UPPER bound ``A``), so it passes;
the few others (a real mismatch, or values cancelling inside every 64-element sub-block) get ``A`` from the
intact data of just those blocks, reduced in a second small round, and are judged exactly. The verdict is the
one computing ``A`` everywhere would give, at one read instead of two. All ranks then agree with one tiny
all-reduce and take the same action: ``retry`` (rebuild the send buffer from the intact copy and reduce
again: a transient fault in transit costs one retry, not a corrupted model; if the retry mismatches too the
step is skipped), ``skip`` (``state.skip_step`` becomes True on every rank: the trainer must not call
``optimizer.step()``) or ``raise`` (:class:`SdcDetected` on every rank). Ranks that saw a mismatch emit
``detect.sdc``.

Cost on a clean reduction: the intact copy (one read + one write; the DDP hook's is the scaling pass DDP's
default hook makes anyway), one read to declare, one read to verify, the small checksum all-reduce and the
verdict all-reduce. ``benchmarks/checksum_allreduce.py`` measures it.

Why blocks: one checksum over a 25 MB bucket needs a tolerance that grows with the bucket (the reduction's
legitimate rounding error is proportional to the sum of |x| over everything it covers), and measured here it
catches only a few percent of single-bit flips. A block's tolerance is proportional to that block's sum of |x|
only, so a flip that changes one element by about its own magnitude stands far above it.

Tolerance derivation (rigorous, IEEE round-to-nearest; u = unit roundoff, gamma_k(u) = k*u / (1 - k*u))
----------------------------------------------------------------------------------------------------------
Let rank r hold x_r (dtype d, unit roundoff u_d: 2^-24 float32, 2^-8 bfloat16, 2^-11 float16) and let a block
have n elements. Sums accumulate in float32 (u_a = 2^-24; float64 for float64 buckets) in sub-blocks of m = 64
elements, whose sums are then added in float64 (u_64 = 2^-53). Any summation order of k terms errs by at most
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

The exact upper bound A comes from torch's fused float32 2-norm (one fast read) and Cauchy-Schwarz,
sum|x| <= sqrt(n) * ||x||_2: the computed norm N satisfies ``||x||_2 <= (N / (1 - u_a) + sqrt(n * tiny)) /
sqrt(1 - gamma_{n+1}(u_a))`` (squares below ``tiny`` = 2^-126 may underflow to zero), so
``A_r = sqrt(n) * (N / (1 - u_a) + sqrt(n * tiny)) / sqrt(1 - gamma_{n+1}(u_a))``. The cheap lower bound is
``L_r = sum_k |p_k| / ((1 + gamma_{m-1}(u_a)) * (1 + gamma_{n+1}(u_64)))`` over the block's float32 sub-block
partial sums p_k, which the declaring read computes anyway (each |p_k| <= (1 + gamma_{m-1}) * sum_k |x|).

Low precision: u_bf16 = 2^-8 makes the reduction's own legitimate rounding large (the tolerance of a block is
~u_d * n * W * RMS), so bfloat16/float16 buckets use blocks of ``low_precision_block_elems`` (64 by default:
~1 RMS for bfloat16, which still sees sign and exponent flips of |x| >= RMS elements; measured by
``mlchaos sdc-coverage``). Smaller blocks see more mantissa bits and cost a bigger checksum all-reduce.

Blocks that cannot be verified: where the declared sum is not finite (Inf/NaN in some rank's gradients: the
gradient anomaly guard's job) or where A reaches the dtype's maximum (the reduction may legitimately overflow).
They are counted in ``stats.unverifiable_blocks`` and never flagged.

Localization, and what it can and cannot tell
---------------------------------------------
On a mismatch every rank all-gathers, for the first few mismatched blocks, the values it meant to send and
the values it received (a few KB). From them each rank recomputes the reduction exactly (W = 2: bit for bit)
and sees which ranks received a wrong result: only some ranks -> the fault hit those ranks after the
reduction (``site_hint`` "post_reduce", ``culprit_rank`` the one rank); every rank -> it entered before or
during the reduction ("in_transit"), and ``culprit_rank`` is the one rank whose contribution, changed by a
single bit, reproduces the wrong result exactly (a single-bit model; None when no rank or several ranks do).
What it cannot do: tell a flip in a sender's buffer from one on the wire into the reducer (both look the
same), or attribute multi-bit corruption. Comparing "what each rank sent" with "what it declared" is not
possible after the fact: the all-reduce is in place and overwrites the send buffer, and keeping a copy of what
was sent would cost a full extra pass on every clean reduction. Nothing of this runs on the clean path.
Fault-injection points (``state.corrupt``) are called on every attempt; the injecting agent decides (a
transient fault fires once, ``state.attempt`` says which attempt it is).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import GradBucket  # the stub's home; torch.distributed re-exports it

from chaos import events
from chaos.guards import _localize
from chaos.guards.rounding import (
    SUB_BLOCK,
    BlockLayout,
    abs_sum_bounds,
    block_sums,
    sums_and_lower_bounds,
    tolerance_coefficients,
)

Site = Literal["local", "in_transit", "post_reduce"]
Policy = Literal["retry", "skip", "raise"]
SITES: tuple[Site, ...] = ("local", "in_transit", "post_reduce")


class CorruptionHook(Protocol):
    """An injection point of the in-job agent; it corrupts ``tensor`` in place, or leaves it alone.

    ``local``: the bucket BEFORE checksums are taken (a compute fault; no checksum of the reduction can see it);
    ``in_transit``: the send buffer AFTER checksums are taken and BEFORE the reduction;
    ``post_reduce``: the reduced result on this rank BEFORE verification.
    """

    def __call__(self, site: Site, bucket_index: int, tensor: torch.Tensor) -> None: ...


@dataclass
class ChecksumConfig:
    """How buckets are checked and what a mismatch does.

    ``block_elems`` elements per block for float32/float64, ``low_precision_block_elems`` for float16/bfloat16
    (each a multiple of 64, or at most 64). ``policy``: ``retry`` (up to ``max_retries`` re-reductions from
    the intact local data, then skip), ``skip`` or ``raise``. ``tolerance_factor`` (>= 1) multiplies the
    rigorous rounding-error bound. ``emit`` has the signature of :func:`chaos.events.emit` (the default).
    ``localize``: run the localization exchange on a mismatch; ``max_reported_blocks`` caps the block list in
    events and the blocks localization looks at. Every rank must use the same config (it decides which
    collectives run).
    """

    block_elems: int = 2048
    low_precision_block_elems: int = 64
    policy: Policy = "retry"
    max_retries: int = 1
    tolerance_factor: float = 2.0
    emit: Callable[..., None] | None = None
    localize: bool = True
    max_reported_blocks: int = 8

    def __post_init__(self) -> None:
        for name in ("block_elems", "low_precision_block_elems"):
            value = getattr(self, name)
            if value < 1 or (value > SUB_BLOCK and value % SUB_BLOCK):
                raise ValueError(f"{name} must be >= 1 and, above {SUB_BLOCK}, a multiple of it; got {value}")
        if self.policy not in ("retry", "skip", "raise"):
            raise ValueError(f"policy must be retry, skip or raise, got {self.policy!r}")
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")
        if not self.tolerance_factor >= 1.0:
            raise ValueError(
                f"tolerance_factor must be >= 1 (below 1 the bound no longer holds): {self.tolerance_factor}"
            )
        if self.max_reported_blocks < 1:
            raise ValueError(f"max_reported_blocks must be >= 1, got {self.max_reported_blocks}")

    def layout(self, numel: int, dtype: torch.dtype) -> BlockLayout:
        """The block layout of a bucket of ``numel`` elements of ``dtype``."""
        low = dtype in (torch.float16, torch.bfloat16)
        block = self.low_precision_block_elems if low else self.block_elems
        return BlockLayout(numel, block, min(SUB_BLOCK, block))


@dataclass(frozen=True)
class Detection:
    """One mismatched attempt as every rank agreed on it (``blocks``/``n_blocks``: this rank's own)."""

    bucket: int
    attempt: int
    step: int | None
    ranks: tuple[int, ...]
    blocks: tuple[int, ...]
    n_blocks: int
    site_hint: str
    culprit_rank: int | None
    action: str


class SdcDetected(RuntimeError):
    """Raised on every rank under ``policy="raise"``; ``detection`` says where."""

    def __init__(self, detection: Detection) -> None:
        super().__init__(
            f"silent data corruption in the all-reduce of bucket {detection.bucket} (step {detection.step}, "
            f"attempt {detection.attempt}): ranks {list(detection.ranks)} saw mismatched blocks; "
            f"site {detection.site_hint}, culprit rank {detection.culprit_rank}"
        )
        self.detection = detection


@dataclass
class ChecksumStats:
    """Counters, the same on every rank except ``mismatched_here`` (failed attempts this rank saw itself).

    ``second_checks``: reductions where the cheap first-tier tolerance did not clear every block and the
    exact bound had to be computed for some (see :func:`guarded_reduce`).
    """

    buckets_checked: int = 0
    blocks_checked: int = 0
    unverifiable_blocks: int = 0
    second_checks: int = 0
    mismatches: int = 0
    mismatched_here: int = 0
    retries: int = 0
    repaired: int = 0
    skipped_steps: int = 0
    raised: int = 0


class ChecksumState:
    """Per-process state of the guard: config, group, injection hook, counters and the skip verdict.

    Create it after ``init_process_group``. The trainer sets ``step`` (reported in events) and, after
    backward, calls :meth:`consume_skip` and skips ``optimizer.step()`` when it returns True; all ranks always
    agree on it. ``corrupt`` is the agent's :class:`CorruptionHook` (None: no injection); ``observe(bucket_index,
    local_bucket)`` is called with each bucket's local gradients before anything else (for a gradient anomaly
    guard). ``attempt`` is the current attempt (0 = first). The state keeps one send buffer per bucket (DDP
    hook) or one intact copy (standalone): one extra copy of the gradients in memory, traded for never
    re-allocating (a fresh 25 MB CPU buffer costs more in page faults than the whole check).
    """

    def __init__(
        self,
        config: ChecksumConfig | None = None,
        group: dist.ProcessGroup | None = None,
        *,
        corrupt: CorruptionHook | None = None,
        observe: Callable[[int, torch.Tensor], None] | None = None,
    ) -> None:
        self.config = config or ChecksumConfig()
        self.group = group
        self.corrupt = corrupt
        self.observe = observe
        self.in_flight: Callable[[int], None] | None = None  # called with the bucket index once its all-reduce started
        self.step: int | None = None
        self.attempt = 0
        self.skip_step = False
        self.stats = ChecksumStats()
        self.detections: list[Detection] = []
        self.rank = dist.get_rank(group)  # inside ``group``: what the exchanges are indexed by
        self.world_size = dist.get_world_size(group)
        # Events name global ranks (the same as ``rank`` on the default group).
        self.global_ranks = tuple(
            dist.get_global_rank(group, r) if group is not None else r for r in range(self.world_size)
        )
        self._buffers: dict[Any, torch.Tensor] = {}
        self._lengths: dict[BlockLayout, torch.Tensor] = {}

    def consume_skip(self) -> bool:
        """Whether this step must be skipped; resets the flag for the next step."""
        skip, self.skip_step = self.skip_step, False
        return skip

    def buffer(self, key: Any, like: torch.Tensor) -> torch.Tensor:
        """A persistent buffer shaped like ``like`` (re-allocated only when its size or dtype change)."""
        held = self._buffers.get(key)
        if held is None or held.shape != like.shape or held.dtype != like.dtype:
            held = torch.empty_like(like, memory_format=torch.contiguous_format)
            self._buffers[key] = held
        return held

    def lengths(self, layout: BlockLayout) -> torch.Tensor:
        """Cached ``layout.lengths()``."""
        held = self._lengths.get(layout)
        if held is None:
            held = self._lengths[layout] = layout.lengths()
        return held

    def _inject(self, site: Site, bucket_index: int, tensor: torch.Tensor) -> None:
        if self.corrupt is not None:
            self.corrupt(site, bucket_index, tensor)

    def _emit(self, kind: str, **data: Any) -> None:
        (self.config.emit or events.emit)(kind, rank=self.global_ranks[self.rank], **data)


@dataclass
class _Job:
    """One bucket's verified reduction: what a retry, the exact check and localization need."""

    state: ChecksumState
    bucket: int
    send: torch.Tensor
    intact: torch.Tensor
    scale: float | None
    layout: BlockLayout
    lengths: torch.Tensor

    def collective(self, tensor: torch.Tensor, op: Any = dist.ReduceOp.SUM) -> None:
        dist.all_reduce(tensor, op=op, group=self.state.group)

    def tolerance(self, a_total: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        st = self.state
        rel, absolute = tolerance_coefficients(
            self.layout, self.send.dtype, st.world_size, st.config.tolerance_factor, self.scale
        )
        return a_total * rel + lengths * absolute

    def verdict(self, flags: torch.Tensor) -> torch.Tensor:
        """Every rank's count of flagged blocks (one tiny SUM all-reduce; each rank fills its own slot)."""
        counts = torch.zeros(self.state.world_size, dtype=torch.int64)
        counts[self.state.rank] = int(flags.sum())
        self.collective(counts)
        return counts


def guarded_reduce(
    state: ChecksumState, bucket_index: int, send: torch.Tensor, intact: torch.Tensor, scale: float | None
) -> bool:
    """All-reduce (SUM) flat ``send`` in place and verify it; True when the final result verified clean.

    ``send`` must hold ``intact`` (``scale`` None) or ``torch.mul(intact, scale)``: that is how a retry
    rebuilds it. Collective: every rank calls it. Raises :class:`SdcDetected` under ``policy="raise"``;
    sets ``state.skip_step`` when it gives up.

    Two tiers keep the clean path at one read of the data for the checksums: the declared checksums carry a
    cheap LOWER bound L <= sum|x| (from the same pass as the sums), and a block within the tolerance built
    from L is within the exact one too. Only blocks outside it (a real mismatch, or heavy cancellation inside
    every sub-block) get the exact upper bound A, computed from the intact data of just those blocks and
    reduced in a second small round. The verdict is the same as computing A everywhere.
    """
    cfg = state.config
    layout = cfg.layout(send.numel(), send.dtype)
    job = _Job(state, bucket_index, send, intact, scale, layout, state.lengths(layout))
    declared: torch.Tensor | None = None
    attempts = cfg.max_retries + 1 if cfg.policy == "retry" else 1
    for attempt in range(attempts):
        state.attempt = attempt
        if attempt:
            _refill(send, intact, scale)
        if declared is None and layout.n_blocks:
            declared = sums_and_lower_bounds(intact, layout)
            if scale is not None:
                declared.mul_(scale)
        state._inject("in_transit", bucket_index, send)
        if declared is None:  # an empty bucket: nothing to verify
            job.collective(send)
            state._inject("post_reduce", bucket_index, send)
            return True
        reduced = declared.clone()
        # Both in flight at once: gloo runs the bucket and the small checksum vector on separate threads.
        bucket_work = dist.all_reduce(send, group=state.group, async_op=True)
        if state.in_flight is not None:
            state.in_flight(bucket_index)  # the agent's phase-allreduce faults: this rank is inside the collective
        job.collective(reduced)
        assert bucket_work is not None
        bucket_work.wait()
        state._inject("post_reduce", bucket_index, send)
        bad, counts = _verify(job, reduced)
        if int(counts.sum()) == 0:
            if attempt:
                state.stats.repaired += 1
            return True
        action = "raise" if cfg.policy == "raise" else "retry" if attempt + 1 < attempts else "skip"
        detection = _on_mismatch(job, attempt, action, bad, counts)
        if action == "raise":
            state.stats.raised += 1
            raise SdcDetected(detection)
        if action == "retry":
            state.stats.retries += 1
    if not state.skip_step:
        state.stats.skipped_steps += 1
    state.skip_step = True
    return False


def _refill(send: torch.Tensor, intact: torch.Tensor, scale: float | None) -> None:
    if scale is None:
        send.copy_(intact)
    else:
        torch.mul(intact, scale, out=send)


def _verify(job: _Job, reduced: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's mismatch flags per block, and every rank's mismatch count (identical on all ranks)."""
    st, layout = job.state, job.layout
    expected, lower = reduced[0], reduced[1]
    dmax = float(torch.finfo(job.send.dtype).max)
    diff = (block_sums(job.send, layout) - expected).abs()
    # Not verifiable: a non-finite declared sum (Inf/NaN in some rank's own data) or a block whose values may
    # legitimately overflow the dtype when added.
    verifiable = torch.isfinite(expected) & (lower < dmax)
    # "Not within" rather than "beyond", so that NaN or Inf in the received data counts as outside.
    suspect = ~(diff <= job.tolerance(lower, job.lengths)) & verifiable
    counts = job.verdict(suspect)
    st.stats.buckets_checked += 1
    st.stats.blocks_checked += layout.n_blocks
    st.stats.unverifiable_blocks += layout.n_blocks - int(verifiable.sum())
    if int(counts.sum()) == 0:
        return suspect, counts
    # Second tier: the exact bound for the union of every rank's suspects (so the collectives line up).
    st.stats.second_checks += 1
    union = suspect.to(torch.int32)
    job.collective(union, dist.ReduceOp.MAX)
    blocks = torch.nonzero(union).reshape(-1)
    upper = abs_sum_bounds(job.intact, layout, blocks)
    if job.scale is not None:
        upper.mul_(job.scale)
    job.collective(upper)
    ok = (diff[blocks] <= job.tolerance(upper, job.lengths[blocks])) | ~(upper < dmax)
    st.stats.unverifiable_blocks += int((upper >= dmax).sum())
    bad = torch.zeros_like(suspect)
    bad[blocks] = ~ok & suspect[blocks]
    return bad, job.verdict(bad)


def _on_mismatch(job: _Job, attempt: int, action: str, bad: torch.Tensor, counts: torch.Tensor) -> Detection:
    """Agree on the mismatched blocks, localize, record and emit (collective: every rank calls it)."""
    st = job.state
    cfg = st.config
    ranks = tuple(int(r) for r in torch.nonzero(counts).reshape(-1))
    union = bad.to(torch.int32)
    job.collective(union, dist.ReduceOp.MAX)
    union_blocks = [int(b) for b in torch.nonzero(union).reshape(-1)[: cfg.max_reported_blocks]]
    site_hint, culprit = "unknown", None
    if cfg.localize:
        site_hint, culprit = _localize.localize(
            union_blocks, job.layout.span, job.send, job.intact, job.scale, st.world_size, st.group
        )
    own = tuple(int(b) for b in torch.nonzero(bad).reshape(-1)[: cfg.max_reported_blocks])
    detection = Detection(
        bucket=job.bucket,
        attempt=attempt,
        step=st.step,
        ranks=ranks,
        blocks=own,
        n_blocks=int(counts[st.rank]),
        site_hint=site_hint,
        culprit_rank=culprit,
        action=action,
    )
    st.stats.mismatches += 1
    st.detections.append(detection)
    if detection.n_blocks:
        st.stats.mismatched_here += 1
        st._emit(
            "detect.sdc",
            detector="checksum",
            bucket=job.bucket,
            blocks=list(own),
            n_blocks=detection.n_blocks,
            step=st.step,
            site_hint=site_hint,
            culprit_rank=None if culprit is None else st.global_ranks[culprit],
            ranks=[st.global_ranks[r] for r in ranks],
            attempt=attempt,
            action=action,
        )
    return detection


def checksum_hook(state: ChecksumState, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: average the bucket across ranks like DDP's default, verified by checksums.

    Register with ``ddp.register_comm_hook(state, checksum_hook)``. The bucket buffer itself stays intact (it
    is what a retry rebuilds from); the average goes into a per-bucket buffer of ``state`` through the same
    ``mul`` by 1/W that DDP's reducer applies, then the same all-reduce, and that buffer is returned (DDP
    copies it into ``.grad``): a clean step is bit-identical to default DDP and costs no clone. The future is
    already complete (the work is synchronous, as gloo's is anyway). Under ``policy="raise"`` the future
    carries :class:`SdcDetected`, which DDP re-raises from ``backward()``.
    """
    grads = bucket.buffer()
    index = bucket.index()
    state._inject("local", index, grads)
    if state.observe is not None:
        state.observe(index, grads)
    send = state.buffer(("send", index), grads)
    scale = 1.0 / state.world_size
    torch.mul(grads, scale, out=send)
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    try:
        guarded_reduce(state, index, send, grads, scale)
    except SdcDetected as exc:
        future.set_exception(exc)  # type: ignore[arg-type]  # the stub types it as the result type
        return future
    future.set_result(send)
    return future


def checksummed_all_reduce(
    tensor: torch.Tensor,
    group: dist.ProcessGroup | None = None,
    *,
    config: ChecksumConfig | None = None,
    corrupt: CorruptionHook | None = None,
    step: int | None = None,
    state: ChecksumState | None = None,
    bucket_index: int = 0,
) -> bool:
    """In-place SUM all-reduce of a contiguous ``tensor`` (like ``dist.all_reduce``), verified by checksums.

    Returns True when the final result verified clean (after any retries); False when the guard gave up
    (``policy`` skip, or retries exhausted: the result may then be corrupt, and ``state.skip_step`` is set).
    Raises :class:`SdcDetected` under ``policy="raise"``. A long-lived ``state`` (whose group, config and
    hook are then used; do not pass ``group``/``config``/``corrupt`` with it) reuses its intact-copy buffer
    and keeps counters; without one a fresh state, and a fresh buffer, are made per call. ``bucket_index``
    labels events and keys the buffer.
    """
    if state is None:
        state = ChecksumState(config, group, corrupt=corrupt)
    elif config is not None or corrupt is not None or group is not None:
        raise ValueError("with a state, set group, config and corrupt on the state, not per call")
    if not tensor.is_contiguous():
        raise ValueError("checksummed_all_reduce needs a contiguous tensor (it reduces and verifies a flat view)")
    if step is not None:
        state.step = step
    flat = tensor.view(-1)
    state._inject("local", bucket_index, flat)
    if state.observe is not None:
        state.observe(bucket_index, flat)
    intact = state.buffer(("intact", bucket_index), flat)
    intact.copy_(flat)
    return guarded_reduce(state, bucket_index, flat, intact, None)


# DDP's register_comm_hook compares the annotations with the real objects, and ``from __future__ import
# annotations`` turns them into strings: give it the objects.
checksum_hook.__annotations__.update({"bucket": GradBucket, "return": torch.futures.Future[torch.Tensor]})


__all__ = [
    "SITES",
    "ChecksumConfig",
    "ChecksumState",
    "ChecksumStats",
    "CorruptionHook",
    "Detection",
    "Policy",
    "SdcDetected",
    "Site",
    "checksum_hook",
    "checksummed_all_reduce",
    "guarded_reduce",
]
