"""The in-job agent on FSDP: what works, and what is refused at attach and why.

- FSDP1 (``torch.distributed.fsdp.FullyShardedDataParallel``, passed as ``ddp=``): FSDP1 takes one communication
  hook (``register_comm_hook``, root module, before the first forward) in which the agent runs FSDP's default
  reduction itself, with the same pre- and post-division (``DefaultState``), so a clean step is what FSDP alone
  computes: ``reduce_scatter`` into this rank's shard (sharded strategies) or ``all_reduce`` (``NO_SHARD``). A
  ``kill`` at phase ``allreduce`` fires right after that collective started, before waiting for it;
  ``grad_corrupt`` fires at ``local`` (the unsharded local gradient), ``in_transit`` (the send buffer after the
  pre-division) and ``post_reduce`` (this rank's received shard); the anomaly guard sees the local gradient.
  ``bucket`` is the hook call's index in the step (one per FSDP unit, in FSDP's order).
- The checksum guard on FSDP1 is refused: it verifies an ALL-reduce, where every rank receives the whole reduced
  bucket and checks each block against the summed declarations; FSDP1 reduce-scatters, so a rank holds only its
  own shard and a verification would need per-shard declarations that the guard does not implement (with
  ``NO_SHARD`` FSDP does all-reduce, but FSDP1 hands the hook a flat gradient without DDP's bucket: not wired).
- FSDP2 (``fully_shard``, an ``FSDPModule``) is refused for every in-collective feature: it has no communication
  hook at all (its reduce-scatter runs inside FSDP's own ``post_backward``), so there is no place for the agent
  inside the collective. Phase faults at ``forward``/``backward``/``optimizer_step``, tensor faults and the
  progress reports work without ``ddp=``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

Corrupt = Callable[[Any, int, torch.Tensor], None]


def is_fsdp1(module: object) -> bool:
    """Whether ``module`` is an FSDP1 ``FullyShardedDataParallel``."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    return isinstance(module, FullyShardedDataParallel)


def is_fsdp2(module: object) -> bool:
    """Whether ``module`` was sharded with FSDP2's ``fully_shard`` (an ``FSDPModule``)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


def refuse(module: nn.Module, *, guard: str) -> None:
    """ValueError for what the agent cannot do on this FSDP module (see the module docstring)."""
    if is_fsdp2(module):
        raise ValueError(
            "ddp= is an FSDP2 module (fully_shard): FSDP2 has no communication hook, its reduce-scatter runs inside "
            "FSDP's post-backward, so the agent has no place inside the collective (checksum guard, grad_corrupt, "
            "phase allreduce); leave ddp= out for the other faults and the progress reports, or use FSDP1 "
            "(FullyShardedDataParallel) for faults inside the reduction"
        )
    if guard == "checksum":
        raise ValueError(
            "guard='checksum' verifies an all-reduce (every rank checks the whole reduced bucket), but FSDP "
            "reduce-scatters: each rank receives only its shard, which the guard cannot verify; pass guard='none' "
            "(grad_corrupt and phase-allreduce faults still fire inside FSDP's reduction), or use DDP"
        )


class FsdpReduction:
    """The state of the agent's FSDP1 comm hook: FSDP's default reduction with the agent's points inside."""

    def __init__(
        self,
        fsdp: nn.Module,
        *,
        corrupt: Corrupt,
        in_flight: Callable[[int], None],
        observe: Callable[[int, torch.Tensor], None] | None,
    ) -> None:
        from torch.distributed.algorithms._comm_hooks.default_hooks import DefaultState

        group = getattr(fsdp, "process_group", None)
        self.group: dist.ProcessGroup | None = group if isinstance(group, dist.ProcessGroup) else None
        divide = DefaultState(self.group if self.group is not None else dist.group.WORLD)  # type: ignore[arg-type]
        self.pre = float(divide.gradient_predivide_factor)
        self.post = float(divide.gradient_postdivide_factor)
        self.corrupt, self.in_flight, self.observe = corrupt, in_flight, observe
        self._next = 0
        fsdp.register_comm_hook(self, _fsdp_hook)  # type: ignore[operator]

    def begin_step(self) -> None:
        self._next = 0


def _fsdp_hook(state: FsdpReduction, grad: torch.Tensor, output: torch.Tensor | None = None) -> None:
    """FSDP's ``reduce_scatter_hook`` / ``allreduce_hook`` with the agent's points (see the module docstring)."""
    index = state._next
    state._next += 1
    state.corrupt("local", index, grad)
    if state.observe is not None:
        state.observe(index, grad)
    if state.pre > 1:
        grad.div_(state.pre)
    state.corrupt("in_transit", index, grad)
    if output is None:
        work = dist.all_reduce(grad, group=state.group, async_op=True)
    else:
        work = dist.reduce_scatter_tensor(output, grad, group=state.group, async_op=True)
    assert work is not None
    state.in_flight(index)  # inside the collective: started, not waited for
    work.wait()
    received = grad if output is None else output
    if state.post > 1:
        received.div_(state.post)
    state.corrupt("post_reduce", index, received)


__all__ = ["FsdpReduction", "is_fsdp1", "is_fsdp2", "refuse"]
