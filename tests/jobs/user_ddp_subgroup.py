"""A user's script with DDP on a process group of its own: the world is split into data-parallel groups of two
ranks (``dist.new_group``: ranks 0-1, 2-3, ...), each training its own model (seeded by group) with
``DistributedDataParallel(model, process_group=group)``, as a pipeline or multi-model job does.

It imports nothing of mlchaos but the agent line; the agent reports ``target.step`` and, at the end,
``target.digest`` per rank. Run under torchrun with an even world size::

    torchrun --standalone --nproc-per-node 4 tests/jobs/user_ddp_subgroup.py --steps 6 --guard checksum
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import chaos.agent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--guard", choices=["none", "checksum"], default="checksum")
    parser.add_argument(
        "--consistency-every", type=int, default=2, help="check that the ranks' parameters agree every N steps"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group(backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    groups = [dist.new_group([r, r + 1]) for r in range(0, world, 2)]  # every rank creates every group
    index = rank // 2
    torch.manual_seed(100 + index)  # each group its own model: the groups must never be mixed
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 4))
    ddp = DistributedDataParallel(model, process_group=groups[index])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    guards = chaos.agent.Guards(checksum=args.guard == "checksum", consistency_every=args.consistency_every)
    agent = chaos.agent.attach(model, optimizer=optimizer, ddp=ddp, guard=guards)
    for step in range(1, args.steps + 1):
        agent.begin_step(step)
        data = torch.Generator().manual_seed(step * world + rank)
        x, y = torch.randn(16, 8, generator=data), torch.randn(16, 4, generator=data)
        optimizer.zero_grad(set_to_none=True)
        prediction = ddp(x)
        loss = nn.functional.mse_loss(prediction, y)
        loss.backward()
        agent.after_backward(loss)
        if agent.allow_optimizer_step():
            optimizer.step()
        agent.end_step()
    agent.close()
    time.sleep(0.2)  # see user_ddp_adam.py: let gloo release the last work before destroying the group
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
