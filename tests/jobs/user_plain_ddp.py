"""A DDP training script as users write theirs, with nothing of mlchaos in it: gloo with its own process-group
timeout, Adam, a checkpoint of {model, optimizer, step} every K steps written by rank 0, and on start a resume
from it. Run it under torchrun::

    torchrun --nproc_per_node 2 tests/jobs/user_plain_ddp.py --checkpoint-dir /tmp/ckpt --steps 60

mlchaos runs it unmodified: the steps come from the optimizer (the zero-line step reporter), the detections
from what torch prints when a collective fails.
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
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--checkpoint-dir", type=Path, required=True)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--step-time", type=float, default=0.1)
    parser.add_argument("--pg-timeout", type=float, default=10.0)
    args = parser.parse_args()

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.pg_timeout))
    rank = dist.get_rank()
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
    ddp = DistributedDataParallel(model)

    gen = torch.Generator().manual_seed(1234)
    data = [(torch.randn(8, 16, generator=gen), torch.randn(8, 1, generator=gen)) for _ in range(args.steps)]
    for step in range(start, args.steps + 1):
        x, y = data[step - 1]
        loss = nn.functional.mse_loss(ddp(x[rank::2]), y[rank::2])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if rank == 0 and step % 10 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
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
