"""A small adapter for people who already use pytorchfi: its weight and neuron fault models with an exact
IEEE-754 bit flip (:func:`chaos.injob.bitflip.flipped_value`) as the error function, so both tools corrupt the same
value for the same (layer, element, bit).

Use :mod:`injectors.tensor` for training runs; this exists for compatibility and comparison. What we measured
with pytorchfi 0.6.0 (``tests/unit/test_tensor_injector.py`` asserts each point, ``benchmarks/bitflip_vs_pytorchfi.py``
times them):

- Every ``declare_weight_fi`` / ``declare_neuron_fi`` deep-copies the whole model and returns the copy: set-up
  costs a model copy (three orders of magnitude more than an in-place flip) and twice the memory. The
  corrupted model is a different object from the one the optimizer trains, so pytorchfi cannot corrupt a
  training run in place.
- Neuron faults are located by a layer counter that its forward hooks increment and nothing resets. With
  ``value=`` the second forward of the corrupted model raises ``IndexError`` (it indexes past its layer
  table); with ``function=`` the second forward silently injects nothing (the counter never matches again).
  This adapter resets the counter in a forward pre-hook on the corrupted model, so every forward injects.
  The counter also assumes each Conv2d/Linear runs exactly once per forward, in definition order.
- Constructing ``core.fault_injection`` runs a profiling forward of the ORIGINAL model on ``torch.randn``
  input: it advances the global torch RNG and, in train mode, updates BatchNorm running statistics. It also
  calls ``logging.basicConfig`` with a format that needs ``clientip`` and ``user`` fields, so any later
  root-logger message in a process without logging configured prints a "--- Logging error ---" traceback.
  This adapter profiles under a forked RNG, in eval mode and ``no_grad``, and removes the handler it adds.
- Layers are numbers, and the numbering differs by fault model: weights count Conv2d/Linear modules in
  DEFINITION order, neurons count hook calls in EXECUTION order. The adapter takes module names and maps
  each to the right number (execution order recorded by its own hooks during the profiling forward).
- Only Conv2d and Linear (the layer types we pass) are addressable; a weight element is given as
  (k, dim1, dim2, dim3), which this adapter derives from a flat index.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from pytorchfi import core  # type: ignore[import-untyped]
from torch import nn

from chaos.injob.bitflip import bit_layout, flipped_value

LAYER_TYPES: tuple[type[nn.Module], ...] = (nn.Conv2d, nn.Linear)


def pfi_layers(model: nn.Module) -> list[str]:
    """Module names in pytorchfi's layer numbering: leaf Conv2d/Linear modules in depth-first child order."""
    names: list[str] = []

    def walk(module: nn.Module, prefix: str) -> None:
        for name, child in module.named_children():
            if next(child.children(), None) is None:
                if isinstance(child, LAYER_TYPES):
                    names.append(prefix + name)
            else:
                walk(child, f"{prefix}{name}.")

    walk(model, "")
    return names


def pfi_injector(model: nn.Module, input_shape: Sequence[int], batch_size: int = 1) -> Any:
    """A ``pytorchfi.core.fault_injection`` for ``model`` without its side effects on the caller's process.

    ``input_shape`` excludes the batch dimension. The profiling forward runs in eval mode, under
    ``no_grad`` and a forked RNG; the logging handler pytorchfi installs on the root logger is removed (its
    ``declare_*`` calls add one too: the adapter functions below remove those as well).
    """
    return _profiled(model, input_shape, batch_size)[0]


def _profiled(model: nn.Module, input_shape: Sequence[int], batch_size: int) -> tuple[Any, list[str]]:
    """The injector plus the layers' names in EXECUTION order, seen by our own hooks during its profiling
    forward: pytorchfi numbers neurons in that order but weights in definition order."""
    order: list[str] = []

    def recorder(name: str) -> Callable[..., None]:
        return lambda *_args: order.append(name)

    handles = [model.get_submodule(name).register_forward_hook(recorder(name)) for name in pfi_layers(model)]
    try:
        with _quiet_profile(model):
            fi = core.fault_injection(
                model, batch_size, input_shape=list(input_shape), layer_types=list(LAYER_TYPES), use_cuda=False
            )
    finally:
        for handle in handles:
            handle.remove()
    return fi, order


