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

from chaos.event_kinds import FAULT_TENSOR
from chaos.injob.bitflip import (
    SUPPORTED,
    Flip,
    FlipRecord,
    UndoRecord,
    choose_flips,
    element_bytes,
    flip_bits,
    scale_block,
    set_values,
    undo_change,
)
from chaos.injob.fault_specs import BitFlipSpec, Kind, Validated

Emit = Callable[..., None]
ONCE = ("transient", "latent")  # the persistences that fire exactly once


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

    ``records`` lists every application in order. ``target`` names the parameter or module hit;
    ``state_key`` the optimizer-state tensor hit (``where: optimizer_state``, known from the first fire);
    ``healing`` what the heal did per element (see :meth:`heal`, :meth:`describe_heal`).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        params: BitFlipSpec | Validated,
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
        self.params = params = BitFlipSpec.of(params)
        rng = random.Random(params.seed) if params.seed is not None else rng
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
        # The last application still in memory: the tensor, its record, and the bytes it wrote.
        self._live: tuple[torch.Tensor, FlipRecord, bytes] | None = None
        self.healing: UndoRecord | None = None  # set by heal() when something was still applied
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
            (p.persistence in ONCE and self._fired_steps)
            or (p.persistence not in ONCE and p.steps is not None and step >= start + p.steps)
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
        if self.params.persistence == "latent":
            return False  # never undone while the job runs: the job must overwrite it (reload, rollback)
        if self.params.persistence == "transient":
            return bool(self._fired_steps) and step >= self._fired_steps[0]
        return self.params.steps is not None and step >= self._start + self.params.steps - 1

    def heal(self) -> None:
        """Remove exactly the fault's change from what it still corrupts, keeping every later update. Idempotent.

        Per element of the last application (the one still in memory), as :func:`chaos.injob.bitflip.undo_change`
        does it; :attr:`healing` records the outcome, :meth:`describe_heal` says it in one line:

        - **Untouched since the fault** (a transient flip healed before any optimizer step, a stuck value on a
          skipped step, any fault in a model nobody trains): the exact original bytes go back. An update too
          small to change a huge corrupted value (an exponent flip to ~1e38) leaves the same bytes too, so that
          step's update to the element is lost: no arithmetic on values can recover an update that left no trace.
        - **Weights and optimizer state updated since** (healed at the end of the step, after
          ``optimizer.step()``): the element becomes ``original + (current - corrupted)``, in float32 as the
          optimizer computes. The optimizer's update is kept and only the fault's write is removed. For weights
          under an update that does not read the weight (Adam, SGD without weight decay) fired after backward,
          this is the fault-free value bit for bit in the common case: for any mantissa or sign flip, except
          where the fault-free result crosses a power of two or, for an odd number of ulps (bit 0), is a
          rounding tie that round-half-even breaks the other way (about ulp(update) / ulp(weight) of elements,
          ~1% at lr 1e-3 on weights ~0.1); those end one ulp off. For optimizer state it removes
          the write, not the optimizer's arithmetic on it: Adam's ``exp_avg <- b1*exp_avg + (1-b1)*g`` had
          already shrunk the fault's delta ``d`` to ``b1*d``, so ``-(1-b1)*d`` remains, below one ulp for a
          one-ulp flip (the result is the fault-free state or one ulp from it; for ``exp_avg_sq``, ``b2 =
          0.999``, nearly always the former). What the corrupted state did to that step's weight update is real
          training history and stays.
        - **Non-finite values** (nan/inf kinds, exponent flips to Inf): the original bytes when the element is
          still non-finite; left alone when it became finite, since only an overwrite (a repair, a reload) does
          that and the stale original would corrupt it; left alone too when finite values went non-finite in
          the update itself (the divergence is the job's to show, not the heal's to hide).
        - **Gradients** (rewritten every step): the original bytes only where the gradient still holds exactly
          what the fault wrote; anything else is a fresh gradient and is left alone.
        - **Activations**: the forward hook is removed; outputs are recomputed every forward.
        """
        if self._healed:
            return
        self._healed = True
        self._pending_step = None
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self.params.persistence == "latent":
            return  # a latent upset is never undone: by now the job has kept it, or overwritten it (a reload)
        self.healing = self._undo_live()

    @property
    def state_key(self) -> str | None:
        """The optimizer-state key hit (``exp_avg``, ``momentum_buffer`` …); None before the first fire and for
        other ``where``s. ``params.state`` when given, else the seeded draw among the eligible keys."""
        return self._state_key

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
        if p.persistence in ONCE:
            how: str = p.persistence
        else:
            span = f"{p.steps} steps" if p.steps is not None else "until healed"
            how = p.persistence + (f" p={p.probability:g}" if p.persistence == "intermittent" else "") + f", {span}"
        where = p.where + (f"[{self._state_key}]" if self._state_key else "")
        line = f"{what} in {where} of {self.target}, {how}"
        if self.records:
            last = self.records[-1].record
            line += f"; {last.dtype.removeprefix('torch.')} {last.detail}"
        return line

    def describe_heal(self) -> str:
        """One line for the history's ``fault.healed``: what the heal did per element (see :meth:`heal`).

        E.g. ``delta removed [37] in weights of 2.bias (later updates kept)``; before :meth:`heal` it says so.
        """
        if not self._healed:
            return "not healed yet"
        if self.params.where == "activations":
            return f"forward hook on {self.target} removed (activations are recomputed every forward)"
        where = self.params.where + (f"[{self._state_key}]" if self._state_key else "")
        if self.params.persistence == "latent":
            return f"latent: left as the job holds it in {where} of {self.target} (never undone by the agent)"
        if self.healing is None:
            return f"nothing applied in {where} of {self.target}: nothing to undo"
        line = f"{self.healing.summary()} in {where} of {self.target}"
        if self.healing.delta_removed:
            line += " (later updates kept)"
        return line

    # -- applying --------------------------------------------------------------------------------------
    def _apply(self, step: int) -> FlipRecord:
        tensor = self._current_tensor()
        # Undo the previous application first (keeping the updates made since): a stuck fault re-applies the
        # same corruption to the value training would hold without it, never toggled back or compounded.
        self._undo_live()
        record = self._corrupt(tensor)
        # The bytes written: an element still holding them is untouched, and they give the fault's delta.
        self._live = (tensor, record, element_bytes(tensor, record.indices))
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
                FAULT_TENSOR,
                rank=self._rank,
                step=step,
                where=self.params.where,
                target=self.target,
                corruption=record.kind,  # not "kind": that is emit's own first parameter
                indices=list(record.indices[:16]),
                detail=record.detail,
                **({"state": self._state_key} if self._state_key else {}),
            )

    def _undo_live(self) -> UndoRecord | None:
        if self._live is None:
            return None
        tensor, record, written = self._live
        self._live = None
        # Weights and optimizer state keep their identity across steps and are updated in place: remove the
        # fault's delta and keep the updates. A gradient is rewritten every step: restore only if it still
        # holds our bytes, else it is someone else's now.
        return undo_change(tensor, record, written, keep_updates=self.params.where != "gradients", carry=self._carry())

    def _carry(self) -> float | None:
        """How the optimizer carries the hit value into its update (see :func:`undo_change`): 1 for weights; for
        optimizer state the decay of that moment in the parameter's group (Adam/AdamW ``betas``, SGD
        ``momentum``), None when this optimizer's rule for the key is unknown (heal then restores the original)."""
        if self.params.where != "optimizer_state":
            return 1.0
        group = (
            next((g for g in self._optimizer.param_groups if any(t is self._param for t in g["params"])), None)
            if self._optimizer is not None
            else None
        )
        if group is None:
            return None
        betas = group.get("betas")
        if isinstance(betas, tuple | list) and len(betas) == 2 and self._state_key in ("exp_avg", "exp_avg_sq"):
            return float(betas[0] if self._state_key == "exp_avg" else betas[1])
        momentum = group.get("momentum")
        if self._state_key == "momentum_buffer" and isinstance(momentum, int | float) and momentum > 0:
            return float(momentum)
        return None

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
            # Drawn even when `state:` names the key, so naming the key the draw would pick corrupts the same
            # elements as leaving it out (the element draw comes next from the same stream).
            drawn = self._rng.choice(keys)
            wanted = self.params.state
            if wanted is not None and wanted not in keys:
                others = sorted(set(map(str, state)) - set(keys))
                ineligible = f" (not float tensors the size of the parameter: {', '.join(others)})" if others else ""
                raise TensorFaultError(
                    f"optimizer state of {self.target} has no {wanted!r}: available {', '.join(keys)}{ineligible}"
                )
            self._state_key = wanted or drawn
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
    def draw(p: BitFlipSpec, numel: int, dtype: torch.dtype, rng: random.Random) -> _Choice:
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
    model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, p: BitFlipSpec, rng: random.Random
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
