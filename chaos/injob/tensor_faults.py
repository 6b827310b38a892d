"""Applying ``bitflip`` faults inside the job: arm a fault on a model, fire it at its step, heal it exactly.

The scenario-facing params live in :mod:`injectors.tensor` (importable without torch, so the harness never
loads torch just to validate a scenario); this module is what the in-job agent runs.
"""

from __future__ import annotations

import difflib
import fnmatch
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from chaos.injob.bitflip import (
    SUPPORTED,
    Flip,
    FlipRecord,
    choose_flips,
    element_bytes,
    flip_bits,
    restore,
    scale_block,
    set_values,
)
from injectors.tensor import BitFlipParams, Kind

Emit = Callable[..., None]


class TensorFaultError(RuntimeError):
    """The fault cannot be applied as asked (no matching tensor, no gradient yet, empty optimizer state …)."""


@dataclass(frozen=True)
class TensorChange:
    """One application: which tensor (``where`` and the parameter or module name), at which step, what bytes."""

    where: str
    target: str
    step: int
    record: FlipRecord


class ArmedFault:
    """A resolved tensor fault: :meth:`fire` at each step's phase, :meth:`heal` once (idempotent).

    ``records`` lists every application in order. ``target`` names the parameter or module hit.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        params: BitFlipParams,
        rng: random.Random,
        *,
        emit: Emit | None = None,
        rank: int | None = None,
    ) -> None:
        """Resolve the fault's target (seeded); nothing is changed until :meth:`fire`.

        ``params.seed``, when set, replaces ``rng``. ``emit`` (shaped like :func:`chaos.events.emit`) receives one
        ``fault.tensor`` event per application; nothing is emitted without it. Raises :class:`TensorFaultError`
        when nothing matches ``params.layer`` or an optimizer is needed and missing.
        """
        rng = random.Random(params.seed) if params.seed is not None else rng
        self.params = params
        self.records: list[TensorChange] = []
        self._rng = rng
        self._emit = emit
        self._rank = rank
        self._optimizer = optimizer
        self._param: torch.nn.Parameter | None = None
        self._module: torch.nn.Module | None = None
        self._hook: torch.utils.hooks.RemovableHandle | None = None
        self._state_key: str | None = None
        self._choice: _Choice | None = None
        self._live: tuple[torch.Tensor, FlipRecord, bytes] | None = None  # last application still in memory
        self._start: int | None = None  # the first step fire() was called
        self._last_step: int | None = None
        self._fired_steps: list[int] = []
        self._pending_step: int | None = None  # activations: the hook flips the next forward's output
        self._healed = False
        if params.where == "activations":
            self.target, self._module = _pick_module(model, params.layer, rng)
            self._hook = self._module.register_forward_hook(self._on_forward)
        else:
            if params.where == "optimizer_state" and optimizer is None:
                raise TensorFaultError("where=optimizer_state needs the optimizer")
            self.target, self._param = _pick_param(model, optimizer, params, rng)

    # -- the step protocol -----------------------------------------------------------------------------
    def fire(self, step: int) -> list[FlipRecord] | None:
        """Apply the fault for ``step`` as its persistence says; once per step (repeat calls return None).

        Returns the records of what changed now, ``[]`` for activations (the flip happens in the coming
        forward and is appended to :attr:`records` then), or None when it does not fire at this step.
        Raises :class:`TensorFaultError` when the tensor is missing (no ``.grad`` yet, empty optimizer state).
        """
        if self._healed or step == self._last_step:
            return None
        start = step if self._start is None else self._start
        p = self.params
        if (
            (p.persistence == "transient" and self._fired_steps)
            or (p.persistence != "transient" and p.steps is not None and step >= start + p.steps)
            or (p.persistence == "intermittent" and self._rng.random() >= p.probability)
        ):
            self._start, self._last_step = start, step
            return None
        if self._module is not None:
            self._pending_step = step
            result: list[FlipRecord] = []
        else:
            result = [self._apply(step)]
        # Only now: a fire that raised (no gradient yet …) consumes neither the step nor the transient shot.
        self._start, self._last_step = start, step
        self._fired_steps.append(step)
        return result

    def expired(self, step: int) -> bool:
        """True once the fault will never fire again after ``step`` (time to heal it); always after heal.

        A transient fault is expired from its firing step on, so a caller that heals on expiry at the end of
        each step (as :mod:`chaos.agent` does) gives a transient weight or optimizer-state flip a window of
        exactly one step. Stuck/intermittent faults expire after ``steps`` steps from the first ``fire``
        call, never when ``steps`` is None.
        """
        if self._healed:
            return True
        if self._start is None:
            return False
        if self.params.persistence == "transient":
            return bool(self._fired_steps) and step >= self._fired_steps[0]
        return self.params.steps is not None and step >= self._start + self.params.steps - 1

    def heal(self) -> None:
        """Remove the hook and put back the exact original bytes of what is still corrupted. Idempotent."""
        if self._healed:
            return
        self._healed = True
        self._pending_step = None
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        self._undo_live()

    @property
    def fired(self) -> int:
        """How many steps it fired at (for activations: was armed for; see :attr:`records` for the flips)."""
        return len(self._fired_steps)

    def describe(self) -> str:
        """One line for the history: what, where, how long, and the exact elements once it has fired."""
        p = self.params
        what = p.kind if p.kind != "scale" else f"scale x{p.factor:g} of {p.block}"
        if p.kind == "bitflip":
            what += f" ({p.bit if p.bit is not None else 'any'} bit, {p.count}x)"
        if p.persistence == "transient":
            how = "transient"
        else:
            span = f"{p.steps} steps" if p.steps is not None else "until healed"
            how = p.persistence + (f" p={p.probability:g}" if p.persistence == "intermittent" else "") + f", {span}"
        where = p.where + (f"[{self._state_key}]" if self._state_key else "")
        line = f"{what} in {where} of {self.target}, {how}"
        if self.records:
            last = self.records[-1].record
            line += f"; {last.dtype.removeprefix('torch.')} {last.detail}"
        return line

    # -- applying --------------------------------------------------------------------------------------
    def _apply(self, step: int) -> FlipRecord:
        tensor = self._current_tensor()
        self._undo_live()  # restore first: a stuck value is re-forced, never toggled back or compounded
        record = self._corrupt(tensor)
        # What we wrote matters only for the compare-and-restore of gradients; skip the read elsewhere.
        written = element_bytes(tensor, record.indices) if self.params.where == "gradients" else b""
        self._live = (tensor, record, written)
        self._note(step, record)
        return record

    def _on_forward(self, module: torch.nn.Module, inputs: Any, output: Any) -> None:
        step = self._pending_step
        if step is None:
            return
        self._pending_step = None  # once per fire, even when the module runs several times per forward
        self._note(step, self._corrupt(_first_float_tensor(output, self.target)))

    def _note(self, step: int, record: FlipRecord) -> None:
        self.records.append(TensorChange(self.params.where, self.target, step, record))
        if self._emit is not None:
            self._emit(
                "fault.tensor",
                rank=self._rank,
                step=step,
                where=self.params.where,
                target=self.target,
                corruption=record.kind,  # not "kind": that is emit's own first parameter
                indices=list(record.indices[:16]),
                detail=record.detail,
            )

    def _undo_live(self) -> None:
        if self._live is None:
            return
        tensor, record, written = self._live
        self._live = None
        # Weights and optimizer state keep their identity across steps: restore unconditionally. A gradient
        # is rewritten every step: restore only if it still holds our bytes, else it is someone else's now.
        if self.params.where != "gradients" or element_bytes(tensor, record.indices) == written:
            restore(tensor, record)

    def _current_tensor(self) -> torch.Tensor:
        param = self._param
        assert param is not None
        if self.params.where == "weights":
            return param
        if self.params.where == "gradients":
            if param.grad is None:
                raise TensorFaultError(f"{self.target} has no gradient at this point: fire after backward")
            return param.grad
        assert self._optimizer is not None
        state = self._optimizer.state.get(param, {})
        keys = sorted(
            k
            for k, v in state.items()
            if k != "step" and isinstance(v, torch.Tensor) and v.dtype in SUPPORTED and v.numel() == param.numel()
        )
        if not keys:
            raise TensorFaultError(
                f"optimizer state of {self.target} has no float tensor yet (fire after the first optimizer step)"
            )
        if self._state_key not in keys:
            self._state_key = self._rng.choice(keys)
        tensor = state[self._state_key]
        assert isinstance(tensor, torch.Tensor)
        return tensor

    def _corrupt(self, tensor: torch.Tensor) -> FlipRecord:
        if tensor.dtype not in SUPPORTED:
            raise TensorFaultError(f"{self.target} is {tensor.dtype}; supported: {', '.join(map(str, SUPPORTED))}")
        numel = tensor.numel()
        # Stuck and intermittent faults hit the same element and bits every time (a stuck cell, not a new
        # upset); the choice is re-drawn only if the tensor shrank under it (a smaller activation batch).
        if self._choice is None or not self._choice.fits(numel, tensor.dtype):
            self._choice = _Choice.draw(self.params, numel, tensor.dtype, self._rng)
        return self._choice.apply(tensor)


@dataclass(frozen=True)
class _Choice:
    """Where the fault lands in one tensor: the flips (bitflip), the elements (nan/inf) or the block (scale)."""

    kind: Kind
    dtype: torch.dtype
    flips: tuple[tuple[int, int], ...] = ()
    start: int = 0
    length: int = 0
    factor: float = 1.0

    @staticmethod
    def draw(p: BitFlipParams, numel: int, dtype: torch.dtype, rng: random.Random) -> _Choice:
        try:
            if p.kind == "scale":
                # A block longer than the tensor (or than what follows `element`) is cut at the tensor's end.
                start = p.element if p.element is not None else rng.randrange(max(numel - p.block, 0) + 1)
                if start >= numel:
                    raise ValueError(f"element {start} is out of range for {numel} elements")
                length = min(p.block, numel - start)
                return _Choice("scale", dtype, start=start, length=length, factor=p.factor)
            bit = p.bit if p.kind == "bitflip" else 0  # nan/inf only need the elements: no bit draw
            flips = choose_flips(numel, dtype, rng, element=p.element, bit=bit, count=p.count)
        except ValueError as exc:
            raise TensorFaultError(str(exc)) from None
        return _Choice(p.kind, dtype, flips=tuple((f.index, f.bit) for f in flips))

    def fits(self, numel: int, dtype: torch.dtype) -> bool:
        if dtype != self.dtype:
            return False
        if self.kind == "scale":
            return self.start + self.length <= numel
        return all(index < numel for index, _bit in self.flips)

    def apply(self, tensor: torch.Tensor) -> FlipRecord:
        if self.kind == "scale":
            return scale_block(tensor, self.start, self.length, self.factor)
        if self.kind == "bitflip":
            return flip_bits(tensor, [Flip(i, b) for i, b in self.flips])
        value = float("nan") if self.kind == "nan" else float("inf")
        return set_values(tensor, [i for i, _b in self.flips], value)


# -- choosing targets ---------------------------------------------------------------------------------------


# The public entry point: arming a fault IS building the resolved ArmedFault (the seed rule lives in __init__).
arm = ArmedFault


def _pick_param(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, p: BitFlipParams, rng: random.Random
) -> tuple[str, torch.nn.Parameter]:
    owned = None
    if p.where == "optimizer_state" and optimizer is not None:
        owned = {id(t) for group in optimizer.param_groups for t in group["params"]}

    def usable(t: torch.nn.Parameter) -> bool:
        if t.dtype not in SUPPORTED or (p.where == "gradients" and not t.requires_grad):
            return False
        return owned is None or id(t) in owned

    matches: list[tuple[str, torch.nn.Parameter]] = []
    if p.layer is not None and not any(c in p.layer for c in "*?["):
        # An exact name: look it up instead of walking every module (arm is then O(depth), not O(model)).
        try:
            exact = model.get_parameter(p.layer)
        except AttributeError:
            pass
        else:
            matches = [(p.layer, exact)] if usable(exact) else []
    if not matches:
        named = [(n, t) for n, t in model.named_parameters() if usable(t)]
        matches = [(n, t) for n, t in named if p.layer is None or fnmatch.fnmatchcase(n, p.layer)]
        if not matches:
            raise TensorFaultError(_no_match("parameter", p.layer, [n for n, _ in named]))
    if isinstance(p.bit, int):
        for name, tensor in matches:
            width = tensor.element_size() * 8
            if p.bit >= width:
                raise TensorFaultError(f"bit {p.bit} is outside {name} ({tensor.dtype}: bits 0..{width - 1})")
    # Weighted by size: every element of the model equally likely, as for a physical upset.
    name, param = rng.choices(matches, weights=[t.numel() for _, t in matches])[0]
    return name, param


def _pick_module(model: torch.nn.Module, layer: str | None, rng: random.Random) -> tuple[str, torch.nn.Module]:
    named = [(n, m) for n, m in model.named_modules() if n]
    if layer is None:
        matches = [(n, m) for n, m in named if next(m.children(), None) is None]
    else:
        matches = [(n, m) for n, m in named if fnmatch.fnmatchcase(n, layer)]
    if not matches:
        raise TensorFaultError(_no_match("module", layer, [n for n, _ in named]))
    return rng.choice(matches)


def _no_match(what: str, layer: str | None, names: list[str]) -> str:
    if not names:
        return f"the model has no float {what} to corrupt"
    hint = difflib.get_close_matches(layer or "", names, n=3)
    shown = ", ".join(names[:8]) + (" …" if len(names) > 8 else "")
    suggestion = f"; did you mean {', '.join(hint)}?" if hint else ""
    return f"no {what} name matches {layer!r} (have: {shown}){suggestion}"


def _first_float_tensor(output: Any, target: str) -> torch.Tensor:
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, tuple | list):
        for item in output:
            if isinstance(item, torch.Tensor) and item.dtype in SUPPORTED:
                return item
    raise TensorFaultError(f"module {target} returned {type(output).__name__}, not a float tensor to corrupt")


__all__ = ["ArmedFault", "TensorChange", "TensorFaultError", "arm"]
