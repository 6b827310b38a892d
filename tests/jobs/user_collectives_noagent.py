"""The BROKEN twin of ``user_collectives.py``: the same user job's collectives (a gradient-like all-reduce on the
world group and a metrics all-reduce on a group of its own every step, a barrier every 10 steps), written by a
hand that puts them in a ``main()``, and WITHOUT the agent line, so no flight recorder runs in it and nothing can
say which rank a hang waits for. Scenarios that ask ``culprit_named`` of it must not pass
(tests/e2e/test_e2e_hang_culprit.py).

Env: STEPS (default 200), STEP_TIME (seconds slept per step, default 0.02), PG_TIMEOUT (seconds, default 60).
"""

import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def main() -> None:
    steps = int(os.environ.get("STEPS", "200"))
    step_time = float(os.environ.get("STEP_TIME", "0.02"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=float(os.environ.get("PG_TIMEOUT", "60"))))
    rank, world = dist.get_rank(), dist.get_world_size()
    metrics = dist.new_group(list(range(world)))
    for step in range(1, steps + 1):
        grad = torch.full((4096,), float(rank + step))
        dist.all_reduce(grad)
        dist.all_reduce(torch.tensor([float(grad[0])]), group=metrics)  # the step's loss, for the log
        if step % 10 == 0:
            dist.barrier()
        time.sleep(step_time)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
