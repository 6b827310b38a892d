"""The in-job agent for PyTorch Lightning users: one callback instead of the loop hooks (the ``lightning`` extra).

    from chaos.integrations.lightning import ChaosCallback
    trainer = lightning.Trainer(..., callbacks=[ChaosCallback(guard="checksum")])

What it does, hook by hook (automatic optimization, one optimizer, ``accumulate_grad_batches=1``):

- ``on_fit_start`` (after the strategy wrapped the model): ``chaos.agent.attach(pl_module, optimizer=the
  trainer's optimizer, ddp=the strategy's DistributedDataParallel when there is one, **options)``; the agent's
  comm hook goes on that DDP module (a ``DDPStrategy(ddp_comm_hook=...)`` of your own would take DDP's one hook:
  attach then refuses, as DDP does);
- ``on_train_batch_start``: ``begin_step(trainer.global_step + 1)`` (steps are optimizer steps, 1-based);
- ``on_before_backward`` keeps the loss, ``on_after_backward``: ``after_backward(loss)``;
- ``on_before_optimizer_step``: ``allow_optimizer_step()``; when a guard agreed to skip the step, every gradient
  is set to None, which torch's optimizers skip (no update, no optimizer state change), and ``target.step_skipped``
  is reported by the agent;
- ``on_train_batch_end``: ``end_step()``; ``on_fit_end`` / ``teardown``: ``close()`` (heals, reports the digest).

Sample ids are not reported (Lightning builds its DataLoader after ``on_fit_start``): a job that needs them
calls ``callback.agent.track(loader)`` itself. Checkpoints Lightning writes with ``torch.save`` are seen as usual.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

try:
    import lightning.pytorch as pl
except ImportError as exc:  # pragma: no cover - exercised where the extra is absent
    raise ImportError(
        "chaos.integrations.lightning needs PyTorch Lightning: pip install -e '.[lightning]' (or pip install lightning)"
    ) from exc

import chaos.agent
from chaos.agent import Agent


class ChaosCallback(pl.Callback):  # type: ignore[misc, unused-ignore]  # Any where lightning has no stubs
    """Attach mlchaos's in-job agent to a Lightning Trainer (see the module docstring). ``options`` go to
    :func:`chaos.agent.attach` (``guard``: "checksum", "none" or ``Guards(...)``; ``data``, ``job_emits``)."""

    def __init__(self, **options: Any) -> None:
        super().__init__()
        for key in ("optimizer", "ddp", "manager"):
            if key in options:
                raise ValueError(f"ChaosCallback finds {key}= on the Trainer itself: leave it out")
        self.options = options
        self.agent: Agent | None = None
        self._loss: torch.Tensor | None = None

    def on_fit_start(self, trainer: Any, pl_module: nn.Module) -> None:
        optimizers = list(trainer.optimizers)
        if len(optimizers) > 1:
            raise ValueError(f"ChaosCallback drives one optimizer; this Trainer has {len(optimizers)}")
        wrapped = getattr(trainer.strategy, "model", None)
        ddp = wrapped if isinstance(wrapped, nn.parallel.DistributedDataParallel) else None
        optimizer = optimizers[0] if optimizers else None
        self.agent = chaos.agent.attach(pl_module, optimizer=optimizer, ddp=ddp, hooks=False, **self.options)

    def on_train_batch_start(self, trainer: Any, pl_module: nn.Module, batch: Any, batch_idx: int) -> None:
        if self.agent is not None:
            self.agent.begin_step(int(trainer.global_step) + 1)

    def on_before_backward(self, trainer: Any, pl_module: nn.Module, loss: torch.Tensor) -> None:
        self._loss = loss

    def on_after_backward(self, trainer: Any, pl_module: nn.Module) -> None:
        if self.agent is not None:
            self.agent.after_backward(self._loss)
        self._loss = None

    def on_before_optimizer_step(self, trainer: Any, pl_module: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        if self.agent is not None and not self.agent.allow_optimizer_step():
            for group in optimizer.param_groups:
                for param in group["params"]:
                    param.grad = None  # torch's optimizers skip parameters without a gradient

    def on_train_batch_end(self, trainer: Any, pl_module: nn.Module, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.agent is not None:
            self.agent.end_step()

    def on_fit_end(self, trainer: Any, pl_module: nn.Module) -> None:
        self._close()

    def teardown(self, trainer: Any, pl_module: nn.Module, stage: str) -> None:
        self._close()

    def _close(self) -> None:
        if self.agent is not None:
            self.agent.close()  # idempotent


__all__ = ["ChaosCallback"]
