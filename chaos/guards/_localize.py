"""Where did a checksum mismatch come from? A small exchange run only after a mismatch (see checksum.py).

Every rank contributes, for a few mismatched blocks, the values it meant to send and the values it received.
From those each rank recomputes the correct reduction of those blocks and classifies the fault:

- some ranks, not all, received a wrong result: ``post_reduce`` on those ranks;
- every rank received the same wrong result: the fault entered before or during the reduction
  (``in_transit``); the culprit is the rank whose contribution, with ONE bit flipped, reproduces the wrong
  values exactly (checked for up to 16 wrong elements); ambiguous or unexplained -> no culprit;
- nobody received a wrong result: the data were fine and the checksum exchange itself was hit (``checksum``).

With W = 2 the recomputation is bit for bit (one addition, commutative). What it cannot do: tell a flip in a
sender's buffer from one on the wire into the reducer (both look the same), or attribute multi-bit corruption.
Comparing "what each rank sent" with "what it declared" is not possible after the fact: the all-reduce
overwrites the send buffer, and keeping a copy of what was sent would cost a full extra pass on every clean
reduction.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

_INT_VIEW = {
    torch.float32: torch.int32,
    torch.float64: torch.int64,
    torch.bfloat16: torch.int16,
    torch.float16: torch.int16,
}
_MAX_ELEMENTS = 16


def _intent(intact: torch.Tensor, scale: float | None, start: int, stop: int) -> torch.Tensor:
    part = intact[start:stop]
    # Same elementwise op as the send buffer was built with, so the values are bit-identical to what was sent.
    return part.clone() if scale is None else torch.mul(part, scale)


def _reduce_in_order(values: list[torch.Tensor]) -> torch.Tensor:
    acc = values[0].clone()
    for value in values[1:]:
        acc += value
    return acc


def _differs(a: torch.Tensor, b: torch.Tensor, contributions: list[torch.Tensor], exact: bool) -> torch.Tensor:
    """Elementwise: does received ``a`` differ from reference ``b`` beyond the reduction's own rounding?"""
    both_nan = torch.isnan(a) & torch.isnan(b)
    if exact:
        ints = _INT_VIEW[a.dtype]
        return (a.view(ints) != b.view(ints)) & ~both_nan
    u = float(torch.finfo(a.dtype).eps) / 2
    world = len(contributions)
    bound = sum(c.to(torch.float64).abs() for c in contributions) * ((world - 1) * u / (1 - (world - 1) * u))
    assert isinstance(bound, torch.Tensor)
    return ~((a.to(torch.float64) - b.to(torch.float64)).abs() <= bound) & ~both_nan


def _single_bit_variants(value: torch.Tensor) -> torch.Tensor:
    """All values a 1-element tensor can become by flipping exactly one of its bits (one per bit)."""
    ints = _INT_VIEW[value.dtype]
    width = value.element_size() * 8
    # The top bit's mask does not fit the signed integer type of that width: wrap it to its negative twin.
    masks = torch.tensor([(1 << b) - (1 << width) if b == width - 1 else 1 << b for b in range(width)], dtype=ints)
    return (value.reshape(1).view(ints) ^ masks).view(value.dtype)


def _explains(
    rank: int, intents: list[torch.Tensor], received: torch.Tensor, positions: list[int], exact: bool
) -> bool:
    for pos in positions:
        variants = _single_bit_variants(intents[rank][pos])
        column = [variants if r == rank else intents[r][pos].expand_as(variants) for r in range(len(intents))]
        predicted = _reduce_in_order(column)
        target = received[pos].expand_as(predicted)
        contributions = [c.clone() for c in column]
        if bool(_differs(predicted, target, contributions, exact).all()):
            return False
    return True


def localize(
    blocks: list[int],
    span: Callable[[int], tuple[int, int]],
    result: torch.Tensor,
    intact: torch.Tensor,
    scale: float | None,
    world: int,
    group: dist.ProcessGroup | None,
) -> tuple[str, int | None]:
    """``(site_hint, culprit_rank)`` for the mismatched ``blocks`` (collective; every rank gets the same answer)."""
    if not blocks:
        return "unknown", None
    spans = [span(b) for b in blocks]
    width = max(stop - start for start, stop in spans)
    # Zero padding is identical on every rank, so it never looks wrong.
    pack = torch.zeros(2, len(spans), width, dtype=result.dtype)
    for k, (start, stop) in enumerate(spans):
        pack[0, k, : stop - start] = _intent(intact, scale, start, stop)
        pack[1, k, : stop - start] = result[start:stop]
    gathered = [torch.empty_like(pack) for _ in range(world)]
    dist.all_gather(gathered, pack, group=group)
    intents = [g[0].reshape(-1) for g in gathered]
    received = [g[1].reshape(-1) for g in gathered]
    # Two ranks: one addition, commutative, so the recomputation is bit-exact; more ranks: gloo's order may
    # differ from ours, so compare within the elementwise rounding bound instead.
    exact = world == 2
    reference = _reduce_in_order(intents)
    wrong = [_differs(received[r], reference, intents, exact) for r in range(world)]
    wrong_ranks = [r for r in range(world) if bool(wrong[r].any())]
    if not wrong_ranks:
        return "checksum", None
    if len(wrong_ranks) < world:
        return "post_reduce", wrong_ranks[0] if len(wrong_ranks) == 1 else None
    positions = [int(p) for p in torch.nonzero(wrong[0]).reshape(-1)[:_MAX_ELEMENTS]]
    culprits = [r for r in range(world) if _explains(r, intents, received[0], positions, exact)]
    return "in_transit", culprits[0] if len(culprits) == 1 else None
