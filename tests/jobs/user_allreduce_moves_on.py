"""A data-parallel job as users write one without DDP: each rank's gradients flattened and averaged with one
``dist.all_reduce``, the loss averaged for the log on a metrics group of its own, Adam, a checkpoint of {model,
optimizer, step} every K steps by rank 0, and on start a resume from it. A failed gradient all-reduce is logged
and the step goes on with the rank's own gradients (never retried). Nothing of mlchaos but the one ``attach`` line.
The same job as ``user_allreduce_retry.py`` but for that handler.

    torchrun --nproc_per_node 3 tests/jobs/user_allreduce_moves_on.py --checkpoint-dir /tmp/ckpt --steps 30
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


def all_reduce_or_local(tensor: torch.Tensor, rank: int) -> None:
    try:
        dist.all_reduce(tensor)
    except RuntimeError as exc:  # gloo raises RuntimeError, NCCL DistBackendError (a RuntimeError)
        print(f"rank {rank}: gradient all_reduce failed ({exc}); going on with local gradients", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--checkpoint-dir", type=Path, required=True)
    parser.add_argument("--checkpoint-every", type=int, default=5)
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
    start = 1
    if ckpt.exists():
        state = torch.load(ckpt)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"] + 1
        print(f"rank {rank}: resumed from step {state['step']}", flush=True)
    chaos.agent.attach(model, optimizer)  # the one line

    gen = torch.Generator().manual_seed(1234)
    data = [(torch.randn(12, 16, generator=gen), torch.randn(12, 1, generator=gen)) for _ in range(args.steps)]
    params = list(model.parameters())
    for step in range(start, args.steps + 1):
        x, y = data[step - 1]
        loss = nn.functional.mse_loss(model(x[rank::world]), y[rank::world])
        optimizer.zero_grad()
        loss.backward()
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        all_reduce_or_local(flat, rank)
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
            args.checkpoint_dir.mkdir(parents=True, exist_ok=True)
            tmp = ckpt.with_suffix(".tmp")
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, tmp)
            os.replace(tmp, ckpt)
        time.sleep(args.step_time)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
