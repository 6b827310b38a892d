"""A user's PyTorch Lightning script (CPU, DDP on gloo) with the one mlchaos line: ``ChaosCallback`` in the
Trainer's callbacks. It imports nothing else from ``chaos``. Run under torchrun (Lightning picks up its env)::

    torchrun --standalone --nproc-per-node 2 tests/jobs/user_lightning.py --steps 6 --guard checksum
"""

from __future__ import annotations

import argparse

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from chaos.integrations.lightning import ChaosCallback


class Regressor(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 4))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--guard", choices=["none", "checksum"], default="checksum")
    parser.add_argument("--devices", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    pl.seed_everything(0, verbose=False)
    gen = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(256, 8, generator=gen), torch.randn(256, 4, generator=gen))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",
        max_steps=args.steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[ChaosCallback(guard=args.guard)],
    )
    trainer.fit(Regressor(), DataLoader(data, batch_size=16))
    # Lightning leaves the process group to the script. Exiting without destroying it lets gloo's worker threads
    # outlive the interpreter: an occasional SIGABRT ("terminate called without an active exception") at exit,
    # torch's own known behaviour (seen once in ~1,500 CI tests), not a fault of the run.
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
