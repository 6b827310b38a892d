"""Benchmark: checksummed all-reduce against a plain ``dist.all_reduce``, 2 gloo ranks, as ratios in one run.

Run: ``.venv/bin/python benchmarks/checksum_allreduce.py`` (``make bench`` runs it too). For 1, 25 and 100 MB of
float32 it times, interleaved rep by rep so drift hits both alike, a plain SUM all-reduce and
``checksummed_all_reduce`` with a long-lived state (its intact-copy buffer is reused, as a training loop would),
and prints medians and their ratio. Also printed, as the floor the issue names: one extra read of the buffer
(a float32 sum) relative to the plain all-reduce, and a breakdown of the guard's own passes.
Each rank runs one intra-op thread (the two ranks share the machine's cores).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from chaos.guards._dist import Report, run_group  # noqa: E402
from chaos.guards.checksum import ChecksumState, checksummed_all_reduce, guarded_reduce  # noqa: E402
from chaos.guards.rounding import block_sums, sums_and_lower_bounds  # noqa: E402

SIZES_MB = (1, 25, 100)


def _timed(fn: Any, k: int) -> float:
    """Seconds per call over ``k`` back-to-back calls: the ranks leave a barrier at slightly different
    moments, and a loop spreads that skew over k calls instead of charging it to one."""
    dist.barrier()
    start = time.perf_counter()
    for _ in range(k):
        fn()
    return (time.perf_counter() - start) / k


def _solo(fn: Any, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _rank(rank: int, world: int, report: Report, sizes: tuple[float, ...], reps: int) -> list[dict[str, float]]:
    state = ChecksumState()
    rows = []
    for mb in sizes:
        rows.append(_measure(rank, world, state, mb, reps))
        if rank == 0:
            report(f"{mb:g} MB done")
    assert state.stats.mismatches == 0, "a clean benchmark reduction was flagged"
    return rows


def _measure(rank: int, world: int, state: ChecksumState, mb: float, reps: int) -> dict[str, float]:
    n = int(mb * 2**20) // 4
    base = torch.randn(n, generator=torch.Generator().manual_seed(rank)) * 1e-3
    work = base.clone()
    send = state.buffer("bench-send", work)
    scale = 1.0 / world

    def default_hook() -> None:  # DDP's Python default hook: divide in place, then all-reduce
        work.div_(world)
        dist.all_reduce(work)

    def checksum_hook_core() -> None:  # what checksum_hook does with a bucket
        torch.mul(work, scale, out=send)
        guarded_reduce(state, 0, send, work, scale)

    variants = {
        "plain": lambda: dist.all_reduce(work),
        "checksummed": lambda: checksummed_all_reduce(work, state=state),
        "default_hook": default_hook,
        "checksum_hook": checksum_hook_core,
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    k = 8 if mb <= 4 else 3
    for rep in range(reps + 2):
        for name, fn in variants.items():
            # Repeated in-place sums double the values; k calls from fresh data stay far from overflow.
            work.copy_(base)
            elapsed = _timed(fn, k)
            if rep >= 2:  # the first reps allocate buffers and warm caches
                times[name].append(elapsed)
    layout = state.config.layout(n, work.dtype)
    row = {"mb": float(mb)}
    for name, values in times.items():
        row[f"{name}_ms"] = statistics.median(values) * 1e3
    # Medians of per-rep ratios: each compares two measurements taken moments apart, which cancels the drift
    # (other tenants, CPU frequency) that dominates absolute times on a small shared machine.
    row["ratio"] = statistics.median(g / p for g, p in zip(times["checksummed"], times["plain"], strict=True))
    row["hook_ratio"] = statistics.median(
        g / p for g, p in zip(times["checksum_hook"], times["default_hook"], strict=True)
    )
    row["read_ms"] = _solo(lambda: work.sum(), reps) * 1e3
    row["copy_ms"] = _solo(lambda: send.copy_(work), reps) * 1e3
    row["declare_ms"] = _solo(lambda: sums_and_lower_bounds(work, layout), reps) * 1e3
    row["verify_ms"] = _solo(lambda: block_sums(work, layout), reps) * 1e3
    return row


def main(sizes: tuple[float, ...] = SIZES_MB, reps: int = 15) -> list[dict[str, float]]:
    """Run the benchmark, print a table and return rank 0's rows (milliseconds, medians)."""
    rows: list[dict[str, float]] = run_group(_rank, 2, sizes, reps, timeout_s=900)[0]
    print("float32, 2 gloo ranks on this machine, 1 intra-op thread each; medians, ratios = median of per-rep ratios")
    print(
        f"{'size':>6} | {'plain':>8} {'checksummed':>11} {'ratio':>6} | {'DDP default hook':>16} {'checksum_hook':>13}"
        f" {'ratio':>6} | {'floor':>6} | guard passes alone: copy, declare, verify"
    )
    for r in rows:
        floor = 1 + r["read_ms"] / r["plain_ms"]
        print(
            f"{r['mb']:4g}MB | {r['plain_ms']:6.2f}ms {r['checksummed_ms']:9.2f}ms {r['ratio']:5.2f}x |"
            f" {r['default_hook_ms']:14.2f}ms {r['checksum_hook_ms']:11.2f}ms {r['hook_ratio']:5.2f}x |"
            f" {floor:5.2f}x | {r['copy_ms']:.2f} / {r['declare_ms']:.2f} / {r['verify_ms']:.2f} ms"
        )
    print("floor = 1 + one extra read of the buffer (a float32 sum) relative to the plain all-reduce")
    return rows


if __name__ == "__main__":
    main()
