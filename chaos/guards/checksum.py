"""Checksummed all-reduce: catch silent data corruption (SDC) in a gradient reduction, and recover from it.

Two entry points share one verified reduction:

- :func:`checksum_hook`, a DDP communication hook (``ddp.register_comm_hook(state, checksum_hook)``), which
  averages like DDP's default hook and returns the same values bit for bit when nothing is corrupted; under
  DDP's default ``gradient_as_bucket_view=False`` it reduces the bucket in place (a retry rebuilds it from the
  parameters' ``.grad``, which hold the local gradients until the hook's future completes), with ``True`` it
  keeps the bucket intact and reduces a send buffer;
- :func:`checksummed_all_reduce`, an in-place SUM all-reduce of the caller's tensor for code that calls
  collectives itself.

Per bucket, every block of ``block_elems`` elements (``low_precision_block_elems`` for bfloat16/float16) has
its sum declared before the reduction, and every rank checks each reduced block against the reduced
declarations within a rigorous bound on legitimate rounding (:mod:`chaos.guards.rounding`), so rounding alone
never makes a mismatch. All ranks agree on the verdict with one tiny all-reduce and take the same action:

- ``retry``: rebuild from the intact local data and reduce again, up to ``max_retries`` times (1 by default),
  then skip the step; a rebuild that differs from what was declared (e.g. after a ``local`` fault in the bucket
  only) skips it too, never applied;
- ``skip``: ``state.skip_step`` on every rank: the trainer must not call ``optimizer.step()``;
- ``raise``: :class:`SdcDetected` on every rank.

Ranks that saw a mismatch emit ``detect.sdc``, with the site (``post_reduce`` on the ranks that alone got a
wrong result, else ``in_transit``) and, under a single-bit model, the culprit rank
(:mod:`chaos.guards._localize`, which also says what it cannot tell); none of this runs on the clean path.
Blocks that cannot be verified (a declared sum that is not finite, or a bound at the dtype's maximum) are
counted in ``stats.unverifiable_blocks`` and never flagged. ``config.verify_every = k`` verifies one reduction
in k per bucket (the others are plain reductions, counted in ``stats.unverified_reductions``).
Fault-injection points (``state.corrupt``) are called on every attempt; the agent decides (a transient fault
fires once; ``state.attempt`` says which).

Why blocks, the two-tier bound, the in-place reduction and no integer checksums, and what a clean reduction
costs: docs/design/sdc-guards.md ("The checksummed all-reduce").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import GradBucket  # the stub's home; torch.distributed re-exports it

from chaos import event_kinds, events
from chaos.event_kinds import Site
from chaos.guards import _localize
from chaos.guards._checksum_types import (
    SITES,
    ChecksumConfig,
    ChecksumStats,
    CorruptionHook,
    Detection,
    Policy,
    SdcDetected,
)
from chaos.guards.rounding import (
    BlockLayout,
    abs_sum_bounds,
    all_abs_sum_bounds,
    block_sums,
    pack_declared,
    sums_and_lower_bounds,
    tolerance_coefficients,
    unpack_reduced,
)


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
        self._calls: dict[int, int] = {}
        self._rebuildable: dict[tuple[int, int, int], bool] = {}  # DDP hook: per bucket buffer (_local_gradients)

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

    def carrier(self, key: Any, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A persistent flat buffer of ``numel`` elements of ``dtype`` (re-allocated only when those change)."""
        held = self._buffers.get(key)
        if held is None or held.numel() != numel or held.dtype != dtype:
            held = self._buffers[key] = torch.empty(numel, dtype=dtype)
        return held

    def due(self, bucket_index: int) -> bool:
        """Whether this reduction of ``bucket_index`` is verified (``config.verify_every``; the same answer on
        every rank, which call in lockstep)."""
        calls = self._calls.get(bucket_index, 0)
        self._calls[bucket_index] = calls + 1
        return calls % self.config.verify_every == 0

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


Intact = torch.Tensor | Callable[[], torch.Tensor]  # local data before scaling, or a function rebuilding it


