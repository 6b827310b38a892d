"""A DDP training script with a DataLoader and a DistributedSampler, as users write theirs, with nothing of mlchaos
in it: epochs with ``sampler.set_epoch``, AdamW, a checkpoint of {model, optimizer, epoch, batch, step} every K
steps written by rank 0, and a mid-epoch resume that skips the batches the checkpoint already trained. Run it
under torchrun::

    torchrun --nproc_per_node 2 tests/jobs/user_sampler_ddp.py --checkpoint-dir /tmp/ckpt --epochs 3
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
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=320)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--checkpoint-dir", type=Path, required=True)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--step-time", type=float, default=0.05)
    parser.add_argument("--pg-timeout", type=float, default=10.0, help="gloo's collective timeout (s)")
    args = parser.parse_args()

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.pg_timeout))
    rank = dist.get_rank()
    gen = torch.Generator().manual_seed(1234)
    dataset = TensorDataset(torch.randn(args.samples, 16, generator=gen), torch.randn(args.samples, 1, generator=gen))
    sampler = DistributedSampler(dataset, shuffle=True, seed=7)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    ckpt = args.checkpoint_dir / "latest.pt"
    first_epoch, skip, step = 0, 0, 0
    if ckpt.exists():
        state = torch.load(ckpt)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        first_epoch, skip, step = state["epoch"], state["batch"], state["step"]
        print(f"rank {rank}: resumed at epoch {first_epoch}, batch {skip}, step {step}", flush=True)
    ddp = DistributedDataParallel(model)

    for epoch in range(first_epoch, args.epochs):
        sampler.set_epoch(epoch)
        trained = 0
        for batch, (x, y) in enumerate(loader):
            if batch < skip:
                continue  # trained before the checkpoint
            loss = nn.functional.mse_loss(ddp(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            trained += 1
            if step % args.checkpoint_every == 0 and rank == 0:
                args.checkpoint_dir.mkdir(parents=True, exist_ok=True)
                tmp = ckpt.with_suffix(".tmp")
                state = {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "epoch": epoch,
                    "batch": batch + 1,
                    "step": step,
                }
                torch.save(state, tmp)
                os.replace(tmp, ckpt)
            time.sleep(args.step_time)
        skip = 0
        if rank == 0 and trained:  # a resume at an epoch's end trains nothing more in it
            print(f"epoch {epoch} done at step {step}, loss {loss.item():.4f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
