"""A training script written the way users write theirs: DDP + Adam on a small MLP, seeded data, N steps.

It imports nothing of mlchaos but the public API (``chaos.agent``, ``chaos.events``): one ``attach`` call and
the loop hooks. Run it under torchrun (``torchrun --nproc_per_node 2 tests/jobs/user_ddp_adam.py --steps 5``);
with ``CHAOS_EVENTS`` set it reports ``target.step`` {step, loss} per step and, at the end, ``target.digest``
{digest, step}: sha256 over parameters and optimizer state, so a faulted run compares bitwise with a golden one.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import chaos.agent
from chaos.events import emit


def digest(model: nn.Module, optimizer: torch.optim.Optimizer) -> str:
    """sha256 over parameters (by name) and optimizer state (by parameter index, then key): equal = bitwise."""
    h = hashlib.sha256()
    tensors = sorted(model.state_dict().items())
    for index, state in sorted(optimizer.state_dict()["state"].items()):
        tensors += [(f"optim.{index}.{key}", value) for key, value in sorted(state.items())]
    for name, value in tensors:
        t = torch.as_tensor(value).detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}\n".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    dist.init_process_group(backend="gloo")  # MASTER_ADDR, RANK, WORLD_SIZE … come from torchrun
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    agent = chaos.agent.attach(model, optimizer=optimizer, ddp=ddp, job_emits={"target.step", "target.digest"})
    loss_fn = nn.MSELoss()

    for step in range(1, args.steps + 1):
        agent.begin_step(step)
        data = torch.Generator().manual_seed(args.seed * 1_000_003 + step * world + rank)
        x = torch.randn(args.batch, 8, generator=data)
        y = torch.sin(x[:, :4]) + 0.1 * torch.randn(args.batch, 4, generator=data)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(ddp(x), y)
        loss.backward()
        agent.after_backward(loss)
        if agent.allow_optimizer_step():
            optimizer.step()
        agent.end_step()
        print(f"rank {rank} step {step} loss {loss.item():.6f}", flush=True)
        emit("target.step", rank=rank, step=step, loss=float(loss.item()))

    agent.close()
    emit("target.digest", rank=rank, digest=digest(model, optimizer), step=args.steps)
    print(f"rank {rank} digest {digest(model, optimizer)} pid {os.getpid()}", flush=True)
    # gloo's worker thread releases the last collective's work object after we moved on and needs the GIL for
    # it; destroying the group at that moment can deadlock (see chaos/reference/trainer.py): wait first.
    time.sleep(0.2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
