"""A user's torchft replica group, written like torchft's ``train_ddp.py`` plus the one mlchaos line: a Manager,
torchft's DistributedDataParallel and Optimizer wrapper, gloo on CPU, a small MLP on seeded synthetic data.
It imports nothing from ``chaos`` but the agent; the agent reports its steps (torchft's step, ``committed``,
``participants``) and fires the plan's faults inside torchft's gradient all-reduce.

    TORCHFT_LIGHTHOUSE=http://localhost:29510 REPLICA_GROUP_ID=0 torchrun --standalone --nproc-per-node 1 \\
        tests/jobs/user_torchft.py --steps 30 --guard checksum
"""

from __future__ import annotations

import argparse
import os
from datetime import timedelta

import torch
from torch import nn
from torchft import DistributedDataParallel, Manager, Optimizer, ProcessGroupGloo

import chaos.agent

REPLICA_GROUP_ID = int(os.environ.get("REPLICA_GROUP_ID", 0))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--guard", choices=["none", "checksum"], default="checksum")
    parser.add_argument("--timeout", type=float, default=10.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 4))
    inner = torch.optim.SGD(model.parameters(), lr=0.01)

    def load_state_dict(state: dict[str, object]) -> None:
        model.load_state_dict(state["model"])  # type: ignore[arg-type]
        inner.load_state_dict(state["optim"])  # type: ignore[arg-type]

    def state_dict() -> dict[str, object]:
        return {"model": model.state_dict(), "optim": inner.state_dict()}

    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=args.timeout)),
        min_replica_size=1,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        replica_id=f"user_torchft_{REPLICA_GROUP_ID}",
        timeout=timedelta(seconds=args.timeout),
    )
    ddp = DistributedDataParallel(manager, model)
    optimizer = Optimizer(manager, inner)
    agent = chaos.agent.attach(model, optimizer=inner, manager=manager, ddp=ddp, guard=args.guard)
    loss_fn = nn.MSELoss()
    while manager.current_step() < args.steps:
        step = manager.current_step() + 1
        gen = torch.Generator().manual_seed(step * 97 + REPLICA_GROUP_ID)
        x, y = torch.randn(32, 16, generator=gen), torch.randn(32, 4, generator=gen)
        optimizer.zero_grad()
        agent.begin_step(step)
        loss = loss_fn(ddp(x), y)
        loss.backward()
        agent.after_backward(loss)
        if agent.allow_optimizer_step():  # always True under torchft: torchft's commit decides
            optimizer.step()
        agent.end_step()
    agent.close()
    manager.shutdown()


if __name__ == "__main__":
    main()
