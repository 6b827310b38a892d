"""A DDP training script with a peer watchdog, as users write one: every rank writes a heartbeat file each step
(its step), and a thread on rank 0 ends the job when a peer's step has not changed for --stall-timeout
seconds, so a rank hung in a collective does not hold the nodes for hours. It times that on rank 0's own
``time.monotonic()``, which no step of the wall clock moves (NTP correcting drift, a VM resumed from a snapshot):
it rides such a jump out. ``user_heartbeat_wall.py`` compares wall-clock stamps instead, and a jump kills it.
Run it under torchrun::

    torchrun --nproc_per_node 2 tests/jobs/user_heartbeat_monotonic.py --heartbeat-dir /tmp/hb --steps 40
"""

from __future__ import annotations

import argparse
import datetime
import os
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def beat(folder: Path, rank: int, step: int) -> None:
    tmp = folder / f".rank-{rank}.tmp"
    tmp.write_text(str(step))
    os.replace(tmp, folder / f"rank-{rank}")


class PeerWatchdog(threading.Thread):
    """Exits the process (code 3) when a peer's heartbeat has not changed for ``timeout`` seconds."""

    def __init__(self, folder: Path, peers: list[int], timeout: float) -> None:
        super().__init__(daemon=True)
        self.folder, self.peers, self.timeout = folder, peers, timeout

    def run(self) -> None:
        seen: dict[int, tuple[str, float]] = {}  # peer -> (its last step, when it changed)
        while True:
            time.sleep(0.5)
            now = time.monotonic()
            for peer in self.peers:
                try:
                    step = (self.folder / f"rank-{peer}").read_text()
                except OSError:
                    continue  # no heartbeat yet
                if seen.get(peer, ("", 0.0))[0] != step:
                    seen[peer] = (step, now)
                age = now - seen[peer][1]
                if age > self.timeout:
                    print(f"watchdog: rank {peer} silent for {age:.0f}s (limit {self.timeout:.0f}s), aborting", flush=True)
                    os._exit(3)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--heartbeat-dir", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--step-time", type=float, default=0.1)
    parser.add_argument("--stall-timeout", type=float, default=60.0)
    args = parser.parse_args()

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    rank, world = dist.get_rank(), dist.get_world_size()
    args.heartbeat_dir.mkdir(parents=True, exist_ok=True)
    if rank == 0:
        PeerWatchdog(args.heartbeat_dir, list(range(1, world)), args.stall_timeout).start()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(1234)
    for step in range(1, args.steps + 1):
        x, y = torch.randn(8, 16, generator=gen), torch.randn(8, 1, generator=gen)
        loss = nn.functional.mse_loss(model(x[rank::2]), y[rank::2])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        beat(args.heartbeat_dir, rank, step)
        if rank == 0 and step % 10 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
        time.sleep(args.step_time)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
