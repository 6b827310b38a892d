"""The checksum guard's types: configuration, counters, detections and the injection-point protocol.

Re-exported by :mod:`chaos.guards.checksum`, where they are documented in context; import them from there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

import torch

from chaos.event_kinds import Site
from chaos.guards.rounding import CARRIER_DTYPES, SUB_BLOCK, BlockLayout

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
    events and the blocks localization looks at (with ``policy`` skip or raise and ``localize=False`` the
    standalone keeps no intact copy of its input: nothing would read it). ``carry_checksums``: float32/float64
    buckets carry their checksums appended to the bucket's own collective, else (and always for 16-bit
    buckets) a separate float64 collective carries them; None (the default): the DDP hook carries them only
    on its out-of-place path (``gradient_as_bucket_view=True``: its send buffer is its own) and sends them
    separately when it reduces the bucket in place; ``True`` forces the out-of-place, carried path;
    :func:`~chaos.guards.checksum.checksummed_all_reduce`, which reduces the caller's tensor in place, sends them
    separately (carrying them would cost a copy of the result back into the tensor: measured dearer).
    ``verify_every``: verify one reduction in k per bucket (1: every one); the others are plain reductions, so
    a transient fault is caught with probability 1/k times the verified coverage (a declared trade-off;
    ``stats.unverified_reductions`` counts them). Every rank must use the same config (it decides which
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
    carry_checksums: bool | None = None
    verify_every: int = 1

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
        if self.verify_every < 1:
            raise ValueError(f"verify_every must be >= 1, got {self.verify_every}")

    def layout(self, numel: int, dtype: torch.dtype) -> BlockLayout:
        """The block layout of a bucket of ``numel`` elements of ``dtype``."""
        low = dtype in (torch.float16, torch.bfloat16)
        block = self.low_precision_block_elems if low else self.block_elems
        return BlockLayout(numel, block, min(SUB_BLOCK, block))

    def carried_numel(self, numel: int, dtype: torch.dtype) -> int:
        """Elements of a send buffer for ``numel`` elements of ``dtype`` with the checksums appended when they
        travel in the bucket's own collective (``numel`` when they do not)."""
        if self.carry_checksums is False or dtype not in CARRIER_DTYPES or not numel:
            return numel
        return numel + 2 * self.layout(numel, dtype).n_blocks


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
    unverified_reductions: int = 0
