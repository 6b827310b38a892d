"""Benchmark: what the in-job agent costs a training step with nothing injected, as ratios within one run.

Run: ``.venv/bin/python benchmarks/agent_overhead.py [--model reference|user] [--reps 20] [--steps 100]
[--settings agent,consistency_10] [--json]``.
Two gloo ranks (one intra-op thread each) train the same model under several settings, each with its own copy
of the model, optimizer and DDP wrapper (a DDP model takes one comm hook, and the settings differ in theirs):

- ``bare``: the user's loop with no agent at all (the baseline every ratio is to);
- ``bare_again``: a second, independent copy of ``bare`` (its own model, optimizer and DDP): an A/A control. Its
  ratio to ``bare`` is what the method reads for two identical loops, i.e. how far from 1.0 a ratio can land
  with no cost at all;
- ``agent``: ``Agent`` attached, no faults armed, every guard off (``consistency_every=0``);
- ``consistency_10``: the agent with the cross-rank consistency hash every 10 steps (the default in a job of
  more than one rank), its digest through the guard's own 64-byte all-reduce; DDP keeps its default reduction
  (until 2026-11-27 a comm hook of the carrier's carried it, at a higher cost: ``chaos.guards.digest_carrier``);
- ``recorder``: the agent with the collective flight recorder on (what a scenario's ``hang_watch`` turns on:
  the agent then routes DDP's all-reduce through a Python comm hook the recorder sees);
- ``recorder_consistency_10``: both (a hang-watched run's default; the digest rides in the recorder's hook);
- ``recorder_consistency_10_separate``: both, the digest through the guard's own all-reduce;
- ``checksum``: the agent with the checksummed gradient all-reduce (``guard="checksum"``).

``--model reference`` is the reference trainer's step (its MLP, SGD with momentum and data, without the per-step
sleep); ``--model user`` the user-style script ``tests/jobs/user_ddp_adam.py``'s (a wider MLP under Adam).
The settings run interleaved block by block, the order rotating each repetition, so drift on a shared machine
hits all alike; a ratio is the median of the per-repetition ratios to ``bare``, of the wall time per step
(``ratio_*``) and of rank 0's process CPU time per step, all its threads (``cpu_ratio_*``: what the agent costs
in CPU, gloo's threads included, less moved by other work on a shared machine than the wall time). The recorder's module-level
switch is flipped per block (it wraps ``torch.distributed``'s functions process-wide), so blocks without it
run the real functions. Events are dropped (``emit`` is a no-op): the cost of writing the event file is the
harness's choice of sink, not the agent's. ``--json`` prints one JSON object as the last line; ``ci95_ratio_*``
is a seeded bootstrap 95% interval of each wall-time median (how far the figure could move on a like run).
``--settings`` picks the ones compared with ``bare`` (fewer settings: more repetitions in the same time).
"""

from __future__ import annotations

import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
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
from chaos.guards.consistency import ConsistencyGuard  # noqa: E402
from chaos.injob import flight_recorder  # noqa: E402
from chaos.plan.agent_plan import InJobPlan  # noqa: E402
from chaos.reference.trainer import build_model, build_optimizer, make_batch, step_sample_ids  # noqa: E402

SEED = 1234
BATCH = 16
SETTINGS = (
    "bare",
    "bare_again",
    "agent",
    "consistency_10",
    "recorder",
    "recorder_consistency_10",
    "recorder_consistency_10_separate",
    "checksum",
)
Batch = Callable[[int, int, int], tuple[torch.Tensor, torch.Tensor]]


def _quiet(kind: str, **data: Any) -> None:
    """An emit that drops events."""


