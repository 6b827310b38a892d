"""A user's torchft replica group, written like torchft's ``train_ddp.py`` and never edited for mlchaos: a
Manager, torchft's DistributedDataParallel and Optimizer wrapper, AdamW, gloo on CPU, a small MLP on seeded
synthetic data. ``--step-time`` stands in for a real model's compute (this one takes under a millisecond).

The one-line tier is this file plus ``import chaos.agent`` and ``agent = chaos.agent.attach(model, optimizer,
manager=manager, ddp=ddp)`` after the optimizer line (tests write that copy with ``support.attached_script``).

    TORCHFT_LIGHTHOUSE=http://localhost:29510 REPLICA_GROUP_ID=0 torchrun --standalone --nproc-per-node 1 \\
        tests/jobs/user_torchft.py --steps 30
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import timedelta

import torch
from torch import nn
from torchft import DistributedDataParallel, Manager, Optimizer, ProcessGroupGloo

REPLICA_GROUP_ID = int(os.environ.get("REPLICA_GROUP_ID", 0))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--timeout", type=float, default=10.0)
    parser.add_argument("--step-time", type=float, default=0.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 4))
    inner = torch.optim.AdamW(model.parameters(), lr=0.01)

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
    loss_fn = nn.MSELoss()
    while manager.current_step() < args.steps:
        gen = torch.Generator().manual_seed(manager.current_step() * 97 + REPLICA_GROUP_ID)
        x, y = torch.randn(32, 16, generator=gen), torch.randn(32, 4, generator=gen)
        optimizer.zero_grad()
        loss = loss_fn(ddp(x), y)
        loss.backward()
        optimizer.step()
        print(f"[replica {REPLICA_GROUP_ID}] step {manager.current_step()} loss {loss.item():.4f}", flush=True)
        time.sleep(args.step_time)
    manager.shutdown()


if __name__ == "__main__":
    main()
