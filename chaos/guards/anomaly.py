"""Gradient anomaly guard: a rank whose LOCAL gradients are non-finite, far from its peers' or from its own
recent history, or whose loss spikes. Emits ``detect.grad_anomaly`` with the rank.

This is the detector for corruption no checksum of the reduction can see: a fault in a rank's own
computation ("local"), which the rank then checksums and sends faithfully. It only sees what changes a
norm or a loss, so it catches NaN/Inf and large blow-ups (an exponent flip that multiplies one element by
2^64), not a flip that changes one element of millions by a factor of two.

Where the local gradients are visible
-------------------------------------
After ``backward()`` under DDP, ``.grad`` already holds the AVERAGED gradients: a rank's own contribution
is gone. The guard therefore reads each bucket inside the DDP communication hook, before the reduction:
either register :func:`anomaly_hook` (``ddp.register_comm_hook(guard, anomaly_hook)``: observe, then DDP's
default all-reduce), or, with the checksum guard, pass ``observe=guard.observe`` to its
:class:`~chaos.guards.checksum.ChecksumState`. Then call :meth:`GradAnomalyGuard.check` after ``backward()``
and before ``optimizer.step()``. Without DDP (or inside ``no_sync``) nothing needs observing: :meth:`check`
reads the model's ``.grad`` directly. The hook costs one fused norm pass over each bucket; :meth:`check` one
tiny all-reduce.

Rules, each applied to every rank identically on every rank (so all ranks return the same verdict):
``nonfinite_grad``; ``peer_norm`` (norm > ``peer_ratio`` x the median of the other ranks' norms);
``norm_history`` (log-norm more than ``zscore`` standard deviations above the rank's last ``window``
accepted steps, the deviation floored at ``min_log_std`` so a very steady history cannot turn noise into
alarms); ``nonfinite_loss``; ``loss_spike`` (loss > ``loss_spike`` x the median of its recent losses, when
that median is positive). History rules wait for ``min_history`` steps; anomalous steps never enter history.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch._C._distributed_c10d import GradBucket  # the stub's home; torch.distributed re-exports it
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

from chaos import events
from chaos.event_kinds import DETECT_GRAD_ANOMALY


@dataclass(frozen=True)
class Anomaly:
    """One rule that fired for one rank at one step."""

    rank: int
    reason: str
    value: float
    detail: str

    def __str__(self) -> str:
        return f"rank {self.rank}: {self.reason}: {self.detail}"


class GradAnomalyGuard:
    """Per-rank gradient and loss anomaly detection (see the module docstring). Collective: every rank of
    ``group`` calls :meth:`check` once per step, in step order."""

    def __init__(
        self,
        model: nn.Module | None,
        *,
        window: int = 20,
        zscore: float = 6.0,
        peer_ratio: float = 10.0,
        loss_spike: float = 5.0,
        emit: Callable[..., None] | None = None,
        group: dist.ProcessGroup | None = None,
        min_history: int = 5,
        min_log_std: float = 0.25,
    ) -> None:
        if window < 2 or min_history < 2 or min_history > window:
            raise ValueError(f"need 2 <= min_history <= window, got window={window}, min_history={min_history}")
        if zscore <= 0 or peer_ratio <= 1 or loss_spike <= 1 or min_log_std <= 0:
            raise ValueError("zscore and min_log_std must be > 0; peer_ratio and loss_spike must be > 1")
        self.model = model
        self.window, self.zscore, self.peer_ratio, self.loss_spike = window, zscore, peer_ratio, loss_spike
        self.min_history, self.min_log_std = min_history, min_log_std
        self.emit = emit
        self.group = group
        distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank(group) if distributed else 0
        self.world_size = dist.get_world_size(group) if distributed else 1
        self.last: list[Anomaly] = []
        self.flagged_steps = 0
        self._norm_hist = [deque[float](maxlen=window) for _ in range(self.world_size)]
        self._loss_hist = [deque[float](maxlen=window) for _ in range(self.world_size)]
        self._sumsq = 0.0
        self._nonfinite = False
        self._observed = False

    def observe(self, bucket_index: int, tensor: torch.Tensor) -> None:
        """Account one bucket of this rank's LOCAL gradients (call before the reduction)."""
        del bucket_index  # buckets are summed; the signature matches ChecksumState.observe
        norm = float(torch.linalg.vector_norm(tensor.detach()))
        if not math.isfinite(norm) and not bool(torch.isfinite(tensor).all()):
            self._nonfinite = True
        # A finite tensor whose float32 norm overflows is a blow-up, not a NaN: its norm counts as +inf.
        self._sumsq += norm * norm
        self._observed = True

    def _local(self) -> tuple[float, bool]:
        if not self._observed and self.model is not None:
            for param in self.model.parameters():
                if param.grad is not None:
                    self.observe(0, param.grad)
        sumsq, nonfinite = self._sumsq, self._nonfinite
        self._sumsq, self._nonfinite, self._observed = 0.0, False, False
        return sumsq, nonfinite

    def check(self, step: int, loss: float | torch.Tensor | None = None) -> list[str]:
        """Judge this step for every rank; return the anomalies as text (the same list on every rank).

        Emits ``detect.grad_anomaly`` (detector, reason, step, value, detail) on each anomalous rank itself.
        ``loss``: this rank's local loss, or None to skip the loss rules.
        """
        sumsq, nonfinite = self._local()
        local_loss = math.nan if loss is None else float(loss)
        row = torch.zeros(self.world_size, 4, dtype=torch.float64)
        row[self.rank] = torch.tensor([sumsq, float(nonfinite), local_loss, float(loss is not None)])
        if self.world_size > 1:
            dist.all_reduce(row, group=self.group)  # other ranks' rows are zero: a SUM is a gather
        anomalies = [a for r in range(self.world_size) for a in self._judge(r, row)]
        self._remember(row, {a.rank for a in anomalies})
        self.last = anomalies
        if anomalies:
            self.flagged_steps += 1
        for anomaly in anomalies:
            if anomaly.rank == self.rank:
                (self.emit or events.emit)(
                    DETECT_GRAD_ANOMALY,
                    rank=self.rank,
                    detector="grad_anomaly",
                    reason=anomaly.reason,
                    step=step,
                    value=anomaly.value,
                    detail=anomaly.detail,
                )
        return [str(a) for a in anomalies]

    def _judge(self, rank: int, rows: torch.Tensor) -> list[Anomaly]:
        sumsq, nonfinite, loss, has_loss = (float(v) for v in rows[rank])
        found: list[Anomaly] = []
        norm = math.sqrt(sumsq) if sumsq >= 0 else math.nan
        if nonfinite or math.isnan(norm):
            found.append(Anomaly(rank, "nonfinite_grad", norm, "NaN or Inf in the local gradients"))
        else:
            others = [math.sqrt(float(rows[r, 0])) for r in range(self.world_size) if r != rank]
            others = [o for o in others if math.isfinite(o)]
            if others:
                median = statistics.median(others)
                if median > 0 and norm > self.peer_ratio * median:
                    found.append(
                        Anomaly(
                            rank,
                            "peer_norm",
                            norm,
                            f"grad norm {norm:.3g} is {norm / median:.3g}x its peers' median {median:.3g}",
                        )
                    )
            history = self._norm_hist[rank]
            if len(history) >= self.min_history and norm > 0:
                mean = statistics.fmean(history)
                spread = max(statistics.pstdev(history), self.min_log_std)
                z = (math.log(norm) - mean) / spread
                if z > self.zscore:
                    found.append(
                        Anomaly(
                            rank,
                            "norm_history",
                            norm,
                            f"grad norm {norm:.3g} is {z:.1f} sd above its last {len(history)} steps",
                        )
                    )
        if has_loss:
            if not math.isfinite(loss):
                found.append(Anomaly(rank, "nonfinite_loss", loss, "loss is NaN or Inf"))
            elif len(self._loss_hist[rank]) >= self.min_history:
                median = statistics.median(self._loss_hist[rank])
                if median > 0 and loss > self.loss_spike * median:
                    found.append(
                        Anomaly(
                            rank,
                            "loss_spike",
                            loss,
                            f"loss {loss:.4g} is {loss / median:.3g}x its recent median {median:.4g}",
                        )
                    )
        return found

    def _remember(self, rows: torch.Tensor, flagged: set[int]) -> None:
        for rank in range(self.world_size):
            if rank in flagged:
                continue  # an anomalous step must not become the new normal
            sumsq, _nonfinite, loss, has_loss = (float(v) for v in rows[rank])
            if sumsq > 0 and math.isfinite(sumsq):
                self._norm_hist[rank].append(0.5 * math.log(sumsq))
            if has_loss and math.isfinite(loss):
                self._loss_hist[rank].append(loss)


def anomaly_hook(guard: GradAnomalyGuard, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: observe the local bucket, then DDP's default all-reduce (divide, sum)."""
    guard.observe(bucket.index(), bucket.buffer())
    future: Any = allreduce_hook(guard.group, bucket)  # type: ignore[arg-type]
    return future  # type: ignore[no-any-return]


# DDP's register_comm_hook compares the annotations with the real objects, and ``from __future__ import
# annotations`` turns them into strings: give it the objects.
anomaly_hook.__annotations__.update({"bucket": GradBucket, "return": torch.futures.Future[torch.Tensor]})


__all__ = ["Anomaly", "GradAnomalyGuard", "anomaly_hook"]