@dataclass
class _Job:
    """One bucket's verified reduction: what a retry, the exact check and localization need."""

    state: ChecksumState
    bucket: int
    send: torch.Tensor
    source: Intact | None
    scale: float | None
    layout: BlockLayout
    lengths: torch.Tensor
    checksum_dtype: torch.dtype = torch.float64

    def intact(self) -> torch.Tensor:
        """The intact local data, rebuilt on first use when ``source`` is a function."""
        if self.source is None:
            raise RuntimeError("this reduction keeps no intact copy of its input")
        if not isinstance(self.source, torch.Tensor):
            self.source = self.source()
        return self.source

    def collective(self, tensor: torch.Tensor, op: Any = dist.ReduceOp.SUM) -> None:
        dist.all_reduce(tensor, op=op, group=self.state.group)

    def tolerance(self, a_total: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        st = self.state
        rel, absolute = tolerance_coefficients(
            self.layout, self.send.dtype, st.world_size, st.config.tolerance_factor, self.scale, self.checksum_dtype
        )
        return a_total * rel + lengths * absolute

    def verdict(self, flags: torch.Tensor, *more: torch.Tensor) -> torch.Tensor:
        """Every rank's count of flagged blocks (one tiny SUM all-reduce; each rank fills its own slot); with
        ``more`` flag vectors, a row of counts per vector (``[1 + len(more), world]``), in the same round."""
        counts = torch.zeros(1 + len(more), self.state.world_size, dtype=torch.int64)
        for row, f in enumerate((flags, *more)):
            counts[row, self.state.rank] = int(f.sum())
        self.collective(counts)
        return counts[0] if not more else counts


def guarded_reduce(
    state: ChecksumState,
    bucket_index: int,
    send: torch.Tensor,
    intact: Intact | None,
    scale: float | None,
    carrier: torch.Tensor | None = None,
    declared: torch.Tensor | None = None,
) -> bool:
    """All-reduce (SUM) flat ``send`` in place and verify it; True when the final result verified clean.

    ``send`` must hold ``intact`` (``scale`` None) or ``torch.mul(intact, scale)``: that is how a retry
    rebuilds it. ``intact`` may be a function returning it, called only on a retry, an exact second-tier
    check or localization (the DDP hook's in-place path rebuilds it from the parameters' ``.grad``). None: no
    intact copy at all (``send`` holds the input, ``scale`` None, no ``carrier``): nothing can be redone or
    localized, so the policy's retry becomes a skip, and every block's exact upper bound A is declared up front
    (one more read, of data in cache) and reduced with the sums, so the exact tier needs no data afterwards. ``carrier``: a flat buffer whose first elements ARE ``send`` and whose
    ``config.carried_numel`` elements leave room for the checksums: they are appended there and travel in the
    same collective (float32/float64 only; None: a separate float64 collective, concurrent with the bucket's).
    ``declared``: ``sums_and_lower_bounds(intact, layout)`` when the caller computed it already (fused with the
    copy that filled ``send`` or ``intact``), unscaled; None: computed here.
    Collective: every rank calls it. Raises :class:`SdcDetected` under ``policy="raise"``; sets
    ``state.skip_step`` when it gives up.

    Two tiers keep the clean path at one read of the data for the checksums: the declared checksums carry a
    cheap LOWER bound L <= sum|x| (from the same pass as the sums), and a block within the tolerance built
    from L is within the exact one too. Only blocks outside it (a real mismatch, or heavy cancellation inside
    every sub-block) get the exact upper bound A, computed from the intact data of just those blocks and
    reduced in a second small round. The verdict is the same as computing A everywhere.
    """
    cfg = state.config
    n = send.numel()
    layout = cfg.layout(n, send.dtype)
    whole: torch.Tensor | None = None  # the one buffer reduced when the checksums ride along
    tail: torch.Tensor | None = None
    if carrier is not None and cfg.carried_numel(n, send.dtype) > n:
        whole = carrier[: cfg.carried_numel(n, send.dtype)]
        if whole.numel() < cfg.carried_numel(n, send.dtype) or whole.data_ptr() != send.data_ptr():
            raise ValueError("carrier must start with send and have room for the checksums (config.carried_numel)")
        tail = whole[n:].view(2, layout.n_blocks)
    job = _Job(state, bucket_index, send, intact, scale, layout, state.lengths(layout))
    if tail is not None:
        job.checksum_dtype = tail.dtype
    assert intact is not None or (carrier is None and scale is None), "no intact copy: no carrier, no scale"
    if layout.n_blocks:
        if declared is None:
            declared = sums_and_lower_bounds(send if intact is None else job.intact(), layout)
        if intact is None:
            declared = torch.cat([declared, all_abs_sum_bounds(send, layout).unsqueeze(0)])
        if scale is not None:
            declared.mul_(scale)
        if tail is not None:
            declared = pack_declared(declared, tail.dtype)
    attempts = cfg.max_retries + 1 if cfg.policy == "retry" and intact is not None else 1
    for attempt in range(attempts):
        state.attempt = attempt
        if attempt:
            _refill(send, job.intact(), scale)
        if tail is not None and declared is not None:
            tail.copy_(declared)  # every attempt: the reduction overwrote the previous one's
        state._inject("in_transit", bucket_index, send)
        if declared is None:  # an empty bucket: nothing to verify
            job.collective(send)
            state._inject("post_reduce", bucket_index, send)
            return True
        reduced = declared.clone() if tail is None else None
        # One collective when the checksums ride along; otherwise both in flight at once (gloo runs the bucket
        # and the small checksum vector on separate threads).
        bucket_work = dist.all_reduce(send if whole is None else whole, group=state.group, async_op=True)
        if state.in_flight is not None:
            state.in_flight(bucket_index)  # the agent's phase-allreduce faults: this rank is inside the collective
        if reduced is not None:
            job.collective(reduced)
        assert bucket_work is not None
        bucket_work.wait()
        state._inject("post_reduce", bucket_index, send)
        if reduced is None:
            assert tail is not None
            reduced = unpack_reduced(tail, state.world_size)
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


def _unverified_reduce(state: ChecksumState, bucket_index: int, send: torch.Tensor) -> None:
    """A reduction ``config.verify_every`` leaves unchecked: the same collective and injection sites, no checksums."""
    state.stats.unverified_reductions += 1
    state._inject("in_transit", bucket_index, send)
    work = dist.all_reduce(send, group=state.group, async_op=True)
    if state.in_flight is not None:
        state.in_flight(bucket_index)
    assert work is not None
    work.wait()
    state._inject("post_reduce", bucket_index, send)


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
    st.stats.buckets_checked += 1
    st.stats.blocks_checked += layout.n_blocks
    st.stats.unverifiable_blocks += layout.n_blocks - int(verifiable.sum())
    if reduced.shape[0] > 2:  # every block's exact bound came with the sums: both tiers here, one agreement round
        beyond = ~(reduced[2] < dmax) & suspect
        bad = suspect & ~(diff <= job.tolerance(reduced[2], job.lengths)) & ~beyond
        both = job.verdict(bad, suspect)
        st.stats.unverifiable_blocks += int(beyond.sum())
        st.stats.second_checks += int(both[1].sum() > 0)
        return bad, both[0]
    counts = job.verdict(suspect)
    if int(counts.sum()) == 0:
        return suspect, counts
    # Second tier: the exact bound for the union of every rank's suspects (so the collectives line up).
    st.stats.second_checks += 1
    union = suspect.to(torch.int32)
    job.collective(union, dist.ReduceOp.MAX)
    blocks = torch.nonzero(union).reshape(-1)
    upper = abs_sum_bounds(job.intact(), layout, blocks)
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
    if cfg.localize and job.source is not None:
        site_hint, culprit = _localize.localize(
            union_blocks, job.layout.span, job.send, job.intact(), job.scale, st.world_size, st.group
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
            event_kinds.DETECT_SDC,
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

    Register with ``ddp.register_comm_hook(state, checksum_hook)``. In place when the parameters' ``.grad``
    can rebuild the bucket (DDP's default ``gradient_as_bucket_view=False``; the reducer copies the result
    back only after the future completes: ``test_param_grads_hold_the_local_gradient_while_the_hook_runs``),
    else (or with ``config.carry_checksums=True``) out of place into a send buffer of ``state``, checksums
    appended. A clean step is bit-identical to default DDP. The future is already complete; under
    ``policy="raise"`` it carries :class:`SdcDetected`, which DDP re-raises from ``backward()``.
    """
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    grads = bucket.buffer()
    local = None if state.config.carry_checksums else _local_gradients(state, bucket, grads)
    try:
        future.set_result(average_bucket(state, bucket.index(), grads, local))
    except SdcDetected as exc:
        future.set_exception(exc)  # type: ignore[arg-type]  # the stub types it as the result type
    return future


def _local_gradients(
    state: ChecksumState, bucket: GradBucket, grads: torch.Tensor
) -> Callable[[torch.Tensor], None] | None:
    """A function writing the parameters' ``.grad`` (None: zeros, as the reducer does) into a tensor laid out
    like ``grads``; None if a ``.grad`` shares the bucket's storage (``gradient_as_bucket_view``) or is not a
    dense tensor of its dtype and device: checked once per bucket buffer (a rebuild that differs mismatches)."""
    key = (bucket.index(), grads.data_ptr(), grads.numel())
    if key not in state._rebuildable:
        storage = grads.untyped_storage().data_ptr()
        params = bucket.parameters()
        state._rebuildable[key] = len(params) == len(bucket.gradients()) and not any(
            p.grad is not None
            and (
                p.grad.layout != torch.strided
                or p.grad.dtype != grads.dtype
                or p.grad.device != grads.device
                or p.grad.untyped_storage().data_ptr() == storage
            )
            for p in params
        )
    if not state._rebuildable[key]:
        return None

    def write(out: torch.Tensor) -> None:
        out.zero_()  # gaps between views, if any, as zeros; None grads stay zeros (the reducer zero-fills them)
        base = grads.storage_offset()
        for view, p in zip(bucket.gradients(), bucket.parameters(), strict=True):
            if p.grad is not None:
                out.narrow(0, view.storage_offset() - base, view.numel()).view(view.shape).copy_(p.grad)

    return write


def average_bucket(
    state: ChecksumState,
    bucket_index: int,
    grads: torch.Tensor,
    local: Callable[[torch.Tensor], None] | None = None,
) -> torch.Tensor:
    """What :func:`checksum_hook` does with a bucket's flat buffer ``grads``: the verified average.

    ``local`` writes this rank's local data (``grads`` on entry) into a flat tensor: given it, ``grads`` is
    averaged in place and returned; None: ``grads`` stays intact and the average is returned in a view of the
    state's send buffer. Unverified (``config.verify_every``): ``grads`` averaged in place, like DDP's default.
    Raises :class:`SdcDetected` under ``policy="raise"``; sets ``state.skip_step`` when it gives up."""
    state._inject("local", bucket_index, grads)
    if state.observe is not None:
        state.observe(bucket_index, grads)
    scale = 1.0 / state.world_size
    if not state.due(bucket_index):  # no retry possible without a check: scale and reduce in place, like DDP
        grads.mul_(scale)
        _unverified_reduce(state, bucket_index, grads)
        return grads
    if local is not None:
        declared = _fill_and_declare(state, grads, grads, scale)  # scales in place, each chunk after its sums

        def rebuild() -> torch.Tensor:
            held = state.buffer(("intact", bucket_index), grads)
            local(held)
            return held

        guarded_reduce(state, bucket_index, grads, rebuild, scale, declared=declared)
        return grads
    n = grads.numel()
    carrier = state.carrier(("send", bucket_index), state.config.carried_numel(n, grads.dtype), grads.dtype)
    send = carrier[:n]
    declared = _fill_and_declare(state, grads, send, scale)
    guarded_reduce(state, bucket_index, send, grads, scale, carrier, declared)
    return send


def _fill_and_declare(
    state: ChecksumState, src: torch.Tensor, dst: torch.Tensor, scale: float | None
) -> torch.Tensor | None:
    """Write ``src`` (times ``scale``) into ``dst`` and declare ``src``'s block checksums in the same read."""
    if not src.numel():
        return None
    return sums_and_lower_bounds(src, state.config.layout(src.numel(), src.dtype), copy_to=dst, scale=scale)


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

    Returns True when the final result verified clean (after any retries) or was not due for verification
    (``config.verify_every``); False when the guard gave up (``policy`` skip, or retries exhausted: the
    result may then be corrupt, and ``state.skip_step`` is set). Raises :class:`SdcDetected` under
    ``policy="raise"`` (``tensor`` then holds either the reduced result or, when the checksums were carried,
    this rank's own input). A long-lived ``state`` (whose group, config and hook are then used; do not pass
    ``group``/``config``/``corrupt`` with it) reuses its buffer and keeps counters; without one a fresh state,
    and a fresh buffer, are made per call. ``bucket_index`` labels events and keys the buffer.

    In place, so a retry or localization needs an intact copy of the input (filled by the declaring pass; the
    checksums take a concurrent collective); with ``policy`` skip/raise and ``localize=False`` none is kept.
    ``config.carry_checksums=True``: the input is the copy, the data go into a buffer with room for the
    checksums, reduced, verified and copied back (one more pass: slower, measured in ``benchmarks/``).
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
    if not state.due(bucket_index):
        _unverified_reduce(state, bucket_index, flat)
        return True
    n = flat.numel()
    cfg = state.config
    carried = cfg.carried_numel(n, flat.dtype)
    if cfg.policy != "retry" and not cfg.localize and not (carried > n and cfg.carry_checksums):
        return guarded_reduce(state, bucket_index, flat, None, None)  # nothing needs the input afterwards
    if carried > n and cfg.carry_checksums:
        carrier = state.carrier(("carrier", bucket_index), carried, flat.dtype)
        send = carrier[:n]
        declared = _fill_and_declare(state, flat, send, None)
        ok = guarded_reduce(state, bucket_index, send, flat, None, carrier, declared)
        flat.copy_(send)
        return ok
    intact = state.buffer(("intact", bucket_index), flat)
    declared = _fill_and_declare(state, flat, intact, None)
    return guarded_reduce(state, bucket_index, flat, intact, None, declared=declared)


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
    "average_bucket",
    "checksum_hook",
    "checksummed_all_reduce",
    "guarded_reduce",
]
