"""Launch torchft replica groups of a job of this folder with an in-job plan, as a roles target would but without
the harness: a torchft lighthouse, then one ``torchrun --standalone --nproc-per-node 1`` per group, each with
``REPLICA_GROUP_ID``, ``CHAOS_REPLICA=group.<i>`` and its own event file ``events-group.<i>.jsonl``.

Stdlib only; importable from tests (``from jobs.launch_torchft import launch_groups``).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobs.launch import ROOT, kill_leftovers, torchrun_argv, with_repo_on_path

LIGHTHOUSE = Path(sys.executable).parent / "torchft_lighthouse"


@dataclass
class GroupRun:
    """One replica group's exit code (None: killed at the deadline), events and output."""

    code: int | None
    events: list[dict[str, Any]]
    log: str


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, 9)
        proc.wait(timeout=30)


def launch_groups(
    workdir: Path,
    job: Sequence[str],
    ops: Sequence[dict[str, Any]] = (),
    *,
    groups: int = 2,
    min_replicas: int = 1,
    timeout_s: float = 240,
    seed: int = 1,
) -> list[GroupRun]:
    """Run ``groups`` replica groups of ``job`` against a fresh lighthouse (``min_replicas``, 5 s heartbeat
    timeout) with ``ops`` as the plan; returns each group's run. Every process started here is gone on return."""
    workdir.mkdir(parents=True)
    port = _free_port()
    lighthouse_argv = [
        str(LIGHTHOUSE),
        "--min_replicas",
        str(min_replicas),
        "--quorum_tick_ms",
        "100",
        "--join_timeout_ms",
        "2000",
        "--heartbeat_timeout_ms",
        "5000",
        "--bind",
        f"[::]:{port}",
    ]
    # Not TORCH_DISABLE_SHARE_RDZV_TCP_STORE: torchft's Manager connects to the store torchrun shares at MASTER_PORT.
    unset = ("CHAOS_PLAN", "CHAOS_RUN_DIR", "RANK", "WORLD_SIZE", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE")
    base = {k: v for k, v in os.environ.items() if k not in unset}
    base.update(
        TORCHFT_LIGHTHOUSE=f"http://localhost:{port}",
        NUM_REPLICA_GROUPS=str(groups),
        CHAOS_RUN_DIR=str(workdir),
    )
    base = with_repo_on_path(base)
    if ops:
        (workdir / "plan.json").write_text(json.dumps({"seed": seed, "ops": list(ops)}))
        base["CHAOS_PLAN"] = str(workdir / "plan.json")
    with open(workdir / "lighthouse.log", "wb") as log:
        lighthouse = subprocess.Popen(lighthouse_argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    procs: list[tuple[subprocess.Popen[bytes], Path]] = []
    try:
        for index in range(groups):
            name = f"group.{index}"
            events = workdir / f"events-{name}.jsonl"
            env = {**base, "REPLICA_GROUP_ID": str(index), "CHAOS_REPLICA": name, "CHAOS_EVENTS": str(events)}
            argv = torchrun_argv(workdir, 1, "--max-restarts", "0", *job)
            with open(workdir / f"{name}.log", "wb") as log:
                proc = subprocess.Popen(
                    argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )
            procs.append((proc, events))
        deadline = time.monotonic() + timeout_s
        codes: list[int | None] = []
        for proc, _ in procs:
            try:
                codes.append(proc.wait(timeout=max(deadline - time.monotonic(), 1)))
            except subprocess.TimeoutExpired:
                codes.append(None)
    finally:
        for proc, events in procs:
            kill_leftovers(proc, events)
        _stop(lighthouse)
    runs = []
    for index, ((_, events), code) in enumerate(zip(procs, codes, strict=True)):
        lines = events.read_text().splitlines() if events.exists() else []
        log_text = (workdir / f"group.{index}.log").read_text(errors="replace")
        runs.append(GroupRun(code, [json.loads(line) for line in lines], log_text))
    return runs
