"""SDC coverage campaign: which single-bit flips, where, does each detector catch?

One long-lived gloo process group (``world_size`` ranks, spawned once, never relaunched per injection) runs
every trial of the matrix bit position x site x dtype x detector:

1. every rank builds gradient-like data for the trial (normal * 1e-3 with a heavy tail, a per-trial scale
   and window, so no two trials reduce the same numbers);
2. a clean ``dist.all_reduce`` of it is the ground truth;
3. the same data goes through each detector's path with ONE bit flipped on rank 1 (the target rank) at the
   site: ``local`` (the bucket before any checksum), ``in_transit`` (after checksums, before the reduction)
   or ``post_reduce`` (the reduced result, on rank 1 only). The element is drawn among those with
   ``|x| >= RMS`` of the tensor at the site (``magnitude="rms"``) or uniformly (``"any"``); the same
   element and bit in every detector's path;
4. each path is classified:

   - ``detected``: the detector flagged the trial (on any rank; all ranks agree);
   - ``masked``: not flagged, and every rank's final reduced tensor is bit-identical to the clean reduction;
   - ``silent``: not flagged, and some rank's final tensor differs (silent corruption).

   ``repaired`` counts detected trials whose final tensor is nevertheless bit-identical to the clean one
   (the checksum guard's retry from intact local data).

Detectors: ``none`` (a plain all-reduce; measures how often a flip matters at all), ``anomaly``
(:class:`~chaos.guards.anomaly.GradAnomalyGuard` observing the local bucket, on the same reduction),
``checksum`` (:func:`~chaos.guards.checksum.checksummed_all_reduce`, policy retry) and ``global`` (the
same guard with ONE block spanning the bucket: the single-checksum baseline whose tolerance grows with the
bucket). Then ``clean_reductions`` fault-free reductions with magnitudes from 1e-8 to 1e4 and mixed signs go
through the checksum guard to count false positives.

Writes ``coverage.json`` (config, every cell's counts and rates, per bit-class summaries, clean-run false
positives, runtime, the acceptance verdict) and ``coverage.png`` (one heatmap panel per dtype: rows = bit,
columns = site x detector, colour = detected minus silent rate).
"""

from __future__ import annotations

import json
import random
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist

from chaos.event_kinds import Site
from chaos.guards._dist import Report, run_group
from chaos.guards.anomaly import GradAnomalyGuard
from chaos.guards.checksum import SITES, ChecksumConfig, ChecksumState, checksummed_all_reduce
from chaos.injob.bitflip import Flip, bit_class, bit_layout, bits_in_class, flip_bits

DETECTORS = ("none", "anomaly", "checksum", "global")
OUTCOMES = ("masked", "detected", "silent")
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
TARGET_RANK = 1
ACCEPTANCE_SITES = ("in_transit", "post_reduce")
ACCEPTANCE_CLASSES = ("sign", "exponent")


