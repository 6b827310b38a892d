"""Hypothesis strategies for bit-flip faults, so users can property-test their own guards and detectors.

Example: a guard that claims to catch every exponent flip of a large-enough gradient element::

    import random
    from hypothesis import given, strategies as st
    from chaos import strategies as cs
    from chaos.injob.bitflip import choose_flips, flip_bits, restore

    @given(st.data())
    def test_guard_catches_exponent_flips(data):
        dtype = data.draw(cs.dtypes())
        grad = data.draw(cs.float_tensors(dtype, (4096,)))
        flips = data.draw(cs.flips(grad.numel(), dtype, cls="exponent", max_size=1))
        reference = my_guard.checksum(grad)
        record = flip_bits(grad, flips)
        assert my_guard.verify(grad, reference) is False   # or: the flip was masked, which you decide how to judge
        restore(grad, record)

Everything here is deterministic given Hypothesis' draws, so failures shrink and replay. Large tensors are
generated from a drawn seed and scale (fast) with a few drawn elements written over them (shrinkable).
"""

from __future__ import annotations

from typing import Any, get_args

import torch
from hypothesis import strategies as st

from chaos.injob.bitflip import SUPPORTED, BitClass, Flip, bit_layout, bits_in_class
from injectors.tensor import BitFlipParams, Kind, Persistence, Where

_SMALL = 64  # up to this many elements a tensor is drawn element by element


def dtypes() -> st.SearchStrategy[torch.dtype]:
    """One of the supported floating dtypes (float32, bfloat16, float16)."""
    return st.sampled_from(SUPPORTED)


def bit_classes() -> st.SearchStrategy[BitClass]:
    """``sign``, ``exponent`` or ``mantissa``."""
    return st.sampled_from(get_args(BitClass))


def bits(dtype: torch.dtype, cls: BitClass | None = None) -> st.SearchStrategy[int]:
    """A bit index of ``dtype`` (0 = least significant), optionally within one class."""
    if cls is None:
        return st.integers(0, bit_layout(dtype)[0] - 1)
    return st.sampled_from(bits_in_class(dtype, cls))


def flips(
    numel: int, dtype: torch.dtype, *, cls: BitClass | None = None, min_size: int = 1, max_size: int = 4
) -> st.SearchStrategy[list[Flip]]:
    """Lists of :class:`~chaos.injob.bitflip.Flip` on DISTINCT elements of a ``numel``-element tensor of ``dtype``.

    ``cls`` restricts the flipped bits to one class. The list length is in ``[min_size, max_size]``
    (capped at ``numel``).
    """
    if numel < 1:
        raise ValueError("numel must be >= 1")
    return st.lists(
        st.tuples(st.integers(0, numel - 1), bits(dtype, cls)),
        min_size=min(min_size, numel),
        max_size=min(max_size, numel),
        unique_by=lambda pair: pair[0],
    ).map(lambda pairs: [Flip(index, bit) for index, bit in pairs])


