"""Benchmark: what the cross-rank consistency guard costs per training step, as ratios within one run.

Run: ``.venv/bin/python benchmarks/consistency_guard.py [--reps 15] [--steps 100] [--hidden 64] [--json]``. Two gloo ranks
(one intra-op thread each) run the reference trainer's step (its model, SGD-momentum optimizer, data and DDP,
``chaos.reference.trainer``, without its per-step sleep) through the in-job agent, in blocks of
``--steps`` steps with the guard off, every 10 steps and every step (``--hidden`` widens the MLP, for a
heavier step than the reference trainer's 5k parameters). The three settings are interleaved block
by block (the order rotates each repetition), so drift on a shared machine hits all three alike; the overhead
is the median of the per-repetition ratios to "off" (and the ratio of the median step times). Also measured,
alone: one synchronous check (hash + the all-reduce), the local hash, the bare all-reduce, and a pipelined check
as the agent runs it (hash and start the exchange, then, a step later, take the verdict that has arrived), and
from that the modelled overhead at every 10 steps (pipelined check / 10 / step time): steadier than the
difference of two step times on a shared machine, but blind to the exchange's thread competing for the cores.
``--json`` prints one JSON object as the last line.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import shared  # noqa: E402

from chaos.agent import Agent  # noqa: E402
from chaos.guards._dist import Report, run_group  # noqa: E402
from chaos.plan.agent_plan import InJobPlan  # noqa: E402
from chaos.reference.trainer import (  # noqa: E402
    HIDDEN,
    IN_FEATURES,
    build_model,
    build_optimizer,
    make_batch,
    step_sample_ids,
)

SEED = 1234
BATCH = 16  # the reference trainer's default --batch-size
SETTINGS = (0, 10, 1)  # consistency_every: off, every 10 steps, every step


def _quiet(kind: str, **data: Any) -> None:
    """An emit that drops events: the benchmark measures the guard, not the event file."""


def _model(hidden: int) -> nn.Module:
    """The reference trainer's MLP (16 -> H -> H -> 1); ``hidden`` other than its 64 gives a heavier step."""
    if hidden == HIDDEN:
        return build_model(SEED)
    torch.manual_seed(SEED)
    return nn.Sequential(
        nn.Linear(IN_FEATURES, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, 1)
    )


