"""Step reports from a training script nobody edited: mlchaos's target puts this folder first on the workers'
``PYTHONPATH`` (``optimizer_steps: true``, the default), the way tracing tools auto-instrument a process.

In a rank process of a chaos run (``RANK`` and ``CHAOS_EVENTS`` set, ``CHAOS_OPTIMIZER_STEPS`` not ``0``) it
waits for the job to import ``torch``, registers one global optimizer step post-hook, and reports
``target.step`` {step, attempt, source: "optimizer"} after each ``optimizer.step()`` of the first optimizer
that steps. The step is exact or not reported:

- the optimizer's own step count when it keeps one (Adam, AdamW, RMSprop, ... keep ``state["step"]``, which a
  resume restores with the optimizer's state): correct across restarts and resumes;
- else the number of steps this process took, but only when nothing was ``torch.load``-ed before its first
  step (a fresh start); after a load (a resume) the count would restart at 1, so the job's steps are then not
  reported and one ``target.step_source`` {exact: false, reason} says why.

Under torchft (``torchft.manager`` imported) the steps are torchft's: a wrapper around ``Manager.should_commit``
reports ``target.step`` {step: ``manager.current_step()``, committed, attempt, source: "torchft"} after each
commit vote (a healed replica takes its step from its peers, so no count of its own could be right), and the
optimizer hook stands aside.

It stands down when the job reports for itself (``chaos.events`` or ``chaos.agent`` imported: the one-line
agent, or a job emitting its own events). Anything else it does not touch: it imports no mlchaos package (the
job's interpreter may not have mlchaos importable; ``chaos/events.py``, stdlib only, is loaded by its path under
a private name), and it runs the interpreter's own ``sitecustomize`` (Debian ships
one) before anything else. Stdlib and torch only.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))


def _run_the_interpreters_own() -> None:
    """Run the ``sitecustomize`` this one shadows (the next on ``sys.path``), as Python would have."""
    path = [entry for entry in sys.path if os.path.abspath(entry or ".") != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None or spec.origin == __file__:
        return
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001  (as site.py does: a broken sitecustomize is reported, not fatal)
        print(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(exc).__name__}: {exc}", file=sys.stderr)


def _load_emit() -> Any:
    """``chaos.events.emit``, loaded from its file under a private name: the job's interpreter may not have
    mlchaos importable, and ``chaos.events`` in ``sys.modules`` means "the job reports for itself" below."""
    path = os.path.join(os.path.dirname(os.path.dirname(_HERE)), "events.py")
    spec = importlib.util.spec_from_file_location("_mlchaos_bootstrap_events", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.emit


_emit: Any = None  # loaded only in a rank process of a chaos run (below)


class _StepReporter:
    """The global optimizer step post-hook (see the module docstring for which steps it reports)."""

    def __init__(self, torch: ModuleType) -> None:
        self.torch = torch
        self.optimizer: object | None = None
        self.taken = 0
        self.loaded_before_first_step = False
        self.said_inexact = False
        self.torchft = False
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "")
        self.attempt = int(attempt) if attempt.isdigit() else 0
        original_load = torch.load

        def load(*args: Any, **kwargs: Any) -> Any:
            if self.taken == 0:
                self.loaded_before_first_step = True
            return original_load(*args, **kwargs)

        load.__wrapped__ = original_load  # type: ignore[attr-defined]
        torch.load = load  # type: ignore[attr-defined]

    def on_commit(self, manager: Any, committed: bool) -> None:
        """After torchft's commit vote: torchft's step (already advanced when the step committed)."""
        self.torchft = True
        if "chaos.events" not in sys.modules:
            step = int(manager.current_step())
            _emit("target.step", step=step, committed=bool(committed), attempt=self.attempt, source="torchft")

    def __call__(self, optimizer: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
        if "chaos.events" in sys.modules or self.torchft:  # the job reports for itself, or torchft's votes do
            return
        if self.optimizer is None:
            self.optimizer = optimizer
        elif optimizer is not self.optimizer:
            return  # a second optimizer (a GAN's, say): one step count per job
        self.taken += 1
        step = self._own_count(optimizer)
        if step is None and not self.loaded_before_first_step:
            step = self.taken
        if step is None:
            if not self.said_inexact:
                self.said_inexact = True
                _emit(
                    "target.step_source",
                    exact=False,
                    attempt=self.attempt,
                    reason=f"{type(optimizer).__name__} keeps no step count and the job loaded a checkpoint before "
                    "its first step, so its steps are not known here: add chaos.agent.attach(model, optimizer) "
                    "to the script",
                )
            return
        _emit("target.step", step=step, attempt=self.attempt, source="optimizer")

    def _own_count(self, optimizer: Any) -> int | None:
        for group in optimizer.param_groups:
            for param in group["params"]:
                count = optimizer.state.get(param, {}).get("step")
                if count is not None:
                    return int(count.item()) if isinstance(count, self.torch.Tensor) else int(count)
        return None


_reporter: _StepReporter | None = None


def _on_torch(torch: ModuleType) -> None:
    global _reporter
    optimizer = importlib.import_module("torch.optim.optimizer")
    _reporter = _StepReporter(torch)
    optimizer.register_optimizer_step_post_hook(_reporter)


def _on_torchft(manager_module: ModuleType) -> None:
    """Wrap ``Manager.should_commit`` (torchft's optimizer wrapper calls it every step) to report the vote."""
    cls = manager_module.Manager
    original = cls.should_commit

    def should_commit(self: Any, *args: Any, **kwargs: Any) -> bool:
        committed = original(self, *args, **kwargs)
        if _reporter is not None:
            _reporter.on_commit(self, bool(committed))
        return bool(committed)

    should_commit.__wrapped__ = original  # type: ignore[attr-defined]
    cls.should_commit = should_commit


_WATCHED: dict[str, Any] = {"torch": _on_torch, "torchft.manager": _on_torchft}  # after its import, this


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a callback once a watched module has been imported, without importing it first (post-import hook)."""

    def find_spec(self, name: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        callback = _WATCHED.pop(name, None)
        if callback is None:
            return None
        if not _WATCHED:
            sys.meta_path.remove(self)  # every watched module seen: out of the way
        spec = importlib.util.find_spec(name)  # found by the finders after this one (the name is popped)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original_exec = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            original_exec(module)
            try:
                callback(module)
            except Exception as exc:  # noqa: BLE001  (never break the job: say why no steps come)
                _emit("target.step_source", exact=False, reason=f"step hook on {name} not installed: {exc}")

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _wanted() -> bool:
    return (
        bool(os.environ.get("CHAOS_EVENTS")) and "RANK" in os.environ and os.environ.get("CHAOS_OPTIMIZER_STEPS") != "0"
    )


_run_the_interpreters_own()
if _wanted():
    _emit = _load_emit()
    for _name in [n for n in _WATCHED if n in sys.modules]:
        _WATCHED.pop(_name)(sys.modules[_name])
    if _WATCHED:
        sys.meta_path.insert(0, _AfterImport())
