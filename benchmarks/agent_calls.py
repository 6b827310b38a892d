"""Benchmark: where the in-job agent's time goes, call by call, with nothing injected.

Run: ``.venv/bin/python benchmarks/agent_calls.py [--model reference|user] [--reps 30] [--steps 100]
[--setting consistency_10] [--json]``. The same two gloo ranks, models and settings as ``agent_overhead.py``
(``bare``, ``agent`` and one more, interleaved block by block), but each part of the step is timed on its own:
``begin`` (``agent.begin_step``), ``fwd_bwd`` (batch, forward and backward, so DDP's all-reduce and any comm
hook of the agent's), ``after_backward``, ``allow`` (``allow_optimizer_step``), ``opt`` (``optimizer.step``) and
``end`` (``agent.end_step``: the consistency check's hash and verdict land here). A figure is the median over
the blocks of a part's mean time per step, in microseconds, per rank. Whole-step ratios wobble by several
percent on a shared 2-core machine (``agent_overhead.py`` prints their 95% interval); the agent's own calls,
timed directly, do not, so this says which part costs what. ``--json`` prints one JSON object as the last line.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "benchmarks"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import agent_overhead  # noqa: E402
import shared  # noqa: E402

from chaos.guards._dist import Report, run_group  # noqa: E402

PARTS = ("begin", "fwd_bwd", "after_backward", "allow", "opt", "end")


def _block(setting: agent_overhead._Setting, first_step: int, steps: int) -> dict[str, float]:
    """Mean seconds per step of each part over ``steps`` steps from ``first_step``."""
    rank, world = dist.get_rank(), dist.get_world_size()
    loss_fn = nn.MSELoss()
    agent = setting.agent
    total = dict.fromkeys(PARTS, 0.0)
    dist.barrier()
    for step in range(first_step, first_step + steps):
        t0 = time.perf_counter()
        if agent is not None:
            agent.begin_step(step)
        t1 = time.perf_counter()
        features, labels = setting.batch(step, rank, world)
        setting.optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(setting.ddp(features), labels)
        loss.backward()
        t2 = time.perf_counter()
        if agent is not None:
            agent.after_backward(loss)
        t3 = time.perf_counter()
        allowed = agent.allow_optimizer_step() if agent is not None else True
        t4 = time.perf_counter()
        if allowed:
            setting.optimizer.step()
        t5 = time.perf_counter()
        if agent is not None:
            agent.end_step()
        t6 = time.perf_counter()
        for part, seconds in zip(PARTS, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5), strict=True):
            total[part] += seconds
    return {part: seconds / steps for part, seconds in total.items()}


def _rank(rank: int, world: int, report: Report, model: str, setting: str, reps: int, steps: int) -> dict[str, Any]:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="mlchaos-bench-flight-") as flight_dir:
        settings = [agent_overhead._Setting(name, model, Path(flight_dir)) for name in ("bare", "agent", setting)]
        parts: dict[str, dict[str, list[float]]] = {s.name: {p: [] for p in PARTS} for s in settings}
        step = 1
        for rep in range(reps + 1):  # the first round warms up and is not counted
            shift = rep % len(settings)
            for current in settings[shift:] + settings[:shift]:
                means = _block(current, step, steps)
                step += steps
                if rep:
                    for part, seconds in means.items():
                        parts[current.name][part].append(seconds * 1e6)
            if rank == 0:
                report(f"rep {rep}/{reps}")
        for current in settings:
            if current.agent is not None:
                current.agent.close()
    return {name: {p: statistics.median(values) for p, values in by_part.items()} for name, by_part in parts.items()}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = shared.interleaved_parser(__doc__, reps=30)
    parser.add_argument("--model", choices=["reference", "user"], default="reference")
    others = [name for name in agent_overhead.SETTINGS if name not in ("bare", "agent")]
    parser.add_argument("--setting", choices=others, default="consistency_10")
    args = parser.parse_args(argv)
    ranks = run_group(_rank, 2, args.model, args.setting, args.reps, args.steps, timeout_s=3600)
    print(f"{args.model} model, 2 gloo ranks, medians of {args.reps} blocks of {args.steps} steps, us per step")
    for rank, result in enumerate(ranks):
        for name, by_part in result.items():
            cells = "  ".join(f"{part} {by_part[part]:7.1f}" for part in PARTS)
            agent_us = sum(by_part[p] for p in PARTS if p not in ("fwd_bwd", "opt"))
            print(f"  rank {rank} {name:<26} {cells}  agent calls {agent_us:6.1f}")
    row = {"model": args.model, "setting": args.setting, "reps": args.reps, "steps": args.steps, "us": ranks}
    return shared.json_last(row, args.json)


if __name__ == "__main__":
    main()
