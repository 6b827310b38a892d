"""The training job of ``benchmarks/ettr_slurm.py``: a stdlib-only loop that trains for a fixed amount of
work, checkpoints every K steps and resumes from its last checkpoint when Slurm requeues it.

A step is a fixed ``--step`` seconds of sleep standing for compute (ETTR is about where wall time goes, not
what is computed; a sleep keeps step time steady on a shared 2-core machine). A checkpoint stalls training for
``--write`` seconds and then writes the step number durably (temp file, fsync, rename), so a kill at any
moment leaves the previous checkpoint intact. It reports to the harness the way any job does, one JSON
event per line appended to ``$CHAOS_EVENTS`` (the format of :mod:`chaos.events`, copied: stdlib only):
``target.start`` {attempt, pid}, ``target.resume`` {step, attempt} after loading a checkpoint,
``target.step`` {step, attempt}, ``target.checkpoint`` {step, duration_s, attempt}, ``target.digest`` at the
end. ``attempt`` is Slurm's ``SLURM_RESTART_COUNT``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def emit(kind: str, **data: object) -> None:
    path = os.environ.get("CHAOS_EVENTS")
    if not path:
        return
    record = {"ts_ns": time.time_ns(), "kind": kind, "source": "target", "rank": 0, "data": data}
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record, separators=(",", ":")) + "\n").encode())
    finally:
        os.close(fd)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", type=Path, required=True, help="checkpoint folder")
    parser.add_argument("--steps", type=int, required=True, help="steps of work in the whole job")
    parser.add_argument("--step", type=float, required=True, help="seconds of one step")
    parser.add_argument("--every", type=int, required=True, help="checkpoint every this many steps")
    parser.add_argument("--write", type=float, required=True, help="seconds one checkpoint write stalls training")
    parser.add_argument("--tag", default="", help="ignored: marks the command line so a fault can find it")
    args = parser.parse_args()
    attempt = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    emit("target.start", attempt=attempt, pid=os.getpid(), node=os.environ.get("SLURMD_NODENAME"))
    ckpt = args.dir / "checkpoint.json"
    start = 0
    if ckpt.exists():
        start = int(json.loads(ckpt.read_text())["step"])
        emit("target.resume", step=start, attempt=attempt)
    for step in range(start + 1, args.steps + 1):
        time.sleep(args.step)
        emit("target.step", step=step, attempt=attempt)
        if step % args.every == 0 and step < args.steps:
            began = time.monotonic()
            time.sleep(args.write)
            tmp = args.dir / "checkpoint.json.tmp"
            with open(tmp, "w") as handle:
                handle.write(json.dumps({"step": step}))
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, ckpt)
            emit("target.checkpoint", step=step, attempt=attempt, duration_s=round(time.monotonic() - began, 6))
    emit("target.digest", step=args.steps, attempt=attempt)


if __name__ == "__main__":
    main()
