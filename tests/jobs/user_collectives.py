"""A user's job with two process groups, written the way users write them: a gradient-like all-reduce on the
world group and a metrics all-reduce on a group of its own every step, a barrier every 10 steps. It imports
nothing from mlchaos but the agent line (which also turns on the collective flight recorder the harness reads).

Env: STEPS (default 200), STEP_TIME (seconds slept per step, default 0.02), PG_TIMEOUT (seconds, default 60).
"""

import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

import chaos.agent

dist.init_process_group("gloo", timeout=timedelta(seconds=float(os.environ.get("PG_TIMEOUT", "60"))))
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = nn.Linear(32, 32)
agent = chaos.agent.attach(model, guard=chaos.agent.Guards(consistency_every=0))
metrics = dist.new_group(list(range(world)))  # a second process group, as a job with metrics or TP groups has
steps = int(os.environ.get("STEPS", "200"))
step_time = float(os.environ.get("STEP_TIME", "0.02"))
for step in range(1, steps + 1):
    agent.begin_step(step)
    grad = torch.full((4096,), float(rank + step))
    dist.all_reduce(grad)
    loss = torch.tensor([float(grad[0])])
    dist.all_reduce(loss, group=metrics)
    if step % 10 == 0:
        dist.barrier()
    agent.end_step()
    time.sleep(step_time)
agent.close()
dist.destroy_process_group()
