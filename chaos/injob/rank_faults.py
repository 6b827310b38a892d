"""This rank's share of the in-job plan: which ops are its own, each op's seeded rng, the cross-restart markers
every in-job fault shares, and the faults the agent fires in its own tensors: ``bitflip`` (weights, activations,
gradients, optimizer state, at a step phase; healed when its persistence runs out or at close) and
``grad_corrupt`` (a bucket at a site inside the gradient all-reduce; transient).

A fault fires once per run even across torchrun restarts: a marker in ``CHAOS_RUN_DIR`` (``agent/<op>.r<rank>``)
keeps a recomputed step from re-injecting it.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from chaos.event_kinds import Site
from chaos.injob.fault_events import FaultEvents
from chaos.injob.fault_specs import BitFlipSpec, GradCorruptSpec
from chaos.injob.grad_faults import corrupt_bucket
from chaos.injob.phase_faults import in_this_replica
from chaos.injob.tensor_faults import ArmedFault, TensorFaultError, arm
from chaos.plan.agent_plan import InJobOp, InJobPlan, JsonValue
from chaos.plan.seeds import derive_rng


class _GradFault:
    """A ``grad_corrupt`` op waiting for its step and site inside the gradient all-reduce."""

    def __init__(self, op: InJobOp, params: GradCorruptSpec) -> None:
        self.op = op
        self.params = params
        self.fired = False


class RankFaults:
    """The ops of ``plan`` that rank ``rank`` fires, and its tensor and gradient faults; ``step`` reads the
    agent's current step, ``emit`` reports ``fault.*`` events. Raises ValueError for an op whose params are bad."""

    def __init__(
        self,
        plan: InJobPlan,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None,
        *,
        rank: int,
        world_size: int,
        step: Callable[[], int],
        emit: Callable[..., None],
    ) -> None:
        self._seed = plan.seed  # each op's rng derives from it (see rng)
        self.rank = rank
        self.world_size = world_size
        self._step = step
        self._events = FaultEvents(emit, rank)
        self._fired_dir = Path(os.environ["CHAOS_RUN_DIR"]) / "agent" if os.environ.get("CHAOS_RUN_DIR") else None
        self.mine = [op for op in plan.ops if self.targets_me(op)]
        self._grad_faults = [
            _GradFault(op, GradCorruptSpec.from_params(op.params)) for op in self.mine if op.injector == "grad_corrupt"
        ]
        # The tensor faults: their ops, the model and optimizer they arm in, and those armed now.
        self._tensor_ops = [(op, BitFlipSpec.from_params(op.params)) for op in self.mine if op.injector == "bitflip"]
        self._model = model
        self._optimizer = optimizer
        self._armed: dict[str, ArmedFault] = {}

    @property
    def has_grad_faults(self) -> bool:
        """Whether a ``grad_corrupt`` op of this rank waits inside the gradient all-reduce."""
        return bool(self._grad_faults)

    @property
    def tensor_phases(self) -> set[str]:
        """The step phases at which :meth:`tensor_phase` may fire a ``bitflip`` of this rank."""
        return {p.phase for _, p in self._tensor_ops}

    # -- plan bookkeeping -------------------------------------------------------------------------------
    def targets_me(self, op: InJobOp) -> bool:
        """Whether this rank fires ``op``: its replica, and its ``rank`` param, else the trigger's rank (default:
        rank 1 for a ``grad_corrupt`` of a distributed job, else rank 0)."""
        if not in_this_replica(op):
            return False
        wanted = op.params.get("rank")
        rank = wanted if isinstance(wanted, int) else op.rank
        if rank is None:
            rank = 1 if op.injector == "grad_corrupt" and self.world_size > 1 else 0
        return rank == self.rank

    def rng(self, op: InJobOp) -> random.Random:
        """One stream per op, derived from the run seed (or the fault's own ``seed`` param when it has one):
        the same plan corrupts the same elements every replay."""
        own = op.params.get("seed")
        base = own if isinstance(own, int) else self._seed
        return derive_rng(base, op.op_id, self.rank)

    def already_fired(self, op: InJobOp) -> bool:
        return self._fired_dir is not None and (self._fired_dir / f"{op.op_id}.r{self.rank}").exists()

    def mark_fired(self, op: InJobOp) -> None:
        if self._fired_dir is not None:
            self._fired_dir.mkdir(parents=True, exist_ok=True)
            (self._fired_dir / f"{op.op_id}.r{self.rank}").touch()

    # -- gradient faults --------------------------------------------------------------------------------
    def corrupt(self, site: Site, bucket_index: int, tensor: torch.Tensor) -> None:
        """The corruption hook the collective calls at each site; fires due ``grad_corrupt`` ops."""
        step = self._step()
        for fault in self._grad_faults:
            p = fault.params
            if fault.fired or p.site != site or p.bucket != bucket_index or fault.op.at_step != step:
                continue
            fault.fired = True
            if self.already_fired(fault.op):
                continue
            record = corrupt_bucket(tensor, p, self.rng(fault.op))
            self.mark_fired(fault.op)
            description = f"{p.kind} {record.detail} in bucket {bucket_index} at {site}, rank {self.rank}, step {step}"
            indices: list[JsonValue] = list(record.indices[:16])
            self._events.applied(fault.op, step, description, site=site, bucket=bucket_index, indices=indices)
            # Transient by nature: the corrupted bucket is consumed by this reduction. Nothing to restore later.
            self._events.healed(fault.op)

    # -- tensor faults ----------------------------------------------------------------------------------
    def tensor_phase(self, phase: str) -> None:
        """Fire the ``bitflip`` ops due at (this step, ``phase``), and again those armed whose persistence
        re-applies them."""
        step = self._step()
        for op, params in self._tensor_ops:
            if params.phase != phase:
                continue
            armed = self._armed.get(op.op_id)
            first = armed is None
            if armed is None:
                if op.at_step != step or self.already_fired(op):
                    continue
                armed = arm(self._model, self._optimizer, params, self.rng(op))
            try:
                armed.fire(step)
            except TensorFaultError as exc:
                # e.g. no gradient or optimizer state yet: say so, and leave nothing half-applied.
                armed.heal()
                self._armed.pop(op.op_id, None)
                self._events.failed(op, str(exc))
                continue
            if first:
                self._armed[op.op_id] = armed
                self.mark_fired(op)
                extra: dict[str, JsonValue] = {} if armed.state_key is None else {"state": armed.state_key}
                where, persistence = params.where, params.persistence
                self._events.applied(op, step, armed.describe(), where=where, persistence=persistence, **extra)

    def heal_expired(self) -> None:
        """Heal the tensor faults whose persistence ran out at this step."""
        step = self._step()
        for op_id, armed in list(self._armed.items()):
            if armed.expired(step):
                self._heal(op_id)

    def heal_all(self) -> None:
        """Heal every tensor fault still applied (only the fault's own change is undone)."""
        for op_id in list(self._armed):
            self._heal(op_id)

    def _heal(self, op_id: str) -> None:
        armed = self._armed.pop(op_id)
        armed.heal()
        op = next(o for o, _ in self._tensor_ops if o.op_id == op_id)
        # What the heal did per element: bytes restored (untouched since), the fault's delta removed from a
        # value the optimizer updated since (its updates kept), or left alone (see ArmedFault.heal).
        healing = armed.healing
        extra: dict[str, JsonValue] = {}
        if healing is not None:
            extra = {
                "heal": armed.describe_heal(),
                "restored": list(healing.restored[:16]),
                "delta_removed": list(healing.delta_removed[:16]),
                "kept": list(healing.kept[:16]),
            }
        self._events.healed(op, step=self._step(), **extra)


__all__ = ["RankFaults"]
