"""Benchmark: checksummed all-reduce against a plain ``dist.all_reduce``, 2 gloo ranks, as ratios in one run.

Run: ``.venv/bin/python benchmarks/checksum_allreduce.py [--json] [--sizes 1,25,100] [--reps 15]`` (``make bench``
runs it too). For each size of float32 it times, interleaved rep by rep so drift hits every variant alike:

- ``plain`` (a SUM all-reduce) against ``checksummed`` (:func:`checksummed_all_reduce` with a long-lived state:
  intact copy, checksums in a second collective), ``checksummed_carried`` (``carry_checksums=True``: checksums
  appended, one collective, result copied back), ``checksummed_every4`` (``verify_every=4``: one reduction
  in four verified; 4 calls per timing) and ``checksummed_nocopy`` (``policy="skip", localize=False``: nothing
  is redone or localized, so no intact copy; every block's exact bound declared up front);
- ``default_hook`` (DDP's Python default hook: divide in place, all-reduce) against ``checksum_hook`` (what
  :func:`checksum_hook` does with a bucket under DDP's default ``gradient_as_bucket_view=False``:
  :func:`average_bucket` with the local gradients to rebuild from, so the bucket is averaged in place and the
  checksums take a concurrent collective), ``checksum_hook_copy`` (the path for ``gradient_as_bucket_view=True``:
  the bucket kept intact, the average built in a send buffer with the checksums appended, one collective) and
  ``checksum_hook_every4``;

and prints medians and paired ratios. Then, each alone: one extra read of the buffer (the floor the issue
names), the guard's own passes (the scaling copy, declare, verify), a tiny all-reduce (the verdict) and the
all-reduce of the bucket with its appended checksums, as the breakdown of where the time goes. ``--json``
prints one JSON object of the figures as the last line (``hook_ratio_25mb``, ``standalone_ratio_25mb``, ...;
``every4_coverage``: the share of reductions the sampled variants verify, measured from their counters).
``--phases``: instead, the DDP hook's phases timed in place (its own functions wrapped with timers), against
the default hook's division and all-reduce, call by call after a barrier. Each rank runs one intra-op thread
(the two ranks share the machine's cores).
"""

from __future__ import annotations

import functools
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import shared  # noqa: E402

from chaos.guards import checksum  # noqa: E402
from chaos.guards._dist import Report, run_group  # noqa: E402
from chaos.guards.checksum import ChecksumConfig, ChecksumState, average_bucket, checksummed_all_reduce  # noqa: E402
from chaos.guards.rounding import block_sums, sums_and_lower_bounds  # noqa: E402

SIZES_MB = (1, 25, 100)
EVERY = 4


def _timed(fn: Callable[[], Any], k: int) -> float:
    """Seconds per call over ``k`` back-to-back calls: the ranks leave a barrier at slightly different
    moments, and a loop spreads that skew over k calls instead of charging it to one."""
    dist.barrier()
    start = time.perf_counter()
    for _ in range(k):
        fn()
    return (time.perf_counter() - start) / k


def _rank(rank: int, world: int, report: Report, sizes: tuple[float, ...], reps: int) -> list[dict[str, float]]:
    states = {
        "default": ChecksumState(ChecksumConfig()),
        "carry": ChecksumState(ChecksumConfig(carry_checksums=True)),
        "every4": ChecksumState(ChecksumConfig(verify_every=EVERY)),
        "nocopy": ChecksumState(ChecksumConfig(policy="skip", localize=False)),
    }
    rows = []
    for mb in sizes:
        rows.append(_measure(rank, world, states, mb, reps))
        if rank == 0:
            report(f"{mb:g} MB done")
    assert all(s.stats.mismatches == 0 for s in states.values()), "a clean benchmark reduction was flagged"
    sampled = states["every4"].stats
    for row in rows:
        row["every4_verified_share"] = sampled.buckets_checked / (
            sampled.buckets_checked + sampled.unverified_reductions
        )
    return rows