def pfi_weight_flip(
    model: nn.Module, input_shape: Sequence[int], layer: str, index: int, bit: int, *, batch_size: int = 1
) -> nn.Module:
    """pytorchfi's corrupted COPY of ``model`` with bit ``bit`` of ``layer.weight``'s element ``index`` flipped.

    ``layer`` is a module name from :func:`pfi_layers`; ``index`` a flat row-major index into its weight. The
    original model is untouched.
    """
    fi, order = _profiled(model, input_shape, batch_size)
    number = _layer_number(pfi_layers(model), order, layer)
    weight = model.get_submodule(layer).weight
    assert isinstance(weight, torch.Tensor)
    bit_layout(weight.dtype)  # unsupported dtypes fail here, not deep inside pytorchfi
    k, c, h, w = _coords(index, tuple(weight.shape))

    def flip(data: torch.Tensor, where: tuple[int | None, ...]) -> torch.Tensor:
        # pytorchfi indexes Linear weights as [k, c, None, None]: a 1x1 view, hence .item() on any shape.
        return torch.tensor(flipped_value(float(data[where].detach().item()), data.dtype, bit), dtype=data.dtype)

    with _root_logging_kept():
        corrupted: nn.Module = fi.declare_weight_fi(
            function=flip, layer_num=[number], k=[k], dim1=[c], dim2=[h], dim3=[w]
        )
    return corrupted


def pfi_neuron_flip(
    model: nn.Module, input_shape: Sequence[int], layer: str, index: int, bit: int, *, batch_size: int = 1
) -> nn.Module:
    """pytorchfi's corrupted COPY of ``model`` whose ``layer`` output element ``index`` gets bit ``bit`` flipped
    on EVERY forward.

    ``index`` is a flat row-major index into the layer's whole output (batch included, ``batch_size`` rows),
    the same indexing as an ``activations`` fault in :mod:`injectors.tensor`. The layer counter is reset by
    a forward pre-hook, so repeated forwards work (pytorchfi alone breaks on the second one).
    """
    fi, order = _profiled(model, input_shape, batch_size)
    number = _layer_number(order, order, layer)
    shape = (batch_size, *fi.get_layer_shape(number)[1:])
    b, c, h, w = _coords(index, shape)
    where = tuple(i for i in (b, c, h, w) if i is not None)

    def flip(module: nn.Module, inputs: Any, output: torch.Tensor) -> None:
        if fi.get_current_layer() == number:
            output[where] = flipped_value(float(output[where].detach().item()), output.dtype, bit)
        fi.updateLayer()

    with _root_logging_kept():
        corrupted: nn.Module = fi.declare_neuron_fi(
            function=flip, layer_num=[number], batch=[b], dim1=[c], dim2=[h], dim3=[w]
        )
    corrupted.register_forward_pre_hook(lambda _module, _inputs: fi.reset_current_layer())
    return corrupted


def _layer_number(numbering: list[str], executed: list[str], layer: str) -> int:
    if sorted(executed) != sorted(set(executed)) or len(executed) != len(numbering):
        raise ValueError(
            f"{len(executed)} layer calls for {len(numbering)} Conv2d/Linear layers: a module runs more than "
            "once (or not at all) per forward, so pytorchfi's layer counter cannot address them"
        )
    if layer not in numbering:
        raise ValueError(f"{layer!r} is not a pytorchfi layer (leaf Conv2d/Linear); have: {', '.join(numbering)}")
    return numbering.index(layer)


def _coords(index: int, shape: tuple[int, ...]) -> tuple[int, int, int | None, int | None]:
    """A flat index as pytorchfi's (dim0, dim1, dim2, dim3), None for dimensions the tensor lacks."""
    if not 2 <= len(shape) <= 4:
        raise ValueError(f"pytorchfi addresses 2-D to 4-D tensors, not shape {shape}")
    numel = 1
    for size in shape:
        numel *= size
    if not 0 <= index < numel:
        raise ValueError(f"index {index} is out of range for shape {shape}")
    coords = [int(i) for i in torch.unravel_index(torch.tensor(index), shape)]
    padded: list[int | None] = [*coords, *([None] * (4 - len(coords)))]
    first, second = coords[0], coords[1]
    return first, second, padded[2], padded[3]


@contextmanager
def _root_logging_kept() -> Iterator[None]:
    # pytorchfi calls logging.basicConfig (broken format) and module-level logging.info, which installs a
    # default handler on an unconfigured root logger: logging configuration belongs to the application.
    root = logging.getLogger()
    handlers = list(root.handlers)
    try:
        yield
    finally:
        for handler in root.handlers[:]:
            if handler not in handlers:
                root.removeHandler(handler)


@contextmanager
def _quiet_profile(model: nn.Module) -> Iterator[None]:
    modes = {module: module.training for module in model.modules()}
    try:
        with _root_logging_kept(), torch.random.fork_rng(devices=[]), torch.no_grad():
            model.eval()
            yield
    finally:
        for module, training in modes.items():
            module.train(training)


__all__ = ["LAYER_TYPES", "pfi_injector", "pfi_layers", "pfi_neuron_flip", "pfi_weight_flip"]
