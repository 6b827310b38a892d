"""Gradient corruption inside the collective (the ``grad_corrupt`` fault): one flat gradient bucket corrupted in
place at the site the agent's comm hook is at (see ``injectors.gradient`` for what each site models)."""

from __future__ import annotations

import random

import torch

from chaos.injob.bitflip import FlipRecord, choose_flips, flip_bits, scale_block, set_values
from chaos.injob.fault_specs import GradCorruptSpec


def corrupt_bucket(tensor: torch.Tensor, params: GradCorruptSpec, rng: random.Random) -> FlipRecord:
    """Corrupt ``tensor`` (a flat gradient bucket) in place as ``params`` says; return what changed."""
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
