"""In-place bit flips (``injectors.tensor``) against pytorchfi 0.6.0, as ratios measured within one run.

Run: ``.venv/bin/python benchmarks/bitflip_vs_pytorchfi.py [--json]`` (about 10 s on 2 CPU threads).

Two models: a hand-written ResNet-18-like CNN (BasicBlocks [2, 2, 2, 2], 64-512 channels, 11.7M parameters)
on one 3x64x64 image, and a 10.5M-parameter MLP (1024-2048-2048-2048-10) on a batch of 8. For each:

- set-up: ours = ``arm`` + ``fire`` (the flip is in place); pytorchfi = ``declare_weight_fi`` on a prepared
  ``fault_injection`` (it deep-copies the model), and its whole set-up (constructor with its profiling
  forward, then declare) as the adapter in :mod:`chaos.injob.pfi` does it. Goal: ours >= 100x faster.
- armed forward (eval, ``no_grad``): the clean model; our weight fault (no hook at all: the model is just
  corrupted) and activation fault (one forward hook, fired each step); pytorchfi's weight copy and neuron
  copy (a hook on EVERY Conv2d/Linear plus our counter-reset pre-hook). Goal: ours no slower than pytorchfi.

Forward variants are timed round robin, one forward each per round, medians over rounds: load from anything
else on the machine then hits every variant alike, and the ratios hold even when absolute times drift.
Bit 31 (sign) is flipped so no variant runs on Inf/NaN arithmetic; the bit does not change set-up cost.
"""

from __future__ import annotations

import copy
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import shared  # noqa: E402
from pytorchfi import core  # type: ignore[import-untyped]  # noqa: E402

from chaos.injob.bitflip import Flip, flip_bits, flipped_value  # noqa: E402
from chaos.injob.pfi import LAYER_TYPES, pfi_injector, pfi_layers, pfi_neuron_flip  # noqa: E402
from chaos.injob.tensor_faults import arm  # noqa: E402
from injectors.tensor import BitFlipParams  # noqa: E402

BIT = 31


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.down(x))