def _measure(rank: int, world: int, states: dict[str, ChecksumState], mb: float, reps: int) -> dict[str, float]:
    n = int(mb * 2**20) // 4
    base = torch.randn(n, generator=torch.Generator().manual_seed(rank)) * 1e-3
    work = base.clone()
    scale = 1.0 / world

    def default_hook() -> None:  # DDP's Python default hook: divide in place, then all-reduce
        work.div_(world)
        dist.all_reduce(work)

    def local(out: torch.Tensor) -> None:  # the parameters' .grad, for a retry (never needed on clean data)
        out.copy_(base)

    def hook(state: ChecksumState, in_place: bool = True) -> Callable[[], Any]:
        return lambda: average_bucket(state, 0, work, local if in_place else None)

    def standalone(state: ChecksumState) -> Callable[[], Any]:
        return lambda: checksummed_all_reduce(work, state=state)

    variants: dict[str, Callable[[], Any]] = {
        "plain": lambda: dist.all_reduce(work),
        "checksummed": standalone(states["default"]),
        "checksummed_carried": standalone(states["carry"]),
        "checksummed_every4": standalone(states["every4"]),
        "checksummed_nocopy": standalone(states["nocopy"]),
        "default_hook": default_hook,
        "checksum_hook": hook(states["default"]),
        "checksum_hook_copy": hook(states["default"], in_place=False),
        "checksum_hook_every4": hook(states["every4"]),
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    k = 8 if mb <= 4 else 4  # a multiple of EVERY: each timing of a sampled variant holds one verified call
    for rep in range(reps + 2):
        for name, fn in variants.items():
            # Repeated in-place sums double the values; k calls from fresh data stay far from overflow.
            work.copy_(base)
            elapsed = _timed(fn, k)
            if rep >= 2:  # the first reps allocate buffers and warm caches
                times[name].append(elapsed)
    row = {"mb": float(mb)}
    for name, values in times.items():
        row[f"{name}_ms"] = statistics.median(values) * 1e3
    # Medians of per-rep ratios: each compares two measurements taken moments apart, which cancels the drift
    # (other tenants, CPU frequency) that dominates absolute times on a small shared machine.
    for name, against in (
        ("checksummed", "plain"),
        ("checksummed_carried", "plain"),
        ("checksummed_every4", "plain"),
        ("checksummed_nocopy", "plain"),
        ("checksum_hook", "default_hook"),
        ("checksum_hook_copy", "default_hook"),
        ("checksum_hook_every4", "default_hook"),
    ):
        row[f"{name}_ratio"] = statistics.median(g / p for g, p in zip(times[name], times[against], strict=True))
    _breakdown(row, states["default"], work, scale, n, reps)
    return row


def _breakdown(
    row: dict[str, float], state: ChecksumState, work: torch.Tensor, scale: float, n: int, reps: int
) -> None:
    """Each piece of the guard's clean path alone, in milliseconds (the collectives on both ranks at once)."""
    layout = state.config.layout(n, work.dtype)
    carrier = state.carrier(("send", 0), state.config.carried_numel(n, work.dtype), work.dtype)
    send = carrier[:n]
    row["read_ms"] = shared.median_seconds(lambda: work.sum(), reps) * 1e3
    row["copy_ms"] = shared.median_seconds(lambda: send.copy_(work), reps) * 1e3
    row["scale_copy_ms"] = shared.median_seconds(lambda: torch.mul(work, scale, out=send), reps) * 1e3
    row["declare_ms"] = shared.median_seconds(lambda: sums_and_lower_bounds(work, layout), reps) * 1e3
    row["fused_ms"] = (
        shared.median_seconds(lambda: sums_and_lower_bounds(work, layout, copy_to=send, scale=scale), reps) * 1e3
    )
    row["verify_ms"] = shared.median_seconds(lambda: block_sums(work, layout), reps) * 1e3
    tiny = torch.zeros(2, dtype=torch.int64)
    row["tiny_allreduce_ms"] = statistics.median(_timed(lambda: dist.all_reduce(tiny), 20) for _ in range(reps)) * 1e3
    pairs = []
    for _ in range(reps):  # the bucket alone vs the bucket with its checksums appended, paired
        send.zero_()
        carrier.zero_()
        alone = _timed(lambda: dist.all_reduce(send), 2)
        pairs.append((_timed(lambda: dist.all_reduce(carrier), 2), alone))
    row["allreduce_ms"] = statistics.median(a for _, a in pairs) * 1e3
    row["allreduce_with_checksums_ms"] = statistics.median(c for c, _ in pairs) * 1e3


def _phases(rank: int, world: int, report: Report, mb: float, reps: int, in_place: bool) -> dict[str, float]:
    """Median milliseconds per phase of the hook (in context: right after the collective, as in training);
    ``in_place``: the default path (bucket averaged in place), else the out-of-place one."""
    spent: dict[str, list[float]] = {}

    def timed(owner: Any, name: str, key: str) -> None:
        inner = getattr(owner, name)

        @functools.wraps(inner)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                spent.setdefault(key, []).append(time.perf_counter() - start)

        setattr(owner, name, wrapper)

    timed(checksum, "_fill_and_declare", "hook_copy_and_declare")
    timed(checksum, "guarded_reduce", "hook_guarded_reduce")
    timed(checksum, "_verify", "hook_verify_and_verdict")
    timed(checksum._Job, "verdict", "hook_verdict")
    n = int(mb * 2**20) // 4
    base = torch.randn(n, generator=torch.Generator().manual_seed(rank)) * 1e-3
    work = base.clone()
    state = ChecksumState(ChecksumConfig())

    def local(out: torch.Tensor) -> None:  # the parameters' .grad, for a retry (never needed on clean data)
        out.copy_(base)

    for _ in range(reps + 3):
        work.copy_(base)
        dist.barrier()
        start = time.perf_counter()
        work.div_(world)
        divided = time.perf_counter()
        dist.all_reduce(work)
        end = time.perf_counter()
        for key, value in (("default_divide", divided - start), ("default_allreduce", end - divided)):
            spent.setdefault(key, []).append(value)
        spent.setdefault("default_total", []).append(end - start)
        work.copy_(base)
        dist.barrier()
        start = time.perf_counter()
        average_bucket(state, 0, work, local if in_place else None)
        spent.setdefault("hook_total", []).append(time.perf_counter() - start)
    out = {key: statistics.median(values[3:]) * 1e3 for key, values in spent.items()}
    out["hook_verify"] = out["hook_verify_and_verdict"] - out["hook_verdict"]
    out["hook_allreduce_and_rest"] = out["hook_guarded_reduce"] - out["hook_verify_and_verdict"]
    return out


def figures(rows: list[dict[str, float]]) -> dict[str, float]:
    """The machine-readable figures: ratios per size (``hook_ratio_25mb``, ...) and the sampled coverage."""
    out: dict[str, float] = {}
    for r in rows:
        mb = f"{r['mb']:g}mb"
        out[f"hook_ratio_{mb}"] = round(r["checksum_hook_ratio"], 3)
        out[f"standalone_ratio_{mb}"] = round(r["checksummed_ratio"], 3)
        out[f"hook_copy_ratio_{mb}"] = round(r["checksum_hook_copy_ratio"], 3)
        out[f"standalone_carried_ratio_{mb}"] = round(r["checksummed_carried_ratio"], 3)
        out[f"hook_every4_ratio_{mb}"] = round(r["checksum_hook_every4_ratio"], 3)
        out[f"standalone_every4_ratio_{mb}"] = round(r["checksummed_every4_ratio"], 3)
        out[f"standalone_nocopy_ratio_{mb}"] = round(r["checksummed_nocopy_ratio"], 3)
        out[f"floor_{mb}"] = round(1 + r["read_ms"] / r["plain_ms"], 3)
    if rows:
        # Share of reductions verified; a transient sign/exponent flip is caught with this probability (the
        # verified path catches 100% of them: the coverage campaign), a persistent one within EVERY reductions.
        out["every4_coverage"] = round(rows[0]["every4_verified_share"], 4)
    return out


def main(sizes: tuple[float, ...] = SIZES_MB, reps: int = 15, as_json: bool = False) -> list[dict[str, float]]:
    """Run the benchmark, print a table and return rank 0's rows (milliseconds, medians)."""
    rows: list[dict[str, float]] = run_group(_rank, 2, sizes, reps, timeout_s=1800)[0]
    print("float32, 2 gloo ranks on this machine, 1 intra-op thread each; medians, ratios = median of per-rep ratios")
    print(
        f"{'size':>6} | {'plain':>8} {'checksummed':>11} {'ratio':>6} {'carried':>8} {'every4':>6} {'nocopy':>6} |"
        f" {'DDP default hook':>16} {'checksum_hook':>13} {'ratio':>6} {'copy':>8} {'every4':>6} | {'floor':>6}"
    )
    for r in rows:
        floor = 1 + r["read_ms"] / r["plain_ms"]
        print(
            f"{r['mb']:4g}MB | {r['plain_ms']:6.2f}ms {r['checksummed_ms']:9.2f}ms {r['checksummed_ratio']:5.2f}x"
            f" {r['checksummed_carried_ratio']:7.2f}x {r['checksummed_every4_ratio']:5.2f}x"
            f" {r['checksummed_nocopy_ratio']:5.2f}x |"
            f" {r['default_hook_ms']:14.2f}ms {r['checksum_hook_ms']:11.2f}ms {r['checksum_hook_ratio']:5.2f}x"
            f" {r['checksum_hook_copy_ratio']:7.2f}x {r['checksum_hook_every4_ratio']:5.2f}x | {floor:5.2f}x"
        )
    print(
        "carried: checksums appended (carry_checksums=True); copy: the hook's out-of-place path"
        " (gradient_as_bucket_view=True); every4: verify_every=4; nocopy: policy skip, localize=False"
    )
    print("floor = 1 + one extra read of the buffer (a float32 sum) relative to the plain all-reduce")
    print(
        "alone, ms: read | scaling copy | copy | declare | scaling copy fused with declare | verify | tiny all-reduce"
        " | all-reduce without / with checksums"
    )
    for r in rows:
        print(
            f"{r['mb']:4g}MB | {r['read_ms']:.2f} | {r['scale_copy_ms']:.2f} | {r['copy_ms']:.2f} | {r['declare_ms']:.2f}"
            f" | {r['fused_ms']:.2f} | {r['verify_ms']:.2f} | {r['tiny_allreduce_ms']:.3f} | {r['allreduce_ms']:.2f} / "
            f"{r['allreduce_with_checksums_ms']:.2f}"
        )
    if as_json:
        print(json.dumps(figures(rows), sort_keys=True))
    return rows


if __name__ == "__main__":
    parser = shared.parser(__doc__)
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object on the last line")
    parser.add_argument("--sizes", default=",".join(str(s) for s in SIZES_MB), help="MB per bucket, comma-separated")
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--phases", action="store_true", help="time the hook's phases in place (first size only)")
    parser.add_argument("--copy", action="store_true", help="with --phases: the hook's out-of-place path")
    args = parser.parse_args()
    sizes = tuple(float(s) for s in args.sizes.split(","))
    if args.phases:
        per_rank = run_group(_phases, 2, sizes[0], args.reps, not args.copy, timeout_s=900)
        for rank, phases in enumerate(per_rank):
            print(f"rank {rank}, {sizes[0]:g} MB, ms: " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(phases.items())))
        if args.json:
            print(json.dumps({f"rank{r}": {k: round(v, 3) for k, v in p.items()} for r, p in enumerate(per_rank)}))
    else:
        main(sizes, args.reps, args.json)