def float_tensors(
    dtype: torch.dtype,
    shape: tuple[int, ...],
    *,
    max_magnitude: float = 1e3,
    allow_nan: bool = False,
    allow_infinity: bool = False,
) -> st.SearchStrategy[torch.Tensor]:
    """Contiguous tensors of ``dtype`` and ``shape`` with finite values in ``[-max_magnitude, max_magnitude]``
    (rounded to the dtype), zeros and subnormals included; NaN/Inf elements only when allowed.
    """
    bit_layout(dtype)  # unsupported dtypes fail now, not at draw time
    numel = 1
    for size in shape:
        numel *= size
    if not max_magnitude > 0:
        raise ValueError(f"max_magnitude must be > 0, got {max_magnitude}")
    # Largest float32 not above the bound: st.floats(width=32) insists on exactly representable bounds.
    limit = float(torch.tensor(min(max_magnitude, torch.finfo(dtype).max), dtype=torch.float64).float())
    if limit > max_magnitude:
        limit = float(torch.nextafter(torch.tensor(limit), torch.tensor(0.0)))
    element = st.floats(-limit, limit, allow_nan=False, allow_infinity=False, allow_subnormal=True, width=32)
    special: list[float] = []
    if allow_nan:
        special.append(float("nan"))
    if allow_infinity:
        special += [float("inf"), float("-inf")]
    if special:
        element = st.one_of(element, st.sampled_from(special))
    if numel <= _SMALL:
        return st.lists(element, min_size=numel, max_size=numel).map(
            lambda values: torch.tensor(values, dtype=torch.float32).to(dtype).reshape(shape)
        )

    @st.composite
    def large(draw: Any) -> torch.Tensor:
        seed: int = draw(st.integers(0, 2**32 - 1))
        scale: float = draw(st.floats(1e-6, limit, allow_subnormal=False))
        generator = torch.Generator().manual_seed(seed)
        values = (torch.randn(numel, generator=generator, dtype=torch.float32) * scale).clamp(-limit, limit)
        for index, value in draw(st.lists(st.tuples(st.integers(0, numel - 1), element), max_size=8)):
            values[index] = value
        return values.to(dtype).reshape(shape)

    return large()


@st.composite
def _params(draw: Any, where: Where | None, kinds: tuple[Kind, ...], latent: bool) -> BitFlipParams:
    chosen_where: Where = where if where is not None else draw(st.sampled_from(get_args(Where)))
    kind: Kind = draw(st.sampled_from(kinds))
    # latent (never undone) exists only where a value stays in memory: weights and optimizer state.
    allowed = [
        p for p in get_args(Persistence) if p != "latent" or (latent and chosen_where in ("weights", "optimizer_state"))
    ]
    persistence: Persistence = draw(st.sampled_from(allowed))
    fields: dict[str, Any] = {"where": chosen_where, "kind": kind, "persistence": persistence}
    if chosen_where == "gradients":
        fields["phase"] = draw(st.sampled_from(["backward", "optimizer_step"]))
    elif chosen_where != "activations":
        fields["phase"] = draw(st.sampled_from(["forward", "backward", "optimizer_step"]))
    element = draw(st.none() | st.integers(0, 15))
    fields["element"] = element
    if kind == "bitflip":
        bit = draw(st.none() | bit_classes() | st.integers(0, 15))
        fields["bit"] = bit
        # With one element, several flips need that many distinct bits: only a class or "any" offers them.
        many = element is None or bit in (None, "exponent", "mantissa")
        fields["count"] = draw(st.integers(1, 4)) if many else 1
    elif kind in ("nan", "inf"):
        fields["count"] = 1 if element is not None else draw(st.integers(1, 4))
    else:
        fields["block"] = draw(st.integers(1, 64))
        fields["factor"] = draw(st.sampled_from([1e7, -1e7, 1e3, 0.0, 1e-7]))
    if persistence not in ("transient", "latent"):
        fields["steps"] = draw(st.none() | st.integers(1, 10))
    if persistence == "intermittent":
        fields["probability"] = draw(st.floats(0.0, 1.0))
    fields["seed"] = draw(st.none() | st.integers(0, 2**31))
    return BitFlipParams(**fields)


def bitflip_params(
    *, where: Where | None = None, kinds: tuple[Kind, ...] = get_args(Kind), latent: bool = True
) -> st.SearchStrategy[BitFlipParams]:
    """Valid :class:`~injectors.tensor.BitFlipParams` (elements < 16, bits < 16 so they fit every dtype).

    ``latent=False`` leaves out ``persistence: latent`` (a flip heal never undoes), e.g. to property-test heals.

    ``layer`` stays None (any target), since valid names depend on your model: set it with
    ``.map(lambda p: p.model_copy(update={"layer": "fc1.weight"}))``.
    """
    return _params(where, kinds, latent)


__all__ = ["bit_classes", "bitflip_params", "bits", "dtypes", "flips", "float_tensors"]
