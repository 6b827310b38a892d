"""A data-parallel job as users write one without DDP: each rank's gradients flattened and averaged with one
``dist.all_reduce``, the loss averaged for the log on a metrics group of its own, Adam, a checkpoint of {model,
optimizer, step} every K steps by rank 0, and on start a resume from it. Nothing of mlchaos but the one ``attach``
line. What the job does when the gradient all-reduce fails is ``--on-allreduce-error``:

- ``retry`` (the default): tries it again (up to 3 tries, 0.2 s apart), then gives up (the error ends the rank);
- ``local``: logs it and goes on with the rank's own gradients, never retried.

    torchrun --nproc_per_node 3 tests/jobs/user_allreduce.py --checkpoint-dir /tmp/ckpt --steps 30
"""

from __future__ import annotations

import argparse
import datetime
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

import chaos.agent

TRIES = 3


def all_reduce_gradients(flat: torch.Tensor, rank: int, on_error: str) -> None:
    for attempt in range(1, TRIES + 1):
        try:
            dist.all_reduce(flat)
            return
        except RuntimeError as exc:  # gloo raises RuntimeError, NCCL DistBackendError (a RuntimeError)
            if on_error == "local":
                print(f"rank {rank}: gradient all_reduce failed ({exc}); going on with local gradients", flush=True)
                return
            if attempt == TRIES:
                raise
            print(f"rank {rank}: gradient all_reduce failed ({exc}); retry {attempt}/{TRIES - 1}", flush=True)
            time.sleep(0.2)


def load_checkpoint(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Loads the model and optimizer state ``path`` holds; the step it was saved at, or 0 when there is none."""
    if not path.exists():
        return 0
    state = torch.load(path)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return int(state["step"])


def save_checkpoint(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    """Writes {model, optimizer, step} to ``path`` through a temp file and a rename: never a torn ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, tmp)
    os.replace(tmp, path)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--checkpoint-dir", type=Path, required=True)
    parser.add_argument("--checkpoint-every", type=int, default=5)
    parser.add_argument(
        "--on-allreduce-error",
        choices=["retry", "local"],
        default="retry",
        help="a failed gradient all-reduce: retry it, or go on with this rank's local gradients",
    )
    parser.add_argument("--step-time", type=float, default=0.05)
    parser.add_argument("--pg-timeout", type=float, default=15.0)
    args = parser.parse_args()

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.pg_timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    metrics = dist.new_group(list(range(world)))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    ckpt = args.checkpoint_dir / "latest.pt"
    resumed = load_checkpoint(ckpt, model, optimizer)
    if resumed:
        print(f"rank {rank}: resumed from step {resumed}", flush=True)
    chaos.agent.attach(model, optimizer)  # the one line

    gen = torch.Generator().manual_seed(1234)
    data = [(torch.randn(12, 16, generator=gen), torch.randn(12, 1, generator=gen)) for _ in range(args.steps)]
    params = list(model.parameters())
    for step in range(resumed + 1, args.steps + 1):
        x, y = data[step - 1]
        loss = nn.functional.mse_loss(model(x[rank::world]), y[rank::world])
        optimizer.zero_grad()
        loss.backward()
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        all_reduce_gradients(flat, rank, args.on_allreduce_error)
        flat /= world
        offset = 0
        for p in params:
            p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
        optimizer.step()
        mean_loss = loss.detach().reshape(1)
        dist.all_reduce(mean_loss, group=metrics)
        if rank == 0 and step % 5 == 0:
            print(f"step {step} loss {mean_loss.item() / world:.4f}", flush=True)
        if step % args.checkpoint_every == 0 and rank == 0:
            save_checkpoint(ckpt, model, optimizer, step)
        time.sleep(args.step_time)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
