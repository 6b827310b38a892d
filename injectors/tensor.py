"""``bitflip``: tensor faults inside the training process (bit flips, NaN/Inf, block scaling in weights,
activations, gradients or optimizer state), fired once, stuck at every step, or intermittently.

This module is the harness side only: :class:`BitFlipParams` (the YAML schema, validated without torch) and the
:class:`BitFlipInjector` entry. The in-job agent applies and heals the fault (:mod:`chaos.injob.tensor_faults`),
removing only the fault's own change. What each ``where`` and ``persistence`` means there:
docs/design/tensor-faults.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from chaos.event_kinds import TensorPhase as Phase
from chaos.injob.fault_specs import DEFAULT_PHASE, BitClass, Kind, Persistence, Where
from chaos.plugins.injector import InJobInjector

# A bit index of the widest dtype (float64): refused at validate when no tensor could have it; the tensor's own
# width (32 for float32, 16 for bfloat16) is checked when the fault fires.
BitIndex = Annotated[int, Field(ge=0, le=63)]
Emit = Callable[..., None]
_MAX_BITS = 32  # the widest supported dtype; the exact width is checked when the dtype is known


class BitFlipParams(BaseModel):
    """One tensor fault: where, what, how many, how long. Bit indices are checked against the real dtype
    when the fault is applied (the dtype is not known before)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    where: Where = Field(default="weights", description="weights | activations | gradients | optimizer_state")
    layer: str | None = Field(
        default=None,
        min_length=1,
        description=(
            "glob over parameter names (weights, gradients, optimizer_state) or module names (activations), "
            "e.g. 'layer1.*.conv1.weight'; null = any, chosen by the seeded rng "
            "(parameters weighted by size, leaf modules uniformly)"
        ),
    )
    kind: Kind = Field(default="bitflip", description="bitflip | nan | inf | scale (a block times factor)")
    element: int | None = Field(
        default=None, ge=0, description="flat element index (row-major); null = seeded random; kind=scale: start"
    )
    bit: BitIndex | BitClass | None = Field(
        default=None,
        description="kind=bitflip: bit index (0 = least significant; below the tensor's width: 32 for float32) or "
        "sign | exponent | mantissa",
    )
    count: int = Field(
        default=1, ge=1, description="distinct elements corrupted (with element: distinct bits of that element)"
    )
    block: int = Field(
        default=32, ge=1, description="kind=scale: consecutive elements scaled (cut at the tensor's end)"
    )
    factor: float = Field(default=1e7, description="kind=scale: the factor")
    persistence: Persistence = Field(
        default="transient",
        description=(
            "transient (once, healed at the end of its step) | latent (once, never undone: stays until the job "
            "overwrites it) | stuck (re-applied every step) | intermittent (each step with probability)"
        ),
    )
    probability: float = Field(default=0.5, ge=0.0, le=1.0, description="intermittent: chance of firing each step")
    steps: int | None = Field(
        default=None, ge=1, description="stuck/intermittent: how many steps it lasts; null = until the run ends"
    )
    phase: Phase = Field(
        default="forward",
        description=(
            "when in the step it fires; default: forward for weights/activations, backward for gradients, "
            "optimizer_step for optimizer_state"
        ),
    )
    state: str | None = Field(
        default=None,
        min_length=1,
        description=(
            "where=optimizer_state: the state tensor hit, e.g. exp_avg, exp_avg_sq (Adam), momentum_buffer (SGD); "
            "null = chosen by the seeded rng among the parameter-sized float state tensors (named in the history)"
        ),
    )
    rank: int | None = Field(default=None, ge=0, description="the rank hit; null = the trigger's rank, else 0")
    seed: int | None = Field(default=None, description="own rng seed for this fault; null = the run's stream")

    @model_validator(mode="before")
    @classmethod
    def _phase_follows_where(cls, data: Any) -> Any:
        # A plain `where: gradients` must not inherit the weights' "forward" (no gradient exists then).
        if isinstance(data, dict) and data.get("phase") is None:
            where = data.get("where", "weights")
            if isinstance(where, str) and where in DEFAULT_PHASE:  # anything else: the field says what is wrong
                return {**data, "phase": DEFAULT_PHASE[where]}
        return data

    @field_validator("bit")
    @classmethod
    def _bit_fits_some_dtype(cls, value: int | str | None) -> int | str | None:
        if isinstance(value, int) and not 0 <= value < _MAX_BITS:
            raise ValueError(f"bit must be in 0..{_MAX_BITS - 1} (0 = least significant), got {value}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> BitFlipParams:
        if self.bit is not None and self.kind != "bitflip":
            raise ValueError(f"bit applies to kind=bitflip only, not kind={self.kind}")
        if self.where == "activations" and self.phase != "forward":
            raise ValueError("activations are corrupted during the forward pass: phase must be forward")
        if self.where == "gradients" and self.phase == "forward":
            raise ValueError("gradients do not exist before backward: phase must be backward or optimizer_step")
        if self.state is not None and self.where != "optimizer_state":
            raise ValueError(
                f"state names an optimizer-state tensor ({self.state!r}): it needs where: optimizer_state, "
                f"not where: {self.where}"
            )
        if self.state == "step":
            raise ValueError("state: step is the optimizer's step counter, not a float tensor to corrupt")
        if self.steps is not None and self.persistence in ("transient", "latent"):
            raise ValueError(f"steps applies to stuck/intermittent faults; a {self.persistence} fault fires once")
        if self.persistence == "latent" and self.where not in ("weights", "optimizer_state"):
            raise ValueError(
                f"persistence: latent leaves a corrupted value in memory, and {self.where} are recomputed every "
                "step: use it with where: weights or optimizer_state"
            )
        if self.element is not None and self.count > 1:
            if self.kind in ("nan", "inf"):
                raise ValueError(f"kind={self.kind} with an element corrupts one element: count must be 1")
            if isinstance(self.bit, int) or self.bit == "sign":
                raise ValueError("count > 1 with an element needs that many distinct bits: give a bit class")
        return self


class BitFlipInjector(InJobInjector, name="bitflip", params=BitFlipParams):
    """flip bits / NaN / Inf / scale in weights, activations, gradients or optimizer state (in-job)

    ``bitflip``: IEEE-754 flips, NaN/Inf or block scaling in weights, activations, gradients, optimizer state."""


INJECTORS = (BitFlipInjector,)  # what chaos.plugins.registry collects from a built-in injector module

__all__ = [
    "DEFAULT_PHASE",
    "INJECTORS",
    "BitClass",
    "BitFlipInjector",
    "BitFlipParams",
    "Kind",
    "Persistence",
    "Phase",
    "Where",
]
