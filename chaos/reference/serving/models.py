"""The two reference models the serving stack serves: tiny deterministic MLPs, pure functions of a seed.

``primary`` (32 -> 256 -> 256 -> 8) and ``small`` (32 -> 32 -> 8) differ in shape, so their answers differ:
a response served by the fallback is recognisably not the primary's. Both cost tens of microseconds per
single-row forward on one CPU thread.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from chaos.reference.serving.wire import INPUT_DIM, OUTPUT_DIM

ModelName = Literal["primary", "small"]
_HIDDEN: dict[str, tuple[int, ...]] = {"primary": (256, 256), "small": (32,)}
# Per-model seed offsets, so the small model is not the primary's first layers by construction.
_SEED_OFFSET = {"primary": 0, "small": 7919}


def build_model(name: ModelName, seed: int) -> nn.Sequential:
    """The model ``name`` with weights drawn from ``seed`` (same seed, same weights, in every process)."""
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed + _SEED_OFFSET[name])
    try:
        layers: list[nn.Module] = []
        width = INPUT_DIM
        for hidden in _HIDDEN[name]:
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        layers.append(nn.Linear(width, OUTPUT_DIM))
        model = nn.Sequential(*layers)
    finally:
        torch.random.set_rng_state(generator_state)
    model.eval()
    for param in model.parameters():
        param.requires_grad_(False)  # inference only: no autograd bookkeeping per request
    return model


def predict(model: nn.Module, features: list[float]) -> list[float]:
    """One single-row forward pass: the model's ``OUTPUT_DIM`` outputs for ``features``."""
    with torch.no_grad():
        out = model(torch.tensor(features, dtype=torch.float32).unsqueeze(0))
    return [float(v) for v in out[0].tolist()]
