"""Gradient corruption in the collective: one rank's gradient bucket corrupted at one of three sites.

- ``local``: before any checksum is taken. Models a compute fault (a bad ALU, a flipped register): the
  rank's own gradient is wrong, so every checksum of the reduction is consistent with it. Only a gradient
  anomaly guard (norm vs peers/history, NaN/Inf) can see it.
- ``in_transit``: after the checksum is taken, before the reduction. Models corruption on the wire or in a
  NIC/switch buffer. A checksummed all-reduce catches it.
- ``post_reduce``: in the reduced result on one rank. Models corruption after the collective (a bad copy
  back); the ranks now disagree. A checksummed all-reduce catches it on the corrupted rank.

The fault is applied inside the job by :mod:`chaos.agent` through the guard's corruption hook
(:func:`chaos.injob.grad_faults.corrupt_bucket`, reading the params as :class:`chaos.injob.fault_specs.GradCorruptSpec`).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from chaos.event_kinds import Site
from chaos.injob.fault_specs import BitClass, Kind, Magnitude
from chaos.plugins.injector import InJobInjector
from injectors.tensor import BitIndex


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
    kind: Kind = "bitflip"
    element: int | None = Field(default=None, ge=0, description="flat index in the bucket (default: seeded random)")
    bit: BitIndex | BitClass | None = Field(
        default="exponent",
        description="bit index (0 = LSB; below the gradient's width: 32 for float32) or class; null = any bit",
    )
    count: int = Field(default=1, ge=1, description="elements corrupted")
    magnitude: Magnitude = Field(
        default="rms", description="rms: pick elements with |x| >= the bucket's RMS (flips that matter)"
    )
    block: int = Field(default=32, ge=1, description="kind=scale: consecutive elements scaled")
    factor: float = Field(default=1e7, description="kind=scale: the factor")


class GradCorruptInjector(InJobInjector, name="grad_corrupt", params=GradCorruptParams):
    """corrupt one rank's gradient bucket: local | in_transit | post_reduce (in-job)

    ``grad_corrupt``: corrupt one rank's gradient bucket locally, in transit or after the reduction."""


INJECTORS = (GradCorruptInjector,)
