"""The one-line agent's hooks: ``agent = chaos.agent.attach(model, optimizer)`` and no other line in the loop.

:class:`LoopHooks` makes the agent's per-step calls from a forward pre-hook (``begin_step``), the optimizer's
step pre-hook (``after_backward``, ``allow_optimizer_step``; a skipped step becomes a no-op) and post-hook
(``end_step``), torchft's commit vote, ``atexit`` (close without the last consistency exchange) and
``sys.excepthook`` (a collective failure reported as ``detect.*``). :meth:`LoopHooks.remove` undoes them; the
loop's first explicit call does too. Step numbers are exact or not reported (``target.step_source``). Each
hook's contract and why: ``docs/design/loop-hooks.md``.
"""

from __future__ import annotations

import atexit
import os
import re
import sys
from collections.abc import Callable, Collection
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from chaos.event_kinds import DETECT_COLLECTIVE_ERROR, DETECT_COLLECTIVE_TIMEOUT, DETECT_OOM, DETECT_PEER_LOST
from chaos.event_kinds import TARGET_STEP_SOURCE as STEP_SOURCE
from chaos.injob.crash_faults import InjectedFault

Emit = Callable[..., None]
HOOKS = ("forward", "optimizer", "commit", "atexit", "excepthook")
"""The one-line tier's hooks (:mod:`chaos.injob.loop_hooks`): a forward pre-hook that begins a step; the
optimizer's step pre/post hooks (the backward and optimizer-step phases, the step's end); torchft's commit vote
(``Manager.should_commit``, with ``manager=``); ``atexit`` (the digest at a normal exit); ``sys.excepthook``
(a collective failure reported as ``detect.*``)."""


def hook_names(hooks: bool | Collection[str]) -> frozenset[str]:
    """The hooks to install: all (True), none (False), or the named ones; ValueError for an unknown name."""
    if isinstance(hooks, bool):
        return frozenset(HOOKS) if hooks else frozenset()
    unknown = sorted(set(hooks) - set(HOOKS))
    if unknown:
        raise ValueError(f"hooks={sorted(hooks)!r}: unknown {', '.join(unknown)} (choose from {', '.join(HOOKS)})")
    return frozenset(hooks)


_TIMEOUT = re.compile(r"timed out|timeout", re.IGNORECASE)
_PEER_LOST = re.compile(
    r"connection (reset|closed) by peer|connectFullMesh|broken pipe|connection refused|Socket closed", re.IGNORECASE
)
_COLLECTIVE = re.compile(r"gloo|nccl|c10d|ProcessGroup|collective|all_?reduce|barrier", re.IGNORECASE)


def collective_failure(exc: BaseException) -> str | None:
    """The ``detect.*`` kind an uncaught exception stands for, or None for one that is not a collective's
    failure (a bug in the script is the job's error, not a detection; so is a ``crash`` fault's exception)."""
    if isinstance(exc, InjectedFault):
        return None
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in text.lower():
        return DETECT_OOM
    distributed = isinstance(exc, dist.DistError) or bool(_COLLECTIVE.search(text))
    if not distributed:
        return None
    if _PEER_LOST.search(text):
        return DETECT_PEER_LOST
    if _TIMEOUT.search(text):
        return DETECT_COLLECTIVE_TIMEOUT
    return DETECT_COLLECTIVE_ERROR


def optimizer_count(optimizer: torch.optim.Optimizer) -> int | None:
    """The optimizer's own step count (the highest ``state["step"]`` of its parameters), None when none has one."""
    counts = [int(state["step"]) for state in optimizer.state.values() if "step" in state]
    return max(counts) if counts else None


