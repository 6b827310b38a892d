"""The agent's guards as one value: what ``attach(..., guard=...)`` takes.

``guard="checksum"`` is ``Guards(checksum=True)``; ``guard="none"`` (the default) is ``Guards()``: no checksum,
no anomaly guard, and the cross-rank consistency check at its default interval (it only runs where a job has
more than one data-parallel rank).
"""

from __future__ import annotations

from dataclasses import dataclass

from chaos.guards.checksum import ChecksumConfig
from chaos.guards.consistency import DEFAULT_EVERY


@dataclass(frozen=True)
class Guards:
    """Which guards the agent runs, as one value: ``attach(model, optimizer, ddp=ddp, guard=Guards(checksum=True,
    anomaly=True))``.

    ``checksum``: verify every gradient bucket's all-reduce (True, or a :class:`ChecksumConfig`; needs ``ddp=`` or
    ``manager=``). ``anomaly``: skip a step whose gradients are non-finite or spike (under torchft: report it, so
    the step is not committed). ``consistency_every``: compare the ranks' parameters every N steps (0: off; a loop
    whose ranks run different numbers of steps must turn it off). ``consistency_optimizer``: hash the optimizer's
    state into that comparison too."""

    checksum: bool | ChecksumConfig = False
    anomaly: bool = False
    consistency_every: int = DEFAULT_EVERY
    consistency_optimizer: bool = False

    @classmethod
    def of(cls, guard: str | Guards) -> Guards:
        """``guard`` as :class:`Guards`: itself, or ``"checksum"`` / ``"none"``; ValueError naming the choices."""
        if isinstance(guard, Guards):
            return guard
        if guard == "checksum":
            return cls(checksum=True)
        if guard == "none":
            return cls()
        raise ValueError(f"guard={guard!r}: pass 'checksum', 'none' or Guards(checksum=..., anomaly=..., ...)")

    @property
    def mode(self) -> str:
        """``"checksum"`` when the checksum guard is on, else ``"none"`` (what the reductions are told)."""
        return "checksum" if self.checksum is not False else "none"

    @property
    def checksum_config(self) -> ChecksumConfig | None:
        return self.checksum if isinstance(self.checksum, ChecksumConfig) else None