@dataclass(frozen=True)
class CampaignConfig:
    """What to run. ``bits``: ``"all"``, comma-separated bit classes (``"sign,exponent"``) and/or bit indices
    (see :func:`bit_list`)."""

    world_size: int = 2
    bucket_mb: float = 25.0
    dtypes: tuple[str, ...] = ("float32",)
    sites: tuple[str, ...] = ACCEPTANCE_SITES
    bits: str = "sign,exponent"
    detectors: tuple[str, ...] = DETECTORS
    trials_per_cell: int = 100
    clean_reductions: int = 1000
    magnitude: Literal["rms", "any"] = "rms"
    seed: int = 0
    block_elems: int = 2048
    low_precision_block_elems: int = 64

    def __post_init__(self) -> None:
        if self.world_size < 2:
            raise ValueError("world_size must be >= 2 (rank 1 is the injection target)")
        for name, chosen, allowed in (
            ("dtype", self.dtypes, tuple(DTYPES)),
            ("site", self.sites, SITES),
            ("detector", self.detectors, DETECTORS),
        ):
            unknown = [c for c in chosen if c not in allowed]
            if unknown or not chosen:
                raise ValueError(f"{name}s must be a non-empty subset of {', '.join(allowed)}; got {list(chosen)}")
        if self.bucket_mb <= 0 or self.trials_per_cell < 1 or self.clean_reductions < 0:
            raise ValueError("bucket_mb and trials_per_cell must be positive, clean_reductions >= 0")
        for dtype in self.dtypes:
            bit_list(self.bits, DTYPES[dtype])  # raises on a bad spec

    def numel(self, dtype: str) -> int:
        return max(64, int(self.bucket_mb * 2**20) // DTYPES[dtype].itemsize)


def bit_list(spec: str, dtype: torch.dtype) -> list[int]:
    """The bits a spec names for ``dtype`` (see :class:`CampaignConfig`), ascending, no duplicates.

    Indices beyond ``dtype``'s width (23 for bfloat16) are skipped for that dtype, so one spec can serve a
    campaign over several dtypes; indices no dtype has (32 and up), unknown words, and a spec that leaves
    ``dtype`` no bit at all raise ValueError.
    """
    total = bit_layout(dtype)[0]
    chosen: set[int] = set()
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        if part == "all":
            chosen.update(range(total))
        elif part in ("sign", "exponent", "mantissa"):
            chosen.update(bits_in_class(dtype, part))  # type: ignore[arg-type]
        elif part.isdigit() and int(part) < 32:
            if int(part) < total:
                chosen.add(int(part))
        else:
            raise ValueError(f"bad bit spec {part!r}: use all, sign, exponent, mantissa or indices 0..31")
    if not chosen:
        raise ValueError(f"bit spec {spec!r} names no bit of {dtype}")
    return sorted(chosen)


@dataclass
class Cell:
    """Counts for one (dtype, site, bit, detector)."""

    dtype: str
    site: str
    bit: int
    bit_class: str
    detector: str
    trials: int = 0
    masked: int = 0
    detected: int = 0
    silent: int = 0
    repaired: int = 0


@dataclass
class CampaignResult:
    """What :func:`run_campaign` measured; ``json_path``/``png_path`` are where it was written."""

    config: CampaignConfig
    cells: list[Cell]
    clean: dict[str, int]
    runtime_s: float
    json_path: Path
    png_path: Path
    acceptance: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> list[dict[str, Any]]:
        """Counts and rates per (dtype, site, bit class, detector)."""
        groups: dict[tuple[str, str, str, str], dict[str, int]] = {}
        for c in self.cells:
            g = groups.setdefault(
                (c.dtype, c.site, c.bit_class, c.detector), dict.fromkeys(("trials", *OUTCOMES, "repaired"), 0)
            )
            for key in g:
                g[key] += getattr(c, key)
        return [
            {"dtype": k[0], "site": k[1], "bit_class": k[2], "detector": k[3], **v, **_rates(v)}
            for k, v in sorted(groups.items())
        ]


def _rates(counts: dict[str, int]) -> dict[str, float]:
    n = max(counts["trials"], 1)
    return {f"{k}_rate": counts[k] / n for k in OUTCOMES}


# -- the ranks' side ----------------------------------------------------------------------------------------


class _Injector:
    """A :class:`~chaos.guards.checksum.CorruptionHook` that flips one bit once, on the target rank, at one site."""

    def __init__(self, rank: int, site: str, bit: int, rng_seed: int, magnitude: str) -> None:
        self.rank, self.site, self.bit, self.seed, self.magnitude = rank, site, bit, rng_seed, magnitude
        self.fired = False

    def __call__(self, site: Site, bucket_index: int, tensor: torch.Tensor) -> None:
        if site != self.site or self.fired:
            return  # a transient fault: one flip, never again on a retry
        self.fired = True
        if self.rank != TARGET_RANK:
            return
        flip_bits(tensor, [Flip(_pick_element(tensor, random.Random(self.seed), self.magnitude), self.bit)])


def _pick_element(tensor: torch.Tensor, rng: random.Random, magnitude: str) -> int:
    """A uniformly random element, or one with |x| >= RMS(tensor) (rejection sampling, argmax fallback)."""
    n = tensor.numel()
    if magnitude == "any":
        return rng.randrange(n)
    rms = float(torch.linalg.vector_norm(tensor, dtype=torch.float32)) / n**0.5
    flat = tensor.view(-1)
    for _ in range(10_000):
        index = rng.randrange(n)
        if abs(float(flat[index])) >= rms:
            return index
    return int(flat.float().abs().argmax())


def _pool(numel: int, dtype: torch.dtype, rank: int, seed: int) -> torch.Tensor:
    """Gradient-like values: normal * 1e-3, 0.5% of them scaled up by 10^U(0, 3) (a heavy tail)."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + rank)
    pool = torch.randn(numel + numel // 8, generator=gen) * 1e-3
    tail = torch.rand(pool.numel(), generator=gen) < 0.005
    pool[tail] *= torch.pow(10.0, 3 * torch.rand(int(tail.sum()), generator=gen))
    return pool.to(dtype)


def _fill(out: torch.Tensor, pool: torch.Tensor, rng: random.Random, spread: float) -> None:
    """Copy a random window of ``pool`` times a random scale 10^U(-spread, spread) into ``out``."""
    offset = rng.randrange(pool.numel() - out.numel() + 1)
    torch.mul(pool[offset : offset + out.numel()], 10 ** rng.uniform(-spread, spread), out=out)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    ints = torch.int32 if a.element_size() == 4 else torch.int16
    return torch.equal(a.view(ints), b.view(ints))


def _rank_main(rank: int, world: int, report: Report, cfg: CampaignConfig) -> dict[str, Any]:
    cells: dict[tuple[str, str, int, str], Cell] = {}
    clean = {"reductions": 0, "checksum_flagged": 0, "checksum_second_checks": 0, "anomaly_flagged_clean_observed": 0}
    start = time.monotonic()
    for dtype_name in cfg.dtypes:
        _run_dtype(rank, world, report, cfg, dtype_name, cells, clean, start)
    _run_clean(rank, report, cfg, clean, start)
    return {"cells": [asdict(c) for c in cells.values()], "clean": clean}


def _run_dtype(
    rank: int,
    world: int,
    report: Report,
    cfg: CampaignConfig,
    dtype_name: str,
    cells: dict[tuple[str, str, int, str], Cell],
    clean: dict[str, int],
    start: float,
) -> None:
    dtype = DTYPES[dtype_name]
    n = cfg.numel(dtype_name)
    pool = _pool(n, dtype, rank, cfg.seed)
    x, ref, work = (torch.empty(n, dtype=dtype) for _ in range(3))
    config = ChecksumConfig(
        block_elems=cfg.block_elems, low_precision_block_elems=cfg.low_precision_block_elems, emit=_quiet
    )
    checksum = ChecksumState(config=config)
    # The single-checksum baseline: one block spanning (nearly) the bucket; a retry would not change its verdict.
    whole = max(64, n // 64 * 64)
    baseline = ChecksumState(
        config=ChecksumConfig(
            block_elems=whole, low_precision_block_elems=whole, policy="skip", localize=False, emit=_quiet
        )
    )
    anomaly = GradAnomalyGuard(None, emit=_quiet)
    trials = [
        (site, bit, t) for site in cfg.sites for bit in bit_list(cfg.bits, dtype) for t in range(cfg.trials_per_cell)
    ]
    # Shuffled (identically on every rank) so that slow drifts of the machine never line up with one bit.
    random.Random(cfg.seed).shuffle(trials)
    last_report = 0.0
    for k, (site, bit, t) in enumerate(trials):
        # crc32, not hash(): str hashes are salted per process, and every rank must draw the same flip.
        trial_seed = zlib.crc32(f"{cfg.seed}/{dtype_name}/{site}/{bit}/{t}".encode())
        data_rng = random.Random(trial_seed * 7 + rank)
        _fill(x, pool, data_rng, 0.3)
        ref.copy_(x)
        dist.all_reduce(ref)
        flagged: dict[str, bool] = {}
        same: dict[str, bool] = {}
        if "none" in cfg.detectors or "anomaly" in cfg.detectors:
            inject = _Injector(rank, site, bit, trial_seed, cfg.magnitude)
            work.copy_(x)
            inject("local", 0, work)
            anomaly.observe(0, work)
            inject("in_transit", 0, work)
            dist.all_reduce(work)
            inject("post_reduce", 0, work)
            found = anomaly.check(k)
            flagged["none"], flagged["anomaly"] = False, bool(found)
            same["none"] = same["anomaly"] = _same(work, ref)
            if found and site != "local":
                clean["anomaly_flagged_clean_observed"] += 1  # it saw clean data and still flagged
        for name, state in (("checksum", checksum), ("global", baseline)):
            if name not in cfg.detectors:
                continue
            before = state.stats.mismatches
            state.corrupt = _Injector(rank, site, bit, trial_seed, cfg.magnitude)
            state.skip_step = False
            work.copy_(x)
            checksummed_all_reduce(work, state=state, step=k)
            flagged[name] = state.stats.mismatches > before
            same[name] = _same(work, ref)
        names = [d for d in cfg.detectors if d in flagged]
        agree = torch.tensor([int(same[d]) for d in names], dtype=torch.int32)
        dist.all_reduce(agree, op=dist.ReduceOp.MIN)  # masked only if identical on EVERY rank
        for d, identical in zip(names, agree.tolist(), strict=True):
            cell = cells.setdefault((dtype_name, site, bit, d), Cell(dtype_name, site, bit, bit_class(dtype, bit), d))
            cell.trials += 1
            if flagged[d]:
                cell.detected += 1
                cell.repaired += int(identical)
            elif identical:
                cell.masked += 1
            else:
                cell.silent += 1
        now = time.monotonic()
        if rank == 0 and (now - last_report > 2.0 or k + 1 == len(trials)):
            last_report = now
            report(f"{dtype_name}: trial {k + 1}/{len(trials)}  ({now - start:.0f} s)")


def _run_clean(rank: int, report: Report, cfg: CampaignConfig, clean: dict[str, int], start: float) -> None:
    """Fault-free reductions through the checksum guard, magnitudes 1e-8..1e4, mixed signs, odd sizes."""
    if not cfg.clean_reductions:
        return
    n = cfg.numel("float32")
    pool = _pool(n, torch.float32, rank, cfg.seed + 1)
    state = ChecksumState(config=ChecksumConfig(block_elems=cfg.block_elems, emit=_quiet))
    buf = torch.empty(n)
    rng = random.Random(cfg.seed * 31 + rank)
    # Three sizes (a whole number of blocks, and two with odd tails), each with its own intact buffer in the
    # state (keyed by bucket_index), so no reduction pays for a fresh allocation.
    sizes = [n, max(1, n - 1000), max(1, n - 37)]
    last_report = 0.0
    for k in range(cfg.clean_reductions):
        size = sizes[k % 3]
        x = buf[:size]
        _fill(x, pool, rng, 0.0)
        x.mul_(10.0 ** rng.uniform(-5.0, 7.0))  # with pool's 1e-3 and tail: |x| from ~1e-8 to ~1e4
        if k % 5 == 0:
            x[: size // 3].fill_(rng.uniform(-1, 1) * 10.0 ** rng.uniform(-8, 4))  # constant blocks align errors
        before = state.stats.mismatches  # counts a mismatch even if the retry then verified clean
        checksummed_all_reduce(x, state=state, step=k, bucket_index=k % 3)
        clean["checksum_flagged"] += int(state.stats.mismatches > before)
        clean["reductions"] += 1
        now = time.monotonic()
        if rank == 0 and (now - last_report > 2.0 or k + 1 == cfg.clean_reductions):
            last_report = now
            report(f"clean: {k + 1}/{cfg.clean_reductions}  ({now - start:.0f} s)")
    clean["checksum_second_checks"] += state.stats.second_checks


def _quiet(kind: str, *, rank: int | None = None, **data: Any) -> None:
    """The campaign counts detections itself; its thousands of injections are not a job's history."""


# -- the parent's side ---------------------------------------------------------------------------------------


def run_campaign(
    config: CampaignConfig | None = None,
    *,
    out_dir: Path | str = Path("reports/sdc-coverage"),
    progress: Callable[[str], None] | None = None,
    timeout_s: float = 3600.0,
) -> CampaignResult:
    """Run the campaign in one process group, write ``coverage.json`` and ``coverage.png`` into ``out_dir``."""
    cfg = config or CampaignConfig()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    say = progress or (lambda line: None)
    say(
        f"sdc-coverage: {cfg.world_size} gloo ranks, {cfg.bucket_mb:g} MB buckets, dtypes {', '.join(cfg.dtypes)}, "
        f"sites {', '.join(cfg.sites)}, bits {cfg.bits}, {cfg.trials_per_cell} trials per cell"
    )
    results = run_group(_rank_main, cfg.world_size, cfg, timeout_s=timeout_s, on_message=lambda m: say(str(m)))
    rank0 = results[0]
    cells = [Cell(**c) for c in rank0["cells"]]
    cells.sort(key=lambda c: (list(DTYPES).index(c.dtype), SITES.index(c.site), -c.bit, DETECTORS.index(c.detector)))
    clean = rank0["clean"]
    result = CampaignResult(cfg, cells, clean, time.monotonic() - started, out / "coverage.json", out / "coverage.png")
    result.acceptance = acceptance(result)
    write_json(result)
    write_heatmap(result)
    return result


def acceptance(result: CampaignResult) -> dict[str, Any]:
    """The issue's bar, evaluated on whatever part of it this run covered (``applicable`` says if any)."""
    rows = [
        c
        for c in result.cells
        if c.dtype == "float32"
        and c.site in ACCEPTANCE_SITES
        and c.bit_class in ACCEPTANCE_CLASSES
        and c.detector == "checksum"
    ]
    trials = sum(c.trials for c in rows)
    detected = sum(c.detected for c in rows)
    per_site = {
        s: (sum(c.detected for c in rows if c.site == s), sum(c.trials for c in rows if c.site == s))
        for s in ACCEPTANCE_SITES
    }
    rate = detected / trials if trials else None
    fp = result.clean.get("checksum_flagged", 0)
    cfg = result.config
    # Applies only to a run that covers the whole bar: both sites, 25 MB buckets, |x| >= RMS, 1000 clean.
    applicable = (
        all(per_site[s][1] for s in ACCEPTANCE_SITES)
        and cfg.bucket_mb >= 25
        and cfg.magnitude == "rms"
        and result.clean.get("reductions", 0) >= 1000
    )
    return {
        "criterion": ">= 99% of float32 sign/exponent flips on |x| >= RMS detected at in_transit and post_reduce "
        "(25 MB buckets); 0 false positives over >= 1000 clean reductions",
        "applicable": applicable,
        "detected": detected,
        "trials": trials,
        "detected_rate": rate,
        "per_site": {s: {"detected": d, "trials": t} for s, (d, t) in per_site.items()},
        "clean_reductions": result.clean.get("reductions", 0),
        "false_positives": fp,
        "passed": applicable and rate is not None and rate >= 0.99 and fp == 0,
    }


def write_json(result: CampaignResult) -> None:
    doc = {
        "config": asdict(result.config),
        "runtime_s": round(result.runtime_s, 1),
        "outcomes": {
            "masked": "not flagged; every rank's final tensor bit-identical to the clean reduction",
            "detected": "flagged by the detector (repaired: and the final tensor is bit-identical anyway)",
            "silent": "not flagged; some rank's final tensor differs from the clean reduction",
        },
        "clean": result.clean,
        "acceptance": result.acceptance,
        "summary": result.summary(),
        "cells": [{**asdict(c), **_rates(asdict(c))} for c in result.cells],
    }
    result.json_path.write_text(json.dumps(doc, indent=1) + "\n")


def write_heatmap(result: CampaignResult) -> None:
    """One panel per dtype; rows = bit (most significant on top), columns = site x detector."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    cfg = result.config
    cols = [(s, d) for s in cfg.sites for d in cfg.detectors]
    fig, axes = plt.subplots(1, len(cfg.dtypes), figsize=(2.0 + 0.45 * len(cols) * len(cfg.dtypes), 9), squeeze=False)
    by_key = {(c.dtype, c.site, c.bit, c.detector): c for c in result.cells}
    for ax, dtype_name in zip(axes[0], cfg.dtypes, strict=True):
        bits = sorted(bit_list(cfg.bits, DTYPES[dtype_name]), reverse=True)
        grid = np.full((len(bits), len(cols)), np.nan)
        for i, bit in enumerate(bits):
            for j, (site, det) in enumerate(cols):
                cell = by_key.get((dtype_name, site, bit, det))
                if cell and cell.trials:
                    grid[i, j] = (cell.detected - cell.silent) / cell.trials
                    ax.text(
                        j,
                        i,
                        f"{100 * cell.detected / cell.trials:.0f}/{100 * cell.silent / cell.trials:.0f}",
                        ha="center",
                        va="center",
                        fontsize=5,
                    )
        image = ax.imshow(grid, cmap="RdYlGn", vmin=-1, vmax=1, aspect="auto")
        ax.set_xticks(range(len(cols)), [f"{s}\n{d}" for s, d in cols], rotation=90, fontsize=6)
        ax.set_yticks(range(len(bits)), [f"{b} {bit_class(DTYPES[dtype_name], b)[0]}" for b in bits], fontsize=6)
        ax.set_title(f"{dtype_name}, {cfg.bucket_mb:g} MB buckets", fontsize=8)
    fig.colorbar(
        image, ax=axes[0].tolist(), shrink=0.6, label="detected - silent rate (cell text: detected% / silent%)"
    )
    elements = "elements with |x| >= RMS" if cfg.magnitude == "rms" else "uniformly drawn elements"
    fig.suptitle(
        f"SDC coverage: one bit flipped on rank {TARGET_RANK} of {cfg.world_size} (gloo), {elements}, "
        f"{cfg.trials_per_cell} trials per cell",
        fontsize=9,
    )
    fig.savefig(result.png_path, dpi=130, bbox_inches="tight")
    plt.close(fig)


def format_summary(result: CampaignResult, classes: Sequence[str] = ("sign", "exponent", "mantissa")) -> str:
    """A plain-text table of the per-class summary, for the terminal."""
    lines = [
        f"{'dtype':9} {'site':12} {'class':9} {'detector':9} {'trials':>6} {'detected':>9} {'silent':>7} {'masked':>7}"
    ]
    for row in result.summary():
        if row["bit_class"] in classes:
            lines.append(
                f"{row['dtype']:9} {row['site']:12} {row['bit_class']:9} {row['detector']:9} {row['trials']:6d} "
                f"{100 * row['detected_rate']:8.1f}% {100 * row['silent_rate']:6.1f}% {100 * row['masked_rate']:6.1f}%"
            )
    return "\n".join(lines)


__all__ = ["DETECTORS", "CampaignConfig", "CampaignResult", "Cell", "bit_list", "format_summary", "run_campaign"]
