"""What the reference trainer computes and keeps: its data (a pure function of seed and sample id), its model
and optimizer and the digest of their state (its checkpoints are in
:mod:`chaos.reference.checkpoint_store`). The training loop and the command line
are in :mod:`chaos.reference.trainer`, which re-exports every name here.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

IN_FEATURES = 16
HIDDEN = 64
CHECKPOINT_FORMAT = 1
# Large enough that any realistic seed*multiplier+id stays far below 2**64 (torch.Generator's seed range)
# while keeping neighbouring ids' seeds well apart.
SAMPLE_SEED_MULTIPLIER = 1_000_003


# --- data -------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=8)
def _teacher(seed: int) -> torch.Tensor:
    """The hidden linear direction labels are made from; a pure function of ``seed`` (never mutated)."""
    return torch.randn(IN_FEATURES, generator=torch.Generator().manual_seed(seed))


def sample(seed: int, sample_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Features (16,) and label (1,) of global sample ``sample_id``: a pure function of ``(seed, id)``.

    Each id gets its own generator, so a sample never depends on which rank, step or attempt reads it.
    """
    gen = torch.Generator().manual_seed(seed * SAMPLE_SEED_MULTIPLIER + sample_id)
    x = torch.randn(IN_FEATURES, generator=gen)
    noise = torch.randn(1, generator=gen)
    y = torch.tanh(x @ _teacher(seed) / 4.0).reshape(1) + 0.05 * noise
    return x, y


def step_sample_ids(step: int, rank: int, batch_size: int, world_size: int) -> list[int]:
    """Ids rank ``rank`` consumes at 1-based global ``step``: its contiguous slice of the step's B*W ids."""
    start = (step - 1) * batch_size * world_size + rank * batch_size
    return list(range(start, start + batch_size))


def make_batch(seed: int, ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack the samples for ``ids`` into (len, 16) features and (len, 1) labels."""
    pairs = [sample(seed, i) for i in ids]
    return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])


# --- model, optimizer, digest ----------------------------------------------------------------------------


def build_model(seed: int) -> nn.Module:
    """MLP 16->64->64->1 with an init that is a pure function of ``seed``."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(IN_FEATURES, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 1)
    )


def build_optimizer(model: nn.Module, lr: float) -> torch.optim.Optimizer:
    """SGD with momentum: its state (momentum buffers) matters, so losing it on resume changes the result.

    ``foreach=False`` pins one code path so the arithmetic cannot depend on torch's heuristics.
    """
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, foreach=False)


def _tensor_bytes(tensor: torch.Tensor) -> bytes:
    """The raw bytes of ``tensor`` (native byte order), without needing numpy."""
    flat = tensor.detach().to("cpu").contiguous()
    if flat.numel() == 0:
        return b""
    return ctypes.string_at(flat.data_ptr(), flat.numel() * flat.element_size())


def _hash_tensor(hasher: Any, name: str, tensor: torch.Tensor) -> None:
    # Name, dtype and shape go in too, so two states whose bytes merely concatenate alike cannot collide.
    hasher.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}\n".encode())
    hasher.update(_tensor_bytes(tensor))


def state_digest(model: nn.Module, optimizer: torch.optim.Optimizer) -> str:
    """sha256 hex over model tensors (sorted by name) then optimizer state tensors.

    Optimizer state is visited by parameter index (the order of ``param_groups``) and then by sorted key;
    non-tensor state values are hashed by ``repr``. Equal digests mean bit-identical training state.
    """
    hasher = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        _hash_tensor(hasher, f"model.{name}", tensor)
    opt_state: dict[int, dict[str, Any]] = optimizer.state_dict()["state"]
    for index in sorted(opt_state):
        for key in sorted(opt_state[index]):
            value = opt_state[index][key]
            if isinstance(value, torch.Tensor):
                _hash_tensor(hasher, f"optim.{index}.{key}", value)
            else:
                hasher.update(f"optim.{index}.{key}={value!r}\n".encode())
    return hasher.hexdigest()
