"""Benchmark: what one training-state digest costs (``chaos.injob.progress.state_digest``: sha256 over the model's
``state_dict`` and the optimizer's state), the price of ``replicas_agree {every: k}``, paid once every k
committed steps on each replica.

Run: ``.venv/bin/python benchmarks/state_digest.py [--repeats 5] [--json]``. For MLPs of about 1, 16 and 128 MB of
fp32 parameters with AdamW (its state doubles the bytes: exp_avg, exp_avg_sq), one optimizer step to create the
state, then the digest timed ``--repeats`` times (the median is reported) next to one forward + backward +
optimizer step of a 32-row batch on the same model, so the digest's cost reads as "steps' worth". ``--json``
prints one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import shared  # noqa: E402  (this folder: the script's own, first on sys.path)

from chaos.injob.progress import state_digest  # noqa: E402

SIZES_MB = (1, 16, 128)


def model_of(megabytes: int) -> nn.Module:
    """An MLP of ``megabytes`` MB of fp32 parameters (square hidden layers of width 1024, or less for small)."""
    params = megabytes * 1024 * 1024 // 4
    width = 1024 if params >= 4 * 1024 * 1024 else 256
    layers = max(1, params // (width * width))
    return nn.Sequential(*(nn.Linear(width, width) for _ in range(layers)))


def measure(megabytes: int, repeats: int) -> dict[str, float]:
    torch.manual_seed(0)
    model = model_of(megabytes)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    width = model[0].in_features  # type: ignore[index]
    batch = torch.randn(32, width)

    def step() -> None:
        optimizer.zero_grad()
        model(batch).pow(2).mean().backward()
        optimizer.step()

    step()  # AdamW's state exists from here
    steps = []
    for _ in range(repeats):
        began = time.perf_counter()
        step()
        steps.append(time.perf_counter() - began)
    digests = []
    for _ in range(repeats):
        began = time.perf_counter()
        state_digest(model, optimizer)
        digests.append(time.perf_counter() - began)
    state_mb = sum(p.numel() * 4 for p in model.parameters()) * 3 / 2**20  # parameters + exp_avg + exp_avg_sq
    digest_s, step_s = statistics.median(digests), statistics.median(steps)
    return {
        "state_mb": round(state_mb, 1),
        "digest_ms": round(digest_s * 1e3, 2),
        "step_ms": round(step_s * 1e3, 2),
        "mb_per_s": round(state_mb / digest_s),
        "steps_worth": round(digest_s / step_s, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = {f"{mb} MB": measure(mb, args.repeats) for mb in SIZES_MB}
    print(f"state digest, torch {torch.__version__}, Python {platform.python_version()}, 1 thread")
    print(f"{'parameters':>10} {'state MB':>9} {'digest ms':>10} {'MB/s':>6} {'step ms':>8} {'steps worth':>12}")
    for name, row in rows.items():
        print(
            f"{name:>10} {row['state_mb']:>9} {row['digest_ms']:>10} {row['mb_per_s']:>6} {row['step_ms']:>8} "
            f"{row['steps_worth']:>12}"
        )
    shared.json_last(rows, args.json, sort_keys=False)


if __name__ == "__main__":
    main()
