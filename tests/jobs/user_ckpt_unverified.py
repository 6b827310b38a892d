"""A DELIBERATELY BROKEN resumable training script, written the way many users write theirs: rank 0
``torch.save``s {model, optimizer, step} over one ``latest.pt`` every K steps (in place: no temp file, no fsync,
no manifest, no checksum), and on start every rank ``torch.load``s ``latest.pt`` if it exists and trusts it.

A save cut mid-file leaves a torn ``latest.pt`` that no longer loads (and the previous checkpoint is gone: it
was overwritten); flipped bytes in it load silently as wrong weights. The checkpoint scenarios must FAIL on it
(``tests/e2e/test_e2e_checkpoint_faults.py``). It imports nothing of mlchaos but ``chaos.agent`` (the one
``attach`` line and the loop hooks). Run it under torchrun::

    torchrun --nproc_per_node 2 tests/jobs/user_ckpt_unverified.py --checkpoint-dir /tmp/ckpt --steps 40
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import chaos.agent


def batch(seed: int, step: int, rank: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's batch of ``step``: a pure function of (seed, step, rank), so a resumed run sees the same data."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step * 101 + rank)
    x = torch.randn(size, 16, generator=gen)
    return x, torch.tanh(x[:, :1] - x[:, 1:2])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--checkpoint-dir", type=Path, required=True, help="latest.pt is saved here and resumed from")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--step-time", type=float, default=0.0, help="sleep per step, so a fault lands mid-run")
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    dist.init_process_group(backend="gloo")
    rank = dist.get_rank()

    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    latest = args.checkpoint_dir / "latest.pt"
    start = 1
    if latest.exists():  # whatever is there is trusted: the bug this job exists to show
        state = torch.load(latest)
        start = state["step"] + 1
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        print(f"rank {rank} resuming from {latest} at step {start}", flush=True)
    ddp = DistributedDataParallel(model)
    agent = chaos.agent.attach(model, optimizer=optimizer, ddp=ddp)

    for step in range(start, args.steps + 1):
        agent.begin_step(step)
        inputs, targets = batch(args.seed, step, rank, args.batch)
        optimizer.zero_grad(set_to_none=True)
        loss = F.mse_loss(ddp(inputs), targets)
        loss.backward()
        agent.after_backward(loss)
        if agent.allow_optimizer_step():
            optimizer.step()
        agent.end_step()
        if step % args.checkpoint_every == 0:
            if rank == 0:
                args.checkpoint_dir.mkdir(parents=True, exist_ok=True)
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, latest)
            dist.barrier()
        if args.step_time > 0:
            time.sleep(args.step_time)

    agent.close()
    time.sleep(0.2)  # let gloo's worker release the last work object before teardown (see user_ddp_resume.py)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
