"""A DDP training script written the way users write theirs, with three ways of handling a failing checkpoint save
(``--on-save-error``), for the storage error-window story (``retried_with_backoff``):

- ``crash`` (the common case): no handling at all; the first ``EIO``/``ENOSPC`` from ``torch.save`` kills the job;
- ``spin``: "just try again" in a loop with no delay: it survives the window but hammers the storage;
- ``backoff``: the right way: sleep 0.2 s, 0.4 s, 0.8 s ... (capped at 5 s) between tries, give up after 8.

It imports nothing of mlchaos but ``chaos.agent`` (one ``attach`` and the loop hooks) and reports nothing itself:
the agent reports its steps and the checkpoints it sees saved; the harness's storage layer reports the errors it
returned. Rank 0 saves ``ckpt-<step>.pt`` (temp file + ``os.replace``) every K steps; the others wait at a barrier.

    torchrun --nproc_per_node 2 tests/jobs/user_save_retry.py --checkpoint-dir /tmp/ckpt --on-save-error crash
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import chaos.agent


def save(state: dict[str, object], directory: Path, step: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"ckpt-{step}.pt"
    tmp = final.with_suffix(f".tmp{os.getpid()}")
    torch.save(state, tmp)
    os.replace(tmp, final)


def save_handling_errors(how: str, state: dict[str, object], directory: Path, step: int) -> None:
    if how == "crash":
        save(state, directory, step)
        return
    delay, tries = 0.2, 0
    while True:
        tries += 1
        try:
            save(state, directory, step)
            return
        except Exception as exc:  # torch.save reports a file it cannot open as RuntimeError, not OSError
            if how == "spin":
                continue  # the bug: no delay at all
            print(f"save of step {step} failed ({exc}), try {tries}", flush=True)
            if tries >= 8:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 5.0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--checkpoint-dir", type=Path, required=True)
    parser.add_argument("--step-time", type=float, default=0.1)
    parser.add_argument("--on-save-error", choices=["crash", "spin", "backoff"], default="crash")
    args = parser.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group(backend="gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    ddp = DistributedDataParallel(model)
    agent = chaos.agent.attach(model, optimizer=optimizer, ddp=ddp)
    data = torch.Generator().manual_seed(rank)
    for step in range(1, args.steps + 1):
        agent.begin_step(step)
        optimizer.zero_grad(set_to_none=True)
        inputs = torch.randn(4, 8, generator=data)
        loss = ddp(inputs).pow(2).mean()
        loss.backward()
        agent.after_backward(loss)
        optimizer.step()
        agent.end_step()
        if step % args.checkpoint_every == 0:
            if rank == 0:
                state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
                save_handling_errors(args.on_save_error, state, args.checkpoint_dir, step)
            dist.barrier()
        time.sleep(args.step_time)
    agent.close()
    time.sleep(0.2)  # see tests/jobs/user_ddp_resume.py: let gloo release its last work before the teardown
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