def _reference() -> tuple[nn.Module, torch.optim.Optimizer, Batch]:
    model = build_model(SEED)

    def batch(step: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
        return make_batch(SEED, step_sample_ids(step, rank, BATCH, world))

    return model, build_optimizer(model, 0.05), batch


def _user() -> tuple[nn.Module, torch.optim.Optimizer, Batch]:
    """tests/jobs/user_ddp_adam.py's model, optimizer and data."""
    torch.manual_seed(SEED)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))

    def batch(step: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
        data = torch.Generator().manual_seed(SEED * 1_000_003 + step * world + rank)
        x = torch.randn(BATCH, 8, generator=data)
        return x, torch.sin(x[:, :4]) + 0.1 * torch.randn(BATCH, 4, generator=data)

    return model, torch.optim.Adam(model.parameters(), lr=1e-3), batch


class _Setting:
    """One setting's own model, optimizer, DDP and (but for ``bare``) agent."""

    def __init__(self, name: str, model_name: str, flight_dir: Path) -> None:
        self.name = name
        self.model, self.optimizer, self.batch = _reference() if model_name == "reference" else _user()
        self.ddp = DistributedDataParallel(self.model)
        self.recorder: flight_recorder.Recorder | None = None
        self.agent: Agent | None = None
        if name in ("bare", "bare_again"):
            return
        if name.startswith("recorder"):
            self.recorder = flight_recorder.install(dist.get_rank(), dist.get_world_size(), str(flight_dir))
        flight_recorder._ACTIVE = self.recorder  # noqa: SLF001 - the per-block switch (see the docstring)
        self.agent = Agent(
            self.model,
            optimizer=self.optimizer,
            ddp=self.ddp,
            guard="checksum" if name == "checksum" else "none",
            consistency_every=10 if name.endswith("consistency_10") else 0,
            plan=InJobPlan(),
            emit=_quiet,
        )
        if name.endswith("_separate"):  # the guard without the carrier in the recorder's hook: its own all-reduce
            self.agent.consistency = ConsistencyGuard(self.model, optimizer=self.optimizer, every=10, emit=_quiet)
        flight_recorder._ACTIVE = None  # noqa: SLF001

    def block(self, first_step: int, steps: int) -> tuple[float, float]:
        """Wall seconds and this process's CPU seconds (all its threads, gloo's included) per step over
        ``steps`` steps from ``first_step``."""
        flight_recorder._ACTIVE = self.recorder  # noqa: SLF001
        rank, world = dist.get_rank(), dist.get_world_size()
        loss_fn = nn.MSELoss()
        agent = self.agent
        dist.barrier()
        start, cpu = time.perf_counter(), time.process_time()
        for step in range(first_step, first_step + steps):
            if agent is not None:
                agent.begin_step(step)
            features, labels = self.batch(step, rank, world)
            self.optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(self.ddp(features), labels)
            loss.backward()
            if agent is None:
                self.optimizer.step()
                continue
            agent.after_backward(loss)
            if agent.allow_optimizer_step():
                self.optimizer.step()
            agent.end_step()
        elapsed = (time.perf_counter() - start) / steps
        used = (time.process_time() - cpu) / steps
        flight_recorder._ACTIVE = None  # noqa: SLF001
        return elapsed, used


def _ci95(ratios: list[float], seed: int = 0, draws: int = 2000) -> tuple[float, float]:
    """A bootstrap 95% interval of the median of ``ratios`` (percentile method, seeded: the same figures give the
    same interval): how far the reported ratio could move on another run like this one."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(draws))
    return medians[int(0.025 * draws)], medians[int(0.975 * draws) - 1]


def _rank(
    rank: int, world: int, report: Report, model_name: str, reps: int, steps: int, names: tuple[str, ...]
) -> dict[str, Any]:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="mlchaos-bench-flight-") as flight_dir:
        settings = [_Setting(name, model_name, Path(flight_dir)) for name in names]
        step = 1
        for setting in settings:  # warm-up: allocations, DDP's bucket rebuild, guards' scratch buffers
            setting.block(step, steps)
            step += steps
        times: dict[str, list[float]] = {s.name: [] for s in settings}
        cpu: dict[str, list[float]] = {s.name: [] for s in settings}
        for rep in range(reps):
            shift = rep % len(settings)
            for setting in settings[shift:] + settings[:shift]:
                wall, used = setting.block(step, steps)
                times[setting.name].append(wall)
                cpu[setting.name].append(used)
                step += steps
            if rank == 0:
                report(f"rep {rep + 1}/{reps}")
        exchanges: dict[str, dict[str, int]] = {}
        for setting in settings:
            if setting.agent is not None:
                flight_recorder._ACTIVE = setting.recorder  # noqa: SLF001 - close takes the last verdict
                setting.agent.close()
                if setting.agent.consistency is not None:
                    exchanges[setting.name] = dict(setting.agent.consistency.exchanges)
        flight_recorder.uninstall()
    bare, bare_cpu = times["bare"], cpu["bare"]
    ratios = {name: [t / b for t, b in zip(times[name], bare, strict=True)] for name in names[1:]}
    return {
        "model": model_name,
        "params": sum(p.numel() for p in settings[0].model.parameters()),
        "step_ms": {name: statistics.median(values) * 1e3 for name, values in times.items()},
        **{f"ratio_{name}": statistics.median(ratios[name]) for name in names[1:]},
        **{f"ci95_ratio_{name}": list(_ci95(ratios[name])) for name in names[1:]},
        "cpu_ms": {name: statistics.median(values) * 1e3 for name, values in cpu.items()},
        **{
            f"cpu_ratio_{name}": statistics.median(t / b for t, b in zip(cpu[name], bare_cpu, strict=True))
            for name in names[1:]
        },
        "exchanges": exchanges,
        "reps": reps,
        "steps_per_block": steps,
        "world": world,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = shared.interleaved_parser(__doc__, reps=20)
    parser.add_argument("--model", choices=["reference", "user"], default="reference")
    parser.add_argument(
        "--settings",
        default=",".join(SETTINGS[1:]),
        help="comma-separated settings to compare with bare (default: all); fewer settings, more repetitions each",
    )
    args = parser.parse_args(argv)
    chosen = [name for name in args.settings.split(",") if name]
    unknown = sorted(set(chosen) - set(SETTINGS[1:]))
    if unknown:
        parser.error(f"unknown setting(s) {', '.join(unknown)}; choose from {', '.join(SETTINGS[1:])}")
    names = ("bare", *(name for name in SETTINGS[1:] if name in chosen))
    row: dict[str, Any] = run_group(_rank, 2, args.model, args.reps, args.steps, names, timeout_s=3600)[0]
    _print_table(row, names)
    return shared.json_last(row, args.json)


def _print_table(row: dict[str, Any], names: tuple[str, ...]) -> None:
    """The figures of ``row`` (rank 0's row from :func:`_rank`), one line per setting of ``names`` (bare first)."""
    ms, cpu = row["step_ms"], row["cpu_ms"]
    print(
        f"{row['model']} model ({row['params']} params), 2 gloo ranks, 1 thread each; medians of {row['reps']} "
        f"interleaved blocks of {row['steps_per_block']} steps; ratio = median of per-block ratios to bare"
    )
    print(f"  {'bare':<34} {ms['bare']:7.3f} ms/step            CPU {cpu['bare']:7.3f} ms/step (rank 0's process)")
    for name in names[1:]:
        low, high = row[f"ci95_ratio_{name}"]
        print(
            f"  {name:<34} {ms[name]:7.3f} ms/step   {row[f'ratio_{name}']:.4f}x [{low:.4f}, {high:.4f}]   "
            f"CPU {cpu[name]:7.3f} ms/step   {row[f'cpu_ratio_{name}']:.4f}x"
        )
    print(f"  verdicts by exchange: {row['exchanges']}")


if __name__ == "__main__":
    main()
