"""Launch a job of this folder under torchrun with an in-job plan, as the harness would but without it: for tests
and benchmarks that need many fast launches (or a wrapper such as ``collective_probe.py``) and read the events.

Stdlib only; importable from tests (``from jobs.launch import launch``: ``tests/`` is on the path) and from
benchmarks (which put ``tests/`` on ``sys.path`` first).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def torchrun_argv(workdir: Path, nproc: int, *args: str) -> list[str]:
    """``python -m torch.distributed.run --log-dir WORKDIR/torchelastic --standalone --nproc-per-node NPROC ARGS``:
    a single-machine torchrun whose workers' logs stay in ``workdir``."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--log-dir", str(workdir / "torchelastic")]
    return [*torchrun, "--standalone", "--nproc-per-node", str(nproc), *args]


def with_repo_on_path(env: dict[str, str]) -> dict[str, str]:
    """``env`` with this checkout first on PYTHONPATH (so a job imports this tree's ``chaos``)."""
    return {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))}


def launch(
    workdir: Path,
    job: Sequence[str],
    ops: Sequence[dict[str, Any]] = (),
    *,
    nproc: int = 2,
    launcher: Sequence[str] = ("--max-restarts", "0"),
    timeout_s: float = 180,
    seed: int = 1,
) -> tuple[int | None, list[dict[str, Any]], str]:
    """Run ``torchrun --standalone --nproc-per-node NPROC LAUNCHER JOB`` in a new ``workdir`` with ``ops`` as its
    plan (no plan when empty) and its events in ``workdir/events.jsonl``; returns (exit code, None on timeout;
    the events; torchrun's output). Every process of this launch is gone when it returns."""
    workdir.mkdir(parents=True)
    events = workdir / "events.jsonl"
    env = {k: v for k, v in os.environ.items() if k not in ("CHAOS_PLAN", "CHAOS_RUN_DIR", "RANK", "WORLD_SIZE")}
    env.update(
        CHAOS_EVENTS=str(events),
        TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",
        PYTHONFAULTHANDLER="1",  # a rank that dies in C++ leaves its Python stacks in the log
    )
    env = with_repo_on_path(env)
    if ops:
        (workdir / "plan.json").write_text(json.dumps({"seed": seed, "ops": list(ops)}))
        env["CHAOS_PLAN"] = str(workdir / "plan.json")
    argv = torchrun_argv(workdir, nproc, *launcher, *job)
    with open(workdir / "torchrun.log", "wb") as log:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            kill_leftovers(proc, events)
    lines = events.read_text().splitlines() if events.exists() else []
    return rc, [json.loads(line) for line in lines], (workdir / "torchrun.log").read_text(errors="replace")


def kill_leftovers(proc: subprocess.Popen[bytes], events: Path) -> None:
    """torchrun and any worker of THIS launch (recognised by its CHAOS_EVENTS path) still alive."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    mark = f"CHAOS_EVENTS={events}\0".encode()  # unique to this launch: never kills anyone else's process
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if mark in Path(f"/proc/{entry}/environ").read_bytes():
                os.kill(int(entry), signal.SIGKILL)
        except OSError:
            continue
