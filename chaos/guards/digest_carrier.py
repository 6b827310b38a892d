"""Carries the cross-rank consistency guard's digest inside DDP's gradient all-reduce, so that no second
collective runs for it on the DDP path.

- Where: only where the agent's plain comm hook already reduces DDP's gradients (faults planned, the flight
  recorder, the anomaly guard); ``chaos.agent`` decides from the comm hook already registered. That hook calls
  :meth:`DigestCarrier.pack` and :meth:`DigestCarrier.unpack` around its all-reduce, after the in-transit
  corruption site, so the slots are never corrupted by an injected fault. Under DDP's default reduction (no
  comm hook: the carrier never registers one of its own), the checksum guard's hook, a comm hook of the
  user's, or in a group of more than 2 ranks, :func:`install` returns None and the guard keeps its own
  exchange.
- How: the guard hashes at step k (``end_step``) and :meth:`DigestCarrier.load`\\ s its words. In the next
  gradient reduction (step k+1's backward), bucket 0 (DDP's first-reduced bucket) is sent with ``world_size``
  slots appended: this rank's words, cut into 16-bit pieces (8-bit in a float16/bfloat16 bucket), as small
  integers in the bucket's dtype in its own slot, zeros in the others; after the all-reduce every rank reads
  every rank's words out of the slots, exactly. The carrying bucket is divided by the world size into a new
  buffer with the same operation DDP uses, then all-reduced with the slots behind it; the slots are cut off
  before the bucket goes back to DDP, and the gradients are never touched.
- Numerics: in a 2-rank group the gradients are bit-identical to DDP's default reduction.
- :meth:`DigestCarrier.take` hands the guard the rows at the verdict; when no gradient reduction ran since the
  check (the check of the last step, before ``close``), it returns None and the guard runs its own exchange.

Why carry at all, why no comm hook of its own, and why 2-rank groups only: docs/design/sdc-guards.md ("The
consistency guard").
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn

CARRIED_BUCKET = 0
"""The bucket that carries: DDP reduces bucket 0 first and caps it at 1 MiB by default."""

_MASK64 = (1 << 64) - 1
_PIECE_BITS = {torch.float32: 16, torch.float64: 16, torch.float16: 8, torch.bfloat16: 8}


class DigestCarrier:
    """This rank's digest words on their way through the next gradient reduction, and every rank's once there."""

    def __init__(self, group: dist.ProcessGroup | None) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.carried = 0  # reductions that carried a digest
        self._payload: list[int] | None = None  # words loaded, not yet sent
        self._tail: torch.Tensor | None = None  # the reduced slots, not yet taken
        self._words = 0

    def load(self, words: Sequence[int]) -> None:
        """This rank's (signed 64-bit) words, sent with the next gradient reduction; a payload not yet sent is
        replaced."""
        self._payload = [int(w) for w in words]
        self._words = len(self._payload)
        self._tail = None

    def take(self) -> list[list[int]] | None:
        """Every rank's words (in the group's rank order) from the reduction that carried them; None when none
        did since :meth:`load` (the caller then exchanges them itself). The same on every rank."""
        tail, self._tail = self._tail, None
        self._payload = None
        if tail is None:
            return None
        values = tail.tolist()
        bits = _PIECE_BITS[tail.dtype]
        pieces = 64 // bits
        if any(v != int(v) or not 0 <= v < 1 << bits for v in values):  # never with exact sums; never trusted
            return None
        rows: list[list[int]] = []
        for rank in range(self.world_size):
            row = []
            for word in range(self._words):
                start = (rank * self._words + word) * pieces
                u = sum(int(values[start + i]) << (bits * i) for i in range(pieces))
                row.append(u - (1 << 64) if u >= 1 << 63 else u)
            rows.append(row)
        return rows

    def _slots(self, payload: list[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        bits = _PIECE_BITS[dtype]
        mask = (1 << bits) - 1
        pieces = [float(((w & _MASK64) >> (bits * i)) & mask) for w in payload for i in range(64 // bits)]
        slots = torch.zeros(self.world_size * len(pieces), dtype=dtype, device=device)
        start = self.rank * len(pieces)
        slots[start : start + len(pieces)] = torch.tensor(pieces, dtype=dtype)
        return slots

    def pack(self, index: int, tensor: torch.Tensor) -> torch.Tensor:
        """What to all-reduce for bucket ``index`` whose (already divided) buffer is ``tensor``: the buffer
        itself, or, when this bucket carries, a new buffer holding a copy of it and the slots behind it."""
        payload = self._payload
        if payload is None or index != CARRIED_BUCKET or tensor.dtype not in _PIECE_BITS:
            return tensor
        self._payload = None
        numel = tensor.numel()
        slots = self._slots(payload, tensor.dtype, tensor.device)
        sent = torch.empty(numel + slots.numel(), dtype=tensor.dtype, device=tensor.device)
        sent[:numel].copy_(tensor)
        sent[numel:].copy_(slots)
        return sent

    def unpack(self, reduced: torch.Tensor, numel: int) -> torch.Tensor:
        """The bucket's ``numel`` reduced gradients out of what :meth:`pack` sent; keeps the slots for
        :meth:`take`."""
        if reduced.numel() == numel:
            return reduced
        self._tail = reduced[numel:]
        self.carried += 1
        return reduced[:numel]


def _registered_hook(ddp: nn.Module) -> str | None:
    """The name of the comm hook registered on ``ddp`` (None: DDP's default reduction)."""
    try:
        name = ddp._get_ddp_logging_data().get("comm_hook")  # type: ignore[operator]
    except (AttributeError, RuntimeError):
        return "unknown"
    return None if name is None else str(name)


def install(ddp: nn.Module, group: dist.ProcessGroup | None) -> DigestCarrier | None:
    """A carrier for ``ddp``'s gradient reduction when the agent's plain hook reduces it (it then rides there);
    None under DDP's default reduction (no comm hook: registering one for the carrier alone costs more than
    it saves, see the module docstring), under any other hook (the checksum guard's, the user's) and in a group
    of more than 2 ranks: the guard then keeps its own exchange."""
    if not isinstance(ddp, nn.parallel.DistributedDataParallel) or dist.get_world_size(group) != 2:
        return None
    if _registered_hook(ddp) != "_plain_hook":
        return None
    return DigestCarrier(group)


__all__ = ["CARRIED_BUCKET", "DigestCarrier", "install"]