class ResNet18Like(nn.Module):
    """ResNet-18's shape (no torchvision here): stem, four stages of two BasicBlocks, pooled linear head."""

    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)
        )
        stages: list[nn.Module] = []
        cin = 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            stages.append(nn.Sequential(BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)))
            cin = cout
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(512, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc(self.flatten(self.pool(self.stages(self.stem(x)))))
        return out


def mlp_10m() -> nn.Sequential:
    widths = [1024, 2048, 2048, 2048, 10]  # 2.1M + 4.2M + 4.2M + 20k = 10.5M parameters
    layers: list[nn.Module] = []
    for a, b in zip(widths, widths[1:], strict=False):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def bench(
    name: str, model: nn.Module, input_shape: list[int], batch: int, layer: str, neuron_layer: str, rounds: int
) -> dict[str, float]:
    """Print the set-up and forward comparison for one model; return its ratios (what ``--json`` reports)."""
    model.eval()
    x = torch.randn(batch, *input_shape)
    weight = model.get_submodule(layer).weight
    assert isinstance(weight, torch.Tensor)
    index = weight.numel() // 3
    params = sum(p.numel() for p in model.parameters())
    print(f"\n{name}: {params / 1e6:.1f}M parameters, input {batch}x{'x'.join(map(str, input_shape))}")

    # -- set-up --------------------------------------------------------------------------------------------
    fault_params = BitFlipParams(layer=f"{layer}.weight", element=index, bit=BIT)
    rng = random.Random(0)
    fi = pfi_injector(model, input_shape, batch)
    number = pfi_layers(model).index(layer)
    coords: list[int | None] = [int(i) for i in torch.unravel_index(torch.tensor(index), tuple(weight.shape))]
    coords += [None] * (4 - len(coords))

    def flip(data: torch.Tensor, where: Any) -> torch.Tensor:
        value = flipped_value(float(data[where].item()), data.dtype, BIT)
        return torch.tensor(value, dtype=data.dtype)

    def pfi_declare() -> Any:
        return fi.declare_weight_fi(
            function=flip, layer_num=[number], k=[coords[0]], dim1=[coords[1]], dim2=[coords[2]], dim3=[coords[3]]
        )

    def pfi_full() -> None:
        with torch.no_grad():
            core.fault_injection(model, batch, input_shape=input_shape, layer_types=list(LAYER_TYPES))
        pfi_declare()

    # Interleaved rounds, so load from anything else on the machine lands on every variant alike.
    samples: dict[str, list[float]] = {"flip": [], "ours": [], "declare": [], "full": []}
    one = [Flip(index, BIT)]
    for _ in range(5):
        for _ in range(100):  # the bare in-place flip (an even count of flips leaves the weight as it was)
            start = time.perf_counter()
            flip_bits(weight, one)
            samples["flip"].append(time.perf_counter() - start)
        for _ in range(100):
            start = time.perf_counter()
            fault = arm(model, None, fault_params, rng)
            fault.fire(0)
            samples["ours"].append(time.perf_counter() - start)
            fault.heal()  # not part of set-up (pytorchfi's undo is dropping its copy), so untimed
        samples["declare"] += [shared.median_seconds(pfi_declare, 1, warm_up=False) for _ in range(2)]
        samples["full"].append(shared.median_seconds(pfi_full, 1, warm_up=False))
    t_flip, t_ours, t_declare, t_full = (statistics.median(samples[k]) for k in ("flip", "ours", "declare", "full"))
    print(f"  set-up  bare flip_bits             {t_flip * 1e6:10.1f} us")
    print(f"  set-up  ours arm+fire              {t_ours * 1e6:10.1f} us")
    print(
        f"  set-up  pytorchfi declare         {t_declare * 1e6:10.1f} us   {t_declare / t_ours:7.0f}x ours"
        f"   {t_declare / t_flip:7.0f}x bare flip"
    )
    print(f"  set-up  pytorchfi init+declare    {t_full * 1e6:10.1f} us   {t_full / t_ours:7.0f}x ours")

    # -- armed forward ---------------------------------------------------------------------------------------
    # Every variant is its own model object (pytorchfi's are copies anyway), so all can stay armed at once.
    pfi_weight_model = pfi_declare().eval()
    neuron_numel = _output_numel(model, neuron_layer, x)
    pfi_neuron_model = pfi_neuron_flip(model, input_shape, neuron_layer, neuron_numel // 2, BIT, batch_size=batch)
    pfi_neuron_model.eval()
    clean_model = copy.deepcopy(model)
    act_model = copy.deepcopy(model)
    ours_weight = arm(model, None, fault_params, random.Random(0))
    ours_weight.fire(0)
    act_params = BitFlipParams(
        where="activations", layer=neuron_layer, element=neuron_numel // 2, bit=BIT, persistence="stuck"
    )
    ours_act = arm(act_model, None, act_params, random.Random(0))
    step = iter(range(10**9))

    def run(m: nn.Module) -> Callable[[], None]:
        def go() -> None:
            with torch.no_grad():
                m(x)

        return go

    def ours_activation_forward() -> None:
        ours_act.fire(next(step))  # stuck: the hook flips the output of every forward
        with torch.no_grad():
            act_model(x)

    variants: dict[str, Callable[[], None]] = {
        "clean": run(clean_model),
        "ours weight fault": run(model),
        "pytorchfi weight copy": run(pfi_weight_model),
        "ours activation fault": ours_activation_forward,
        "pytorchfi neuron copy": run(pfi_neuron_model),
    }
    for fn in variants.values():  # warm up every path (allocator, kernels) before timing
        fn()
    # Round robin one forward at a time: a burst of load from elsewhere hits every variant alike.
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(rounds):
        for key, fn in variants.items():
            times[key].append(shared.median_seconds(fn, 1, warm_up=False))
    ours_weight.heal()
    ours_act.heal()
    t = {k: statistics.median(v) for k, v in times.items()}
    for key in variants:
        print(f"  forward {key:26s}{t[key] * 1e3:10.2f} ms   {t[key] / t['clean']:5.2f}x clean")
    print(
        f"  forward ratios: ours/pytorchfi weight {t['ours weight fault'] / t['pytorchfi weight copy']:.2f}x, "
        f"activation/neuron {t['ours activation fault'] / t['pytorchfi neuron copy']:.2f}x (<= 1 is the goal)"
    )
    assert len(ours_act.records) == rounds + 1  # the activation fault really fired on every forward
    return {
        "ours_setup_us": t_ours * 1e6,
        "setup_ratio_pfi_declare": t_declare / t_ours,
        "setup_ratio_pfi_init_declare": t_full / t_ours,
        "forward_ratio_weight": t["ours weight fault"] / t["pytorchfi weight copy"],
        "forward_ratio_activation": t["ours activation fault"] / t["pytorchfi neuron copy"],
    }


def _output_numel(model: nn.Module, layer: str, x: torch.Tensor) -> int:
    seen: list[int] = []
    handle = model.get_submodule(layer).register_forward_hook(lambda _m, _i, out: seen.append(out.numel()))
    with torch.no_grad():
        model(x)
    handle.remove()
    return seen[0]


def main() -> dict[str, float]:
    """Run both models; return their figures as one flat dict (``cnn_*``, ``mlp_*``)."""
    torch.set_num_threads(2)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    started = time.perf_counter()
    cnn = bench("ResNet-18-like CNN", ResNet18Like(), [3, 64, 64], 1, "stages.2.0.conv1", "stages.2.0.conv2", rounds=60)
    mlp = bench("10M-parameter MLP", mlp_10m(), [1024], 8, "4", "4", rounds=120)
    print(f"\n(total {time.perf_counter() - started:.0f} s)")
    return {**{f"cnn_{k}": v for k, v in cnn.items()}, **{f"mlp_{k}": v for k, v in mlp.items()}}


if __name__ == "__main__":
    parser = shared.parser(__doc__)
    parser.add_argument("--json", action="store_true", help="print one JSON object of the figures as the last line")
    args = parser.parse_args()
    shared.json_last(main(), args.json)
