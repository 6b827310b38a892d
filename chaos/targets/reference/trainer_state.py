"""What the reference trainer computes and keeps: its data (a pure function of seed and sample id), its model
and optimizer, the digest of their state, and its atomic checkpoints. The training loop and the command line
are in :mod:`chaos.targets.reference.trainer`, which re-exports every name here.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

IN_FEATURES = 16
HIDDEN = 64
CHECKPOINT_FORMAT = 1
KEEP_CHECKPOINTS = 2
# Large enough that any realistic seed*multiplier+id stays far below 2**64 (torch.Generator's seed range)
# while keeping neighbouring ids' seeds well apart.
SAMPLE_SEED_MULTIPLIER = 1_000_003
_CHECKPOINT_NAME = re.compile(r"^ckpt-(\d{6,})\.pt$")


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


# --- checkpoints -----------------------------------------------------------------------------------------


def checkpoint_path(directory: Path, step: int) -> Path:
    """Where the checkpoint for ``step`` lives."""
    return directory / f"ckpt-{step:06d}.pt"


def list_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """Committed checkpoints in ``directory`` as (step, path), oldest first.

    Only names produced by ``os.replace`` match, so a half-written temp file is never listed.
    """
    found: list[tuple[int, Path]] = []
    if not directory.is_dir():
        return found
    for entry in directory.iterdir():
        match = _CHECKPOINT_NAME.match(entry.name)
        if match is not None and entry.is_file():
            found.append((int(match.group(1)), entry))
    return sorted(found)


def _fsync_dir(directory: Path) -> None:
    # The rename is durable only once the directory entry itself is on disk.
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(directory: Path, step: int, state: dict[str, Any]) -> Path:
    """Write ``state`` atomically as ``ckpt-<step>.pt`` and keep only the newest :data:`KEEP_CHECKPOINTS`.

    Temp file in the same directory (same filesystem, so ``os.replace`` is atomic), flush + fsync, rename,
    fsync the directory. A crash at any point leaves either the old set of checkpoints or the new one.
    """
    directory.mkdir(parents=True, exist_ok=True)
    final = checkpoint_path(directory, step)
    tmp = directory / f".{final.name}.tmp.{os.getpid()}"
    with open(tmp, "wb") as handle:
        torch.save(state, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, final)
    _fsync_dir(directory)
    for _, old in list_checkpoints(directory)[:-KEEP_CHECKPOINTS]:
        old.unlink(missing_ok=True)
    return final


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Load a checkpoint with ``weights_only=True``: it holds only tensors and plain containers, and a
    checkpoint directory is exactly the kind of place a storage fault (or anyone) could plant a pickle."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path}: not a ddp_trainer checkpoint (format {CHECKPOINT_FORMAT})")
    return state


def _newest_loadable(directory: Path) -> tuple[int, Path, dict[str, Any]] | None:
    """Newest checkpoint that loads, falling back to older ones when the newest is corrupt."""
    for step, path in reversed(list_checkpoints(directory)):
        try:
            return step, path, load_checkpoint(path)
        except Exception as exc:  # noqa: BLE001 - any unreadable file means "try the previous one"
            print(f"ddp_trainer: skipping unreadable checkpoint {path}: {exc}", file=sys.stderr, flush=True)
    return None


def _remove_stale_temp_files(directory: Path) -> None:
    # Only rank 0 writes checkpoints and every worker of the previous attempt is dead before torchrun
    # starts this one, so any temp file left here is debris from a writer killed mid-save.
    if directory.is_dir():
        for entry in directory.glob(".ckpt-*.tmp.*"):
            entry.unlink(missing_ok=True)
