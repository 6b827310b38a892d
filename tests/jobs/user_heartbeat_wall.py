"""A DDP training script with a peer watchdog, as users write one: every rank writes a heartbeat file each step
(its step and the time), and a thread on rank 0 ends the job when a peer's heartbeat is older than
--stall-timeout seconds, so a rank hung in a collective does not hold the nodes for hours. It judges a
heartbeat's age by the WALL time written in it against rank 0's own ``time.time()``: when a machine's clock is
stepped (NTP correcting drift, a VM resumed from a snapshot), a healthy peer looks as stale as the jump and the
watchdog kills the job. ``user_heartbeat_monotonic.py`` times the same heartbeats on rank 0's monotonic clock.
Run it under torchrun::

    torchrun --nproc_per_node 2 tests/jobs/user_heartbeat_wall.py --heartbeat-dir /tmp/hb --steps 40
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
    tmp.write_text(f"{step} {time.time()}")
    os.replace(tmp, folder / f"rank-{rank}")


class PeerWatchdog(threading.Thread):
    """Exits the process (code 3) when a peer's last heartbeat is older than ``timeout`` seconds."""

    def __init__(self, folder: Path, peers: list[int], timeout: float) -> None:
        super().__init__(daemon=True)
        self.folder, self.peers, self.timeout = folder, peers, timeout

    def run(self) -> None:
        while True:
            time.sleep(0.5)
            for peer in self.peers:
                try:
                    _, stamp = (self.folder / f"rank-{peer}").read_text().split()
                except (OSError, ValueError):
                    continue  # no heartbeat yet
                age = time.time() - float(stamp)
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
