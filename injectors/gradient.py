"""Gradient corruption in the collective: one rank's gradient bucket corrupted at one of three sites.

- ``local``: before any checksum is taken. Models a compute fault (a bad ALU, a flipped register): the
  rank's own gradient is wrong, so every checksum of the reduction is consistent with it. Only a gradient
  anomaly guard (norm vs peers/history, NaN/Inf) can see it.
- ``in_transit``: after the checksum is taken, before the reduction. Models corruption on the wire or in a
  NIC/switch buffer. A checksummed all-reduce catches it.
- ``post_reduce``: in the reduced result on one rank. Models corruption after the collective (a bad copy
  back); the ranks now disagree. A checksummed all-reduce catches it on the corrupted rank.

The fault is applied inside the job by :mod:`chaos.agent` through the guard's corruption hook.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from chaos.plugins.injector import InJobInjector
from injectors.tensor import BitIndex

if TYPE_CHECKING:  # torch is imported only inside the job: the harness loads params models without it
    import torch

    from chaos.injob.bitflip import FlipRecord

Site = Literal["local", "in_transit", "post_reduce"]


class GradCorruptParams(BaseModel):
    """Which bucket, where in the collective, and what corruption."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    site: Site = Field(default="in_transit", description="local | in_transit | post_reduce")
    bucket: int = Field(default=0, ge=0, description="DDP gradient bucket index")
    rank: int | None = Field(default=None, ge=0, description="the rank corrupted (default: the trigger's rank, else 1)")
    replica: str | None = Field(
        default=None,
        min_length=1,
        description="a roles target's replica whose rank is corrupted (a torchft replica group, e.g. group.1); "
        "null: that rank in every replica",
    )
    kind: Literal["bitflip", "nan", "inf", "scale"] = "bitflip"
    element: int | None = Field(default=None, ge=0, description="flat index in the bucket (default: seeded random)")
    bit: BitIndex | Literal["sign", "exponent", "mantissa"] | None = Field(
        default="exponent", description="bit index (0 = LSB; below the gradient's width: 32 for float32) or class; null = any bit"
    )
    count: int = Field(default=1, ge=1, description="elements corrupted")
    magnitude: Literal["any", "rms"] = Field(
        default="rms", description="rms: pick elements with |x| >= the bucket's RMS (flips that matter)"
    )
    block: int = Field(default=32, ge=1, description="kind=scale: consecutive elements scaled")
    factor: float = Field(default=1e7, description="kind=scale: the factor")


def corrupt_bucket(tensor: torch.Tensor, params: GradCorruptParams, rng: random.Random) -> FlipRecord:
    """Corrupt ``tensor`` (a flat gradient bucket) in place as ``params`` says; return what changed."""
    from chaos.injob.bitflip import choose_flips, flip_bits, scale_block, set_values

    flat = tensor.detach().view(-1)
    numel = flat.numel()
    if params.kind == "scale":
        start = params.element if params.element is not None else rng.randrange(max(numel - params.block, 0) + 1)
        return scale_block(flat, start, min(params.block, numel - start), params.factor)
    min_magnitude = None
    if params.magnitude == "rms" and params.element is None:
        min_magnitude = float(flat.double().pow(2).mean().sqrt())
    flips = choose_flips(
        numel,
        flat.dtype,
        rng,
        element=params.element,
        bit=params.bit if params.kind == "bitflip" else None,
        count=params.count,
        min_magnitude=min_magnitude,
        values=flat,
    )
    if params.kind == "bitflip":
        return flip_bits(flat, flips)
    value = float("nan") if params.kind == "nan" else float("inf")
    return set_values(flat, [f.index for f in flips], value)


class GradCorruptInjector(InJobInjector):
    """``grad_corrupt``: corrupt one rank's gradient bucket locally, in transit or after the reduction."""

    name: ClassVar[str] = "grad_corrupt"
    Params: ClassVar[type[BaseModel]] = GradCorruptParams
    summary: ClassVar[str] = "corrupt one rank's gradient bucket: local | in_transit | post_reduce (in-job)"


INJECTORS = (GradCorruptInjector,)