def _rank(rank: int, world: int, report: Report, reps: int, steps: int, hidden: int) -> dict[str, Any]:
    model = _model(hidden)
    # The trainer's lr 0.05 sends a wider MLP to NaN within steps, and non-finite weights take the guard's
    # slow path at every check: scale the lr down with the width.
    optimizer = build_optimizer(model, 0.05 * min(1.0, HIDDEN / hidden))
    ddp = DistributedDataParallel(model)
    agents = {
        every: Agent(model, optimizer=optimizer, ddp=ddp, consistency_every=every, plan=InJobPlan(), emit=_quiet)
        for every in SETTINGS
    }
    step = 0

    def block(agent: Agent) -> float:
        nonlocal step
        dist.barrier()
        start = time.perf_counter()
        for _ in range(steps):
            step += 1
            agent.begin_step(step)
            features, labels = make_batch(SEED, step_sample_ids(step, rank, BATCH, world))
            optimizer.zero_grad(set_to_none=True)
            loss = nn.functional.mse_loss(ddp(features), labels)
            loss.backward()
            agent.after_backward(loss)
            if agent.allow_optimizer_step():
                optimizer.step()
            agent.end_step()
        return (time.perf_counter() - start) / steps

    for every in SETTINGS:  # warm-up: allocations, DDP's bucket rebuild, the guard's scratch buffers
        block(agents[every])
    times: dict[int, list[float]] = {every: [] for every in SETTINGS}
    for rep in range(reps):
        order = SETTINGS[rep % len(SETTINGS) :] + SETTINGS[: rep % len(SETTINGS)]
        for every in order:
            times[every].append(block(agents[every]))
        if rank == 0:
            report(f"rep {rep + 1}/{reps}")

    guard = agents[10].consistency
    assert guard is not None
    named = guard.tensors()
    check_s = shared.median_seconds(lambda: guard.check(step), 200)
    # What a pipelined check costs the step: hash + start the exchange, and later take the verdict that has
    # arrived meanwhile (the 5 ms in between stand for the next step and are not counted).
    start_s, finish_s = [], []
    for _ in range(200):
        began = time.perf_counter()
        guard.start(step)
        start_s.append(time.perf_counter() - began)
        time.sleep(0.005)
        began = time.perf_counter()
        guard.finish()
        finish_s.append(time.perf_counter() - began)
    pipelined_s = statistics.median(start_s) + statistics.median(finish_s)
    last = guard.last
    # A benchmark of the common case: every check must have agreed on finite parameters.
    assert last is not None and last.agree and not last.nonfinite_ranks, last
    hash_s = shared.median_seconds(lambda: [guard.sums.sums(t) for _, t in named], 200)
    probe = torch.zeros(8, dtype=torch.int64)
    reduce_s = shared.median_seconds(lambda: dist.all_reduce(probe, op=dist.ReduceOp.MAX), 200)
    off = times[0]
    step_s = statistics.median(off)
    return {
        "step_ms": {str(e): statistics.median(v) * 1e3 for e, v in times.items()},
        "ratio_every_10": statistics.median(a / b for a, b in zip(times[10], off, strict=True)),
        "ratio_every_1": statistics.median(a / b for a, b in zip(times[1], off, strict=True)),
        "ratio_of_medians_every_10": statistics.median(times[10]) / step_s,
        "ratio_of_medians_every_1": statistics.median(times[1]) / step_s,
        "check_ms": check_s * 1e3,
        "pipelined_check_ms": pipelined_s * 1e3,
        "hash_ms": hash_s * 1e3,
        "all_reduce_ms": reduce_s * 1e3,
        "modelled_overhead_every_10": pipelined_s / 10 / step_s,
        "params": sum(t.numel() for _, t in named),
        "tensors": len(named),
        "reps": reps,
        "steps_per_block": steps,
        "world": world,
        "hidden": hidden,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = shared.parser(__doc__)
    parser.add_argument("--reps", type=int, default=15, help="interleaved repetitions (default 15)")
    parser.add_argument("--steps", type=int, default=100, help="steps per block (default 100)")
    parser.add_argument(
        "--hidden", type=int, default=HIDDEN, help=f"MLP width (default {HIDDEN}, the reference trainer's)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = parser.parse_args(argv)
    row: dict[str, Any] = run_group(_rank, 2, args.reps, args.steps, args.hidden, timeout_s=1800)[0]
    ms = row["step_ms"]
    print(
        f"reference trainer step (hidden {row['hidden']}), 2 gloo ranks, 1 thread each, {row['params']} params in {row['tensors']} tensors; "
        f"medians of {row['reps']} interleaved blocks of {row['steps_per_block']} steps"
    )
    print(f"  guard off        {ms['0']:7.3f} ms/step")
    for key, label in (("10", "every 10 steps"), ("1", "every step")):
        print(
            f"  {label:<16} {ms[key]:7.3f} ms/step   median of ratios {row[f'ratio_every_{key}']:.4f},"
            f" ratio of medians {row[f'ratio_of_medians_every_{key}']:.4f}"
        )
    print(
        f"  one check, synchronous {row['check_ms']:.3f} ms (local hash {row['hash_ms']:.3f} ms, bare all-reduce "
        f"{row['all_reduce_ms']:.3f} ms); pipelined, as the agent runs it: {row['pipelined_check_ms']:.3f} ms"
    )
    print(f"  modelled overhead at every 10 (pipelined check / 10 / step): {row['modelled_overhead_every_10']:.2%}")
    return shared.json_last(row, args.json)


if __name__ == "__main__":
    main()
