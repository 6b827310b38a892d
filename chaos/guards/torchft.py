"""The in-job agent inside torchft's gradient reduction (``attach(model, optimizer=..., manager=manager, ddp=ddp)``).

Why not a comm hook: torchft's ``DistributedDataParallel`` registers its own DDP comm hook in its constructor
(``register_comm_hook(manager, self._comm_hook)``), and DDP takes one hook per model: the agent cannot register
another. That hook calls ``state.allreduce(bucket.buffer())`` on the Manager it was given as state, waits, and
returns the work's future. So the agent sits in ``manager.allreduce`` instead: :class:`TorchftReduction` sets an
instance attribute that shadows the Manager's method (undone at ``close``), and every AVG all-reduce of a
floating-point tensor through it, one per DDP bucket in order (torchft's DDP never rebuilds its buckets), is:

1. ``local`` injection site, the anomaly guard's look at the local gradients;
2. with the checksum guard: the bucket's block sums ``s`` and exact bounds ``A >= sum|x|`` are declared
   (:mod:`chaos.guards.checksum`'s blocks and tolerance; one tier, so no extra collective on a mismatch);
3. ``in_transit`` site, then torchft's own all-reduce of the bucket (SUM) started on torchft's process group;
   a ``kill`` at phase ``allreduce`` fires right there (started, not waited for); the declared ``(s, A)`` go
   through torchft's all-reduce as well (a healing replica's are zeroed by torchft with its bucket);
4. wait, ``post_reduce`` site, verify each block of the received sum against the summed declarations, then
   divide by ``num_participants`` as torchft's AVG does (bit-identical to torchft's result when clean).

A mismatch is reported through torchft's own error path: ``manager.report_error(SdcDetected(...))``, so this
replica's ``should_commit()`` is False and ``optimizer.step()`` does not commit the step (torchft's Optimizer
wrapper), plus ``detect.sdc`` {detector: checksum, action: report, ...} for the harness. Each replica judges
what it received: a corruption before or inside the reduction reaches every replica, and every one drops the
step; one that hit a single replica's result after it makes only that replica drop it, and torchft heals it
from a peer at the next quorum. What this path does not do, unlike DDP's checksum hook: retry (torchft's answer
to a bad step is to drop it), agree across replicas on the verdict (torchft's commit is per replica group), or
localize the culprit rank (no all-gather on torchft's process group through the Manager).

After the agent reported an error, torchft's ``allreduce`` returns a ``_DummyWork`` whose future has no
``_fut``, and torchft's DDP hook dies on it (``assert fut._fut``) at the next bucket of the step: for the rest
of a step whose error the agent reported, the agent returns a completed work of the bucket as it is (the step
is dropped anyway). Errors torchft reported itself keep torchft's own behaviour.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any, Protocol

import torch
import torch.distributed as dist

from chaos import events
from chaos.event_kinds import DETECT_SDC
from chaos.guards.checksum import ChecksumConfig, ChecksumStats, CorruptionHook, Detection, SdcDetected
from chaos.guards.rounding import BlockLayout, abs_sum_bounds, block_sums, sums_and_lower_bounds, tolerance_coefficients

AVG = dist.ReduceOp.AVG
SUM = dist.ReduceOp.SUM


class Manager(Protocol):
    """What the agent uses of ``torchft.Manager`` (duck-typed: torchft is an optional extra)."""

    def allreduce(self, tensor: torch.Tensor, should_quantize: bool = ..., reduce_op: Any = ...) -> Any: ...

    def report_error(self, e: Exception) -> None: ...

    def errored(self) -> object | None: ...

    def num_participants(self) -> int: ...

    def current_step(self) -> int: ...


def is_torchft_ddp(module: object) -> bool:
    """Whether ``module`` is torchft's DistributedDataParallel (or a subclass), without importing torchft."""
    return any(cls.__module__.startswith("torchft") for cls in type(module).__mro__)


class _Completed(torch.futures.Future[torch.Tensor]):
    """A completed future that also carries ``_fut``, which torchft's DDP hook returns to DDP."""

    def __init__(self, tensor: torch.Tensor) -> None:
        super().__init__()
        self.set_result(tensor)
        inner: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        inner.set_result(tensor)
        self._fut = inner


