"""A resumable training script written the way users write theirs: DDP + Adam over a DataLoader with a
DistributedSampler, a checkpoint of {model, optimizer, step} every K steps, and on start a resume from the
newest one.

It imports nothing of mlchaos but ``chaos.agent``: one ``attach`` call (handing over the DataLoader once) and
the loop hooks. It reports nothing itself; the agent reports its start, steps (loss, sample ids), the
checkpoints it saves with ``torch.save``, the resume and the final digest. Run it under torchrun::

    torchrun --nproc_per_node 2 tests/jobs/user_ddp_resume.py --checkpoint-dir /tmp/ckpt --steps 16

``--forget-optimizer`` (or ``FORGET_OPTIMIZER=1`` in the environment) is the classic resume bug: the model is
restored, the optimizer (Adam's moments and step count) is not, so the run ends with different weights than an
uninterrupted one.
"""

from __future__ import annotations

import argparse
import os
import re
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import chaos.agent


def latest_checkpoint(directory: Path) -> Path | None:
    """The newest ``ckpt-<step>.pt`` in ``directory``, or None."""
    found = [
        (int(m.group(1)), p) for p in directory.glob("ckpt-*.pt") if (m := re.fullmatch(r"ckpt-(\d+)\.pt", p.name))
    ]
    return max(found)[1] if found else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--checkpoint-every", type=int, default=4)
    parser.add_argument("--checkpoint-dir", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--step-time", type=float, default=0.0, help="sleep per step, so a fault lands mid-run")
    parser.add_argument("--forget-optimizer", action="store_true", help="resume the model only (a bug)")
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    dist.init_process_group(backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    # One epoch of data: exactly steps * batch * world samples, so every sample is trained once.
    data = torch.Generator().manual_seed(args.seed)
    x = torch.randn(args.steps * args.batch * world, 8, generator=data)
    y = torch.sin(x[:, :4]) + 0.1 * torch.randn(len(x), 4, generator=data)
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, shuffle=True, seed=args.seed)
    loader = DataLoader(dataset, batch_size=args.batch, sampler=sampler)

    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    start = 1
    latest = latest_checkpoint(args.checkpoint_dir)
    if latest is not None:
        state = torch.load(latest)
        model.load_state_dict(state["model"])
        if not (args.forget_optimizer or os.environ.get("FORGET_OPTIMIZER") == "1"):
            optimizer.load_state_dict(state["optimizer"])
        start = state["step"] + 1
        print(f"rank {rank} resuming from {latest} at step {start}", flush=True)
    ddp = DistributedDataParallel(model)
    agent = chaos.agent.attach(model, optimizer=optimizer, ddp=ddp, data=loader)
    loss_fn = nn.MSELoss()

    sampler.set_epoch(0)
    for step, (inputs, targets) in enumerate(loader, start=1):
        if step < start:
            continue  # trained before the restart: skip ahead in the epoch
        agent.begin_step(step)
        optimizer.zero_grad(set_to_none=True)
        outputs = ddp(inputs)
        loss = loss_fn(outputs, targets)
        loss.backward()
        agent.after_backward(loss)
        if agent.allow_optimizer_step():
            optimizer.step()
        agent.end_step()
        if step % args.checkpoint_every == 0 and rank == 0:
            args.checkpoint_dir.mkdir(parents=True, exist_ok=True)
            final = args.checkpoint_dir / f"ckpt-{step}.pt"
            tmp = final.with_suffix(f".tmp{os.getpid()}")
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, tmp)
            os.replace(tmp, final)  # atomic: a kill mid-save never leaves a torn checkpoint
        if step % args.checkpoint_every == 0:
            dist.barrier()  # nobody runs ahead of a checkpoint that is not written yet
        if args.step_time > 0:
            time.sleep(args.step_time)
        print(f"rank {rank} step {step} loss {loss.item():.6f}", flush=True)

    agent.close()
    # gloo's worker thread releases the last collective's work object after we moved on and needs the GIL for
    # it; destroying the group at that moment can deadlock (see chaos/reference/trainer.py): wait first.
    time.sleep(0.2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
