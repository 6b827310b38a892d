"""A DDP training script with a peer watchdog, as users write one: every rank writes a heartbeat file each step
(its step and the wall time), and a thread on rank 0 ends the job when a peer has looked silent for more than
--stall-timeout seconds, so a rank hung in a collective does not hold the nodes for hours. ``--watchdog-clock``
is how it times that silence:

- ``monotonic`` (the default): since rank 0 last saw the peer's step change, on rank 0's own ``time.monotonic()``,
  which no step of the wall clock moves (NTP correcting drift, a VM resumed from a snapshot): it rides such a
  jump out;
- ``wall``: by the WALL time written in the heartbeat against rank 0's own ``time.time()``: when a machine's
  clock is stepped, a healthy peer looks as stale as the jump and the watchdog kills the job.

Run it under torchrun::

    torchrun --nproc_per_node 2 tests/jobs/user_heartbeat.py --heartbeat-dir /tmp/hb --steps 40
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
    """Exits the process (code 3) when a peer has looked silent for more than ``timeout`` seconds on ``clock``."""

    def __init__(self, folder: Path, peers: list[int], timeout: float, clock: str) -> None:
        super().__init__(daemon=True)
        self.folder, self.peers, self.timeout, self.clock = folder, peers, timeout, clock

    def run(self) -> None:
        seen: dict[int, tuple[str, float]] = {}  # peer -> (its last step, when it changed on rank 0's monotonic clock)
        while True:
            time.sleep(0.5)
            now = time.monotonic()
            for peer in self.peers:
                try:
                    step, stamp = (self.folder / f"rank-{peer}").read_text().split()
                except (OSError, ValueError):
                    continue  # no heartbeat yet
                if seen.get(peer, ("", 0.0))[0] != step:
                    seen[peer] = (step, now)
                age = time.time() - float(stamp) if self.clock == "wall" else now - seen[peer][1]
                if age > self.timeout:
                    print(
                        f"watchdog: rank {peer} silent for {age:.0f}s (limit {self.timeout:.0f}s), aborting", flush=True
                    )
                    os._exit(3)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--heartbeat-dir", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--step-time", type=float, default=0.1)
    parser.add_argument("--stall-timeout", type=float, default=60.0)
    parser.add_argument("--watchdog-clock", choices=["monotonic", "wall"], default="monotonic")
    args = parser.parse_args()

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    rank, world = dist.get_rank(), dist.get_world_size()
    args.heartbeat_dir.mkdir(parents=True, exist_ok=True)
    if rank == 0:
        PeerWatchdog(args.heartbeat_dir, list(range(1, world)), args.stall_timeout, args.watchdog_clock).start()
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