class _CompletedWork:
    """A finished all-reduce of ``tensor`` as it is (the step was dropped): what torchft's DDP hook needs."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self._future = _Completed(tensor)

    def wait(self, timeout: timedelta | None = None) -> bool:
        return True

    def get_future(self) -> torch.futures.Future[torch.Tensor]:
        return self._future


class TorchftReduction:
    """The agent between torchft's DDP hook and ``Manager.allreduce`` (see the module docstring).

    ``guard``: verify each bucket with checksums; ``corrupt``: the agent's injection sites; ``observe``: the
    anomaly guard's look at local gradients; ``in_flight(bucket)``: the agent's phase-``allreduce`` faults.
    ``rank`` labels events (this process's rank inside its replica group).
    """

    def __init__(
        self,
        manager: Manager,
        *,
        rank: int,
        guard: bool,
        config: ChecksumConfig | None = None,
        emit: Callable[..., None] = events.emit,
        corrupt: CorruptionHook | None = None,
        observe: Callable[[int, torch.Tensor], None] | None = None,
        in_flight: Callable[[int], None] | None = None,
    ) -> None:
        self.manager = manager
        self.rank = rank
        self.guard = guard
        self.config = config or ChecksumConfig()
        self.emit = emit
        self.corrupt = corrupt
        self.observe = observe
        self.in_flight = in_flight
        self.step: int | None = None
        self.stats = ChecksumStats()
        self.detections: list[Detection] = []
        self.reported = False  # the agent reported an error in this step (torchft now skips its all-reduces)
        self._bucket = 0
        self._original: Callable[..., Any] = manager.allreduce  # the bound method
        setattr(manager, "allreduce", self.allreduce)  # noqa: B010 - an instance attribute shadows the method

    def begin_step(self, step: int) -> None:
        """A new step: buckets count from 0 again (torchft's ``start_quorum`` clears its error state)."""
        self.step = step
        self._bucket = 0
        self.reported = False

    def report(self, error: Exception) -> None:
        """Report ``error`` to torchft: this replica does not commit the step (``should_commit()`` False)."""
        self.reported = True
        self.manager.report_error(error)

    def close(self) -> None:
        """Give the Manager its own ``allreduce`` back (only when the attribute is still ours)."""
        if vars(self.manager).get("allreduce") == self.allreduce:
            delattr(self.manager, "allreduce")

    def allreduce(self, tensor: torch.Tensor, should_quantize: bool = False, reduce_op: Any = AVG) -> Any:
        """``Manager.allreduce`` with the agent inside (an AVG of a float tensor is a gradient bucket)."""
        if reduce_op != AVG or should_quantize or not torch.is_floating_point(tensor):
            return self._original(tensor, should_quantize, reduce_op)
        if self.manager.errored() is not None:
            # After the agent's own report, torchft's _DummyWork would crash torchft's DDP hook: see the docstring.
            return _CompletedWork(tensor) if self.reported else self._original(tensor, should_quantize, reduce_op)
        index = self._bucket
        self._bucket += 1
        flat = tensor.view(-1)
        self._inject("local", index, flat)
        if self.observe is not None:
            self.observe(index, flat)
        layout = self.config.layout(flat.numel(), flat.dtype)
        declared = self._declare(flat, layout) if self.guard and layout.n_blocks else None
        self._inject("in_transit", index, flat)
        work = self._original(tensor, False, SUM)  # torchft zeroes it first when this replica is healing
        if self.in_flight is not None:
            self.in_flight(index)  # this replica is inside torchft's all-reduce: phase-allreduce faults fire here
        sums_work = None if declared is None else self._original(declared, False, SUM)
        participants = self.manager.num_participants()
        ok = bool(work.wait())
        if sums_work is not None:
            ok = bool(sums_work.wait()) and ok
        self._inject("post_reduce", index, flat)
        if declared is not None and ok and self.manager.errored() is None:
            self._verify(index, flat, declared, layout, participants)
        if participants > 0:
            tensor /= participants  # torchft's AVG: the same division, so a clean bucket is bit-identical
        return work

    def _inject(self, site: Any, index: int, flat: torch.Tensor) -> None:
        if self.corrupt is not None:
            self.corrupt(site, index, flat)

    @staticmethod
    def _declare(flat: torch.Tensor, layout: BlockLayout) -> torch.Tensor:
        """``[2, n_blocks]`` float64: each block's sum and an exact upper bound of its sum of |x|."""
        sums = sums_and_lower_bounds(flat, layout)[0]
        bounds = abs_sum_bounds(flat, layout, torch.arange(layout.n_blocks))
        return torch.stack([sums, bounds])

    def _verify(
        self, index: int, flat: torch.Tensor, declared: torch.Tensor, layout: BlockLayout, participants: int
    ) -> None:
        expected, bound = declared[0], declared[1]
        rel, absolute = tolerance_coefficients(
            layout, flat.dtype, max(participants, 1), self.config.tolerance_factor, None
        )
        diff = (block_sums(flat, layout) - expected).abs()
        dmax = float(torch.finfo(flat.dtype).max)
        verifiable = torch.isfinite(expected) & (bound < dmax)
        bad = ~(diff <= bound * rel + layout.lengths() * absolute) & verifiable
        self.stats.buckets_checked += 1
        self.stats.blocks_checked += layout.n_blocks
        self.stats.unverifiable_blocks += layout.n_blocks - int(verifiable.sum())
        n_bad = int(bad.sum())
        if not n_bad:
            return
        blocks = tuple(int(b) for b in torch.nonzero(bad).reshape(-1)[: self.config.max_reported_blocks])
        detection = Detection(
            bucket=index,
            attempt=0,
            step=self.step,
            ranks=(self.rank,),
            blocks=blocks,
            n_blocks=n_bad,
            site_hint="unknown",
            culprit_rank=None,
            action="report",
        )
        self.stats.mismatches += 1
        self.stats.mismatched_here += 1
        self.stats.skipped_steps += 1
        self.detections.append(detection)
        self.emit(
            DETECT_SDC,
            rank=self.rank,
            detector="checksum",
            bucket=index,
            blocks=list(blocks),
            n_blocks=n_bad,
            step=self.step,
            site_hint="unknown",
            culprit_rank=None,
            ranks=[self.rank],
            attempt=0,
            action="report",
            participants=participants,
            via="torchft.Manager.report_error",
        )
        self.report(SdcDetected(detection))


__all__ = ["Manager", "TorchftReduction", "is_torchft_ddp"]