def keeps_count(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer`` is a torch optimizer that records ``state["step"]`` (all but SGD and LBFGS)."""
    torch_made = type(optimizer).__module__.startswith("torch.optim.")
    return torch_made and not isinstance(optimizer, (torch.optim.SGD, torch.optim.LBFGS))


@dataclass
class LoopCalls:
    """The agent's per-step calls the hooks make, and its close at a normal exit."""

    begin: Callable[[int], None]
    after_backward: Callable[[], None]
    allow: Callable[[], bool]
    end: Callable[[], None]
    at_exit: Callable[[], None]


class LoopHooks:
    """Drives an agent's per-step calls from hooks on the loop's own module and optimizer (module docstring)."""

    def __init__(
        self,
        calls: LoopCalls,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        rank: int,
        emit: Emit,
        manager: Any | None = None,
        install: frozenset[str] = frozenset(HOOKS),
    ) -> None:
        self.calls = calls
        inner = getattr(optimizer, "optim", None)
        if type(optimizer).__module__.startswith("torchft") and isinstance(inner, torch.optim.Optimizer):
            optimizer = inner  # torchft's OptimizerWrapper: its step runs the inner one's hooks
        self.optimizer = optimizer
        self.rank = rank
        self.emit = emit
        self.manager = manager
        self.manager_step: Callable[[], int] | None = None if manager is None else manager.current_step
        self.phases_done = False  # the backward and optimizer_step phases ran in this step (torchft: at the vote)
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        self.attempt = int(attempt) if attempt.isdigit() else 0
        self.step = 0
        self.taken = 0
        self.open = False
        self.stood_down = False
        self.died = False
        self._handles = [module.register_forward_pre_hook(self._before_forward)] if "forward" in install else []
        if "optimizer" in install:
            self._handles.append(optimizer.register_step_pre_hook(self._before_optimizer_step))
            self._handles.append(optimizer.register_step_post_hook(self._after_optimizer_step))
        if manager is not None and "commit" in install:
            manager.should_commit = self._wrap_commit(manager.should_commit)
        self._previous_excepthook = sys.excepthook
        if "excepthook" in install:
            sys.excepthook = self._uncaught
        if "atexit" in install:
            atexit.register(self._at_exit)

    def remove(self) -> None:
        """Undo every hook (idempotent)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if self.manager is not None and getattr(vars(self.manager).get("should_commit"), "_chaos_hook", None) is self:
            del self.manager.should_commit  # the class's own method again
        if sys.excepthook == self._uncaught:
            sys.excepthook = self._previous_excepthook
        atexit.unregister(self._at_exit)

    # -- the step ---------------------------------------------------------------------------------------
    def next_step(self) -> int | None:
        """The number of the step about to begin, or None when it cannot be known exactly (module docstring)."""
        if self.manager_step is not None:
            return self.manager_step() + 1
        counted = optimizer_count(self.optimizer)
        if counted is not None:
            return counted + 1
        if self.taken > 0:
            return self.step + 1
        if self.attempt == 0 or keeps_count(self.optimizer):
            return 1
        return None

    def _before_forward(self, module: nn.Module, args: object) -> None:
        if self.open or self.stood_down:
            return
        step = self.next_step()
        if step is None:
            self.stood_down = True
            reason = (
                f"{type(self.optimizer).__name__} keeps no step count and this is restart {self.attempt}: a resume "
                "cannot be told from a fresh start. Call agent.begin_step(step) at the top of the loop (and the "
                "other per-step calls), or use an optimizer that keeps state['step'] (Adam, AdamW, ...)"
            )
            self.emit(STEP_SOURCE, rank=self.rank, exact=False, source="agent", reason=reason)
            return
        self.open = True
        self.phases_done = False
        self.step = step
        self.calls.begin(step)

    def _wrap_commit(self, should_commit: Callable[..., bool]) -> Callable[..., bool]:
        def vote(*args: Any, **kwargs: Any) -> bool:
            if self.open and not self.phases_done:
                self.phases_done = True
                self.calls.after_backward()
                self.calls.allow()  # always True under torchft: a detection went to manager.report_error
            committed = should_commit(*args, **kwargs)
            if self.open and not committed:  # torchft drops the step: the inner optimizer will not step
                self.open = False
                self.calls.end()
            return committed

        vote._chaos_hook = self  # type: ignore[attr-defined]
        return vote

    def _before_optimizer_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if not self.open or self.phases_done:
            return  # no forward through the hooked module began this step: not the loop the agent follows
        self.phases_done = True
        self.calls.after_backward()
        if not self.calls.allow():
            for group in optimizer.param_groups:
                for param in group["params"]:
                    param.grad = None  # torch's optimizers skip a parameter without a gradient: a skipped step

    def _after_optimizer_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if not self.open:
            return
        self.open = False
        self.taken += 1
        self.calls.end()

    # -- the end ----------------------------------------------------------------------------------------
    def _uncaught(self, kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        self.died = True
        detected = collective_failure(exc)
        if detected is not None:
            self.emit(detected, rank=self.rank, detector="agent", step=self.step, error=f"{kind.__name__}: {exc}"[:400])
        self._previous_excepthook(kind, exc, tb)

    def _at_exit(self) -> None:
        if not self.died:
            self.calls.at_exit()
