"""A tiny job as a Slurm user writes one, one process per task (``srun python3 slurm_steps.py``): it reports
its start and a step every ``--interval`` seconds through ``chaos.events`` (stdlib only; a no-op outside a
chaos run), prints where it runs, and exits 0 after ``--steps`` steps. Torch-free, so a 2-node job starts
in well under a second. A requeued attempt (``SLURM_RESTART_COUNT``) may run fewer steps."""

from __future__ import annotations

import argparse
import os
import socket
import time

from chaos.events import emit


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--steps-after-restart", type=int, default=None, help="steps of a requeued attempt")
    args = parser.parse_args()
    rank = int(os.environ.get("SLURM_PROCID", "0"))
    attempt = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
    emit("target.start", rank=rank, pid=os.getpid(), attempt=attempt)
    print(f"task {rank} on {socket.gethostname()} ({os.environ.get('SLURMD_NODENAME')}), attempt {attempt}", flush=True)
    steps = args.steps if attempt == 0 or args.steps_after_restart is None else args.steps_after_restart
    for step in range(steps):
        time.sleep(args.interval)
        emit("target.step", rank=rank, step=step, attempt=attempt)
    print(f"task {rank} done", flush=True)


if __name__ == "__main__":
    main()
