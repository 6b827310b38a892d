"""Cross-rank consistency guard: data-parallel replicas must hold bit-identical parameters after every optimizer
step. Emits ``detect.divergence`` naming the odd rank(s) and ``detect.nonfinite`` on a rank with NaN/Inf
parameters.

The digest (:class:`TensorSums`; small CPU tensors batched by :mod:`chaos.guards.sum_batch`, same values) is
bit-exact and order-independent: each tensor's bytes read as integers of the element's width, summed with
their squares in int64 and folded into two 64-bit words with per-position odd multipliers, so identical
tensors give identical digests on every rank whatever the reduction order, thread count or device, and any
single changed element (or a swap of two tensors) changes it. It allocates nothing per check. Non-finite values
are found with one float sum per tensor; only flagged tensors are then counted exactly, so an overflowing sum of
finite values is no alarm.

The exchange: every rank all-reduces ``[h1, h2, tensors, nonfinite, ~h1, ~h2, ~tensors, ~nonfinite]`` with
MAX (``~`` is the bitwise NOT, so the second half yields the minimum): all ranks agree iff max == min. It is
started asynchronously at the checked step and waited for at the next :meth:`ConsistencyGuard.maybe_check`.
Only on disagreement or non-finite values do the ranks all-gather their digests and non-finite counts to name
who differs, and, at the onset of a divergence, their per-tensor sums to name the tensors. Every decision is
taken from gathered values, so all ranks follow the same path. The exchange is a collective: every rank calls
:meth:`~ConsistencyGuard.maybe_check` for the same steps, in step order, and :meth:`~ConsistencyGuard.finish`
at the end; a loop whose ranks run different numbers of steps must not use this guard. On NCCL the exchanged
tensors live on the current CUDA device; on any other backend on the CPU. Non-finite values are counted when
the tensors are hashed (a host sync per check on an accelerator).

Carried instead (``carrier``, set by the agent in a 2-rank DDP job whose gradients its plain comm hook
reduces): the words ride in the next step's gradient all-reduce (:mod:`chaos.guards.digest_carrier`), which
hands back every rank's words, so no collective of the guard's own runs and no gather is needed to name who
differs; :meth:`~ConsistencyGuard.finish` falls back to the all-reduce above when no gradient reduction carried
them (the check of the last step, taken at ``close``). ``exchanges`` counts the verdicts taken each way.

Who is odd: the ranks outside the group sharing the majority digest (more than half of the ranks). Without a
majority (two ranks that differ, or an even split), when exactly the finite ranks share one digest the
non-finite ranks are the odd ones (NaN/Inf weights are wrong whatever the others hold); otherwise nobody is
named (``culprit_rank`` null).

Events (the reporter, rank 0 by default, emits the shared verdicts once; ``detector`` is ``"consistency"``;
ranks are global ranks also when ``group`` is not the default group, ``digests`` are in the group's rank order):

- ``guard.consistency`` for every check, from the reporter: {step (the step hashed), agree, digest (the
  reference digest: the common one, else the majority's; null without one), tensors, odd_ranks,
  nonfinite_ranks, every}. Evidence that the guard ran and what it saw.
- ``detect.divergence`` at the onset of a divergence (once while the same ranks stay split; again when the
  split changes or after the ranks agreed again), from the reporter with ``rank`` = the culprit when exactly
  one rank is odd, else the reporter's own rank (the convention of ``detect.straggler``): {step, reporter,
  odd_ranks, culprit_rank (null unless exactly one rank is odd), groups (ranks per digest, largest first),
  digest (the reference, or null), digests (per rank), tensors (names of up to 16 tensors where the odd ranks
  differ from the reference), message}.
- ``detect.nonfinite`` on the rank whose parameters hold NaN/Inf, when that starts (emitted when hashed, not
  pipelined): {step, tensors (up to 16 names), count (non-finite elements)}.

Why replicas are compared, why this digest and this exchange, and what they cost: docs/design/sdc-guards.md
("The consistency guard").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
from torch import nn

from chaos import events
from chaos.event_kinds import DETECT_DIVERGENCE, DETECT_NONFINITE, GUARD_CONSISTENCY
from chaos.guards.digest_carrier import DigestCarrier
from chaos.guards.sum_batch import BatchResult, SumBatch

Emit = Callable[..., None]

DETECTOR = "consistency"
DEFAULT_EVERY = 10
MAX_NAMED = 16
"""Events name at most this many tensors."""

_INT_OF_WIDTH = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_SUM_DTYPE = {
    torch.float16: torch.float32,
    torch.bfloat16: torch.float32,
    torch.float32: torch.float32,
    torch.float64: torch.float64,
}
_CHUNK_CPU = 1 << 18  # 2 MiB of int64 scratch: stays in cache between the copy, the square and the sums
_CHUNK_OTHER = 1 << 22  # accelerators: fewer, larger kernels (32 MiB of int64 scratch)
_MASK64 = (1 << 64) - 1


def _signed64(value: int) -> int:
    value &= _MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


def _multiplier(index: int, salt: int) -> int:
    """A fixed odd 64-bit multiplier for position ``index`` (splitmix64), as a signed int64."""
    z = (index * 0x9E3779B97F4A7C15 + salt) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return _signed64((z ^ (z >> 31)) | 1)


def hex_digest(words: Sequence[int]) -> str:
    """Digest words as one lowercase hex string (16 characters per word)."""
    return "".join(f"{w & _MASK64:016x}" for w in words)


class TensorSums:
    """Exact per-tensor integer sums (``s1``, ``s2`` of the module docstring) through one scratch buffer per
    device. Reads its inputs only."""

    def __init__(self) -> None:
        self._scratch: dict[torch.device, torch.Tensor] = {}

    def buffer(self, device: torch.device, size: int) -> torch.Tensor:
        """The device's int64 scratch buffer, at least ``size`` elements (grown, never shrunk)."""
        buf = self._scratch.get(device)
        if buf is None or buf.numel() < size:
            buf = torch.empty(size, dtype=torch.int64, device=device)
            self._scratch[device] = buf
        return buf

    def sums(self, tensor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(s1, s2)`` of ``tensor``'s bytes as int64 0-d tensors on its device (no host sync)."""
        flat = tensor.detach().reshape(-1)
        if flat.numel() == 0:
            zero = torch.zeros((), dtype=torch.int64, device=flat.device)
            return zero, zero.clone()
        int_dtype = _INT_OF_WIDTH.get(flat.element_size())
        try:
            ints = flat.view(int_dtype) if int_dtype is not None else flat.view(torch.uint8)
        except RuntimeError:  # a dtype with no same-width integer view: byte by byte, still exact
            ints = flat.view(torch.uint8)
        chunk = _CHUNK_CPU if flat.device.type == "cpu" else _CHUNK_OTHER
        numel = ints.numel()
        scratch = self.buffer(flat.device, min(chunk, numel))
        if numel <= chunk:  # most tensors: one pass, no slicing
            buf = scratch[:numel]
            buf.copy_(ints)  # widen to int64 first: the square of a 32-bit value is then exact
            first = buf.sum()
            return first, buf.mul_(buf).sum()
        s1: torch.Tensor | None = None
        s2: torch.Tensor | None = None
        for start in range(0, numel, chunk):
            part = ints[start : start + chunk]
            buf = scratch[: part.numel()]
            buf.copy_(part)
            a = buf.sum()
            b = buf.mul_(buf).sum()
            s1 = a if s1 is None else s1.add_(a)
            s2 = b if s2 is None else s2.add_(b)
        assert s1 is not None and s2 is not None
        return s1, s2


def _float_sum(tensor: torch.Tensor) -> torch.Tensor | None:
    """``tensor``'s sum in float32 (float64 for float64): not finite when the tensor MAY hold NaN/Inf (or its
    finite values overflow the sum); None for dtypes that cannot hold non-finite values or have no cheap sum."""
    sum_dtype = _SUM_DTYPE.get(tensor.dtype)
    return None if sum_dtype is None else tensor.detach().sum(dtype=sum_dtype)


def _spread_words(mine: list[int]) -> list[int]:
    """``[mine, ~mine]``: all-reduced with MAX, every rank learns the largest and (negated back) the smallest of
    each word, equal exactly when the ranks agree."""
    return [*mine, *(~w for w in mine)]


@dataclass
class _Pending:
    """A check whose exchange is in flight: what this rank hashed at ``step``, kept until the verdict."""

    step: int
    names: list[str]
    mine: list[int]  # [h1, h2, tensors, non-finite tensors]
    spread: torch.Tensor | None  # [mine, ~mine], all-reduced with MAX (None: not exchanged this way)
    work: dist.Work | None
    v1: torch.Tensor  # per-tensor s1 (to name the tensors at an onset)
    v2: torch.Tensor
    nonfinite: int  # non-finite elements on this rank
    carried: bool = False  # the words ride in the next gradient reduction (``carrier``), not in ``spread``


@dataclass(frozen=True)
class Judgement:
    """What one check saw across the ranks (the same on every rank)."""

    step: int
    agree: bool
    digests: tuple[str, ...]  # per rank
    nonfinite: tuple[int, ...]  # per rank: non-finite elements
    groups: tuple[tuple[int, ...], ...]  # ranks sharing a digest, largest group first (ties: lowest rank first)
    reference: str | None  # the digest taken as right: the common one, else the majority's, else the finite ranks'
    odd_ranks: tuple[int, ...]  # ranks not holding the reference (empty without a reference)
    tensors: tuple[str, ...] = ()  # names of tensors where the odd ranks differ (filled at a divergence onset)

    @property
    def culprit(self) -> int | None:
        """The one odd rank, or None (agreement, several odd ranks, or no reference)."""
        return self.odd_ranks[0] if len(self.odd_ranks) == 1 else None

    @property
    def nonfinite_ranks(self) -> tuple[int, ...]:
        return tuple(r for r, n in enumerate(self.nonfinite) if n > 0)

    def describe(self) -> str:
        """One sentence for the event's ``message``."""
        if self.agree:
            return f"all {len(self.digests)} ranks hold identical parameters at step {self.step}"
        split = " | ".join(",".join(map(str, g)) for g in self.groups)
        where = f" in {', '.join(self.tensors)}" if self.tensors else ""
        if self.reference is None:
            return f"ranks hold different parameters at step {self.step} and no majority agrees (groups {split})"
        odd = ", ".join(map(str, self.odd_ranks))
        others = [r for r in range(len(self.digests)) if r not in self.odd_ranks]
        plural = "s" if len(self.odd_ranks) > 1 else ""
        why = " (non-finite)" if set(self.odd_ranks) <= set(self.nonfinite_ranks) and self.nonfinite_ranks else ""
        return f"rank{plural} {odd}{why} diverged from rank(s) {', '.join(map(str, others))} at step {self.step}{where}"


def judge(step: int, digests: Sequence[str], nonfinite: Sequence[int]) -> Judgement:
    """Group the ranks by digest and pick the reference (pure; see the module docstring for the rule)."""
    if len(digests) != len(nonfinite) or not digests:
        raise ValueError(f"need one digest and one non-finite count per rank, got {len(digests)}, {len(nonfinite)}")
    by_digest: dict[str, list[int]] = {}
    for rank, digest in enumerate(digests):
        by_digest.setdefault(digest, []).append(rank)
    groups = tuple(sorted((tuple(g) for g in by_digest.values()), key=lambda g: (-len(g), g[0])))
    world = len(digests)
    reference: str | None = None
    if len(groups[0]) * 2 > world:
        reference = digests[groups[0][0]]
    else:
        finite = [r for r in range(world) if nonfinite[r] == 0]
        if finite and len(finite) < world and len({digests[r] for r in finite}) == 1:
            reference = digests[finite[0]]
    odd = () if reference is None else tuple(r for r in range(world) if digests[r] != reference)
    return Judgement(
        step=step,
        agree=len(groups) == 1,
        digests=tuple(digests),
        nonfinite=tuple(int(n) for n in nonfinite),
        groups=groups,
        reference=reference,
        odd_ranks=odd,
    )


class ConsistencyGuard:
    """Hashes the model's parameters (and, with ``optimizer_state``, the optimizer's state tensors) every
    ``every`` steps and compares the digests across the ranks of ``group``; emits the events of the module
    docstring. Collective: every rank calls :meth:`maybe_check` for the same steps, after the optimizer step,
    and :meth:`finish` once at the end. Reads the tensors only: training is bit-identical with it on or off.

    Pipelined: :meth:`maybe_check` hashes at a due step and STARTS the exchange (an asynchronous all-reduce),
    and takes the verdict of the previous exchange, one call later, by when it has long arrived; so a check
    costs the step the local hash and no round trip. The verdict and its events carry the hashed step; they
    are emitted at the next :meth:`maybe_check` call, or at :meth:`finish`. :meth:`check` does both at once.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        optimizer: torch.optim.Optimizer | None = None,
        optimizer_state: bool = False,
        every: int = DEFAULT_EVERY,
        reporter: int = 0,
        group: dist.ProcessGroup | None = None,
        emit: Emit | None = None,
    ) -> None:
        if every < 1:
            raise ValueError(f"every must be >= 1 (steps between checks), got {every}")
        if optimizer_state and optimizer is None:
            raise ValueError("optimizer_state=True hashes the optimizer's state: pass optimizer=")
        distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank(group) if distributed else 0
        self.world_size = dist.get_world_size(group) if distributed else 1
        if not 0 <= reporter < self.world_size:
            raise ValueError(f"reporter {reporter} is not a rank of a world of {self.world_size}")
        self.model, self.optimizer, self.optimizer_state = model, optimizer, optimizer_state
        self.every, self.reporter, self.group = every, reporter, group
        # Events name global ranks; the exchange is indexed by rank inside ``group`` (the same without one).
        self._global: tuple[int, ...] = tuple(
            dist.get_global_rank(group, r) if distributed and group is not None else r for r in range(self.world_size)
        )
        self.emit: Emit = emit or events.emit
        backend = str(dist.get_backend(group)) if distributed else ""
        # NCCL only moves device tensors; every other backend here (gloo) gets CPU tensors.
        self.device = torch.device("cuda", torch.cuda.current_device()) if "nccl" in backend else torch.device("cpu")
        self.sums = TensorSums()
        self.batch = SumBatch(self.sums.buffer)  # the small tensors in a few calls, through the same scratch
        self.checks = 0
        self.last: Judgement | None = None
        self.detections: list[Judgement] = []  # every divergence onset seen (on every rank)
        # Parameters do not change identity during training; walking the module tree at every check would.
        self._params: list[tuple[str, torch.Tensor]] = list(model.named_parameters())
        self._pending: _Pending | None = None
        self._split: tuple[tuple[int, ...], ...] | None = None  # the groups of the ongoing divergence
        self._nonfinite_reported = False
        self._multipliers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        # Set by the agent on the DDP path: the digest then rides in the next gradient all-reduce
        # (chaos.guards.digest_carrier) instead of this guard's own exchange.
        self.carrier: DigestCarrier | None = None
        self.exchanges = {"carried": 0, "own": 0}  # how the verdicts' words travelled

    # -- what is hashed --------------------------------------------------------------------------------------
    def tensors(self) -> list[tuple[str, torch.Tensor]]:
        """The hashed tensors in a canonical order: parameters by name, then (optionally) each parameter's
        optimizer state tensors by key. The same on every rank of a lockstep data-parallel job."""
        named = list(self._params)
        if self.optimizer_state and self.optimizer is not None:
            state = self.optimizer.state
            for name, p in self._params:
                for key, value in sorted(state.get(p, {}).items(), key=lambda kv: str(kv[0])):
                    if isinstance(value, torch.Tensor):
                        named.append((f"optimizer.{name}.{key}", value))
        return named

    def _multiplier_pair(self, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        pair = self._multipliers.get(count)
        if pair is None:
            first, second = (
                torch.tensor([_multiplier(i, salt) for i in range(count)], dtype=torch.int64, device=self.device)
                for salt in (1, 2)
            )
            pair = self._multipliers[count] = (first, second)
        return pair

    def _local(self, named: list[tuple[str, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor, list[tuple[str, int]]]:
        """Per-tensor sums as two int64 vectors on the exchange device, and ``(name, count)`` of this rank's
        tensors that hold non-finite values (a host sync, to count them exactly while they are still there)."""
        here = self.device
        batch = self.batch.sums([t for _, t in named])
        flagged = list(batch.flagged)
        if len(batch.s1) == 1 and batch.positions == list(range(len(named))):  # the common case: one batch, in order
            v1, v2 = batch.s1[0].to(here), batch.s2[0].to(here)
        else:
            v1, v2 = self._one_by_one(named, batch, flagged)
        # Exact counts for the flagged tensors only (a finite tensor whose sum overflowed counts 0: no alarm).
        counted = [(named[i][0], int((~torch.isfinite(named[i][1].detach())).sum())) for i in sorted(flagged)]
        return v1, v2, [(name, n) for name, n in counted if n > 0]

    # -- the check ------------------------------------------------------------------------------------------
    def due(self, step: int) -> bool:
        """True at the steps this guard checks (multiples of ``every``)."""
        return step % self.every == 0

    def maybe_check(self, step: int) -> Judgement | None:
        """Take the verdict of the exchange in flight (if any), then, when ``step`` is due, hash and start the
        next exchange. Returns the verdict taken now, or None. Collective."""
        done = self.finish()
        if self.due(step):
            self.start(step)
        return done

    def check(self, step: int) -> Judgement:
        """Hash at ``step``, compare across the ranks and emit, at once (no pipelining). Collective."""
        self.finish()
        self.start(step)
        verdict = self.finish()
        assert verdict is not None
        return verdict

    def start(self, step: int) -> None:
        """Hash this rank's tensors and start the exchange; its verdict comes from :meth:`finish`."""
        if self._pending is not None:
            raise RuntimeError("a consistency check is still in flight: call finish() first")
        named = self.tensors()
        v1, v2, bad = self._local(named)
        self._local_nonfinite(step, bad)
        c1, c2 = self._multiplier_pair(len(named))
        # int64 arithmetic wraps: a fold mod 2^64 (dot: the same value as (v * c).sum(), in one call).
        mine = [int(torch.dot(v1, c1)), int(torch.dot(v2, c2)), len(named), len(bad)]
        spread = None
        work = None
        nonfinite = sum(n for _, n in bad)
        carried = self.world_size > 1 and self.carrier is not None
        if carried:
            assert self.carrier is not None
            self.carrier.load([*mine[:3], nonfinite])  # the per-rank row of the slow path
        elif self.world_size > 1:
            spread = self._spread(mine)
            work = dist.all_reduce(spread, op=dist.ReduceOp.MAX, group=self.group, async_op=True)
        self._pending = _Pending(step, [n for n, _ in named], mine, spread, work, v1, v2, nonfinite, carried)

    def _spread(self, mine: list[int]) -> torch.Tensor:
        """:func:`_spread_words` as an int64 tensor on the exchange device."""
        return torch.tensor(_spread_words(mine), dtype=torch.int64, device=self.device)

    def finish(self) -> Judgement | None:
        """Wait for the exchange in flight and judge it (emitting its events); None when none is in flight.
        Collective when one is: every rank calls it at the same point (``Agent.close`` does, at the end)."""
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        rows = None
        if pending.carried:
            assert self.carrier is not None
            rows = self.carrier.take()
            if rows is None:  # no gradient reduction since the check (the last step's check): exchange now
                pending.spread = self._spread(pending.mine)
                dist.all_reduce(pending.spread, op=dist.ReduceOp.MAX, group=self.group)
        elif pending.work is not None:
            pending.work.wait()
        self.exchanges["carried" if rows is not None else "own"] += 1
        words = pending.mine
        self.checks += 1
        if rows is not None:  # every rank's row arrived: no gather needed to judge
            if all(r[:3] == rows[0][:3] for r in rows) and not any(r[3] for r in rows):
                verdict = judge(pending.step, [hex_digest(words[:2])] * self.world_size, [0] * self.world_size)
            else:
                verdict = self._gathered(pending, words, same_shape=len({r[2] for r in rows}) == 1, rows=rows)
        else:
            # [max, ~min] of each word over the ranks; a single rank's own words when nothing was exchanged.
            values = _spread_words(words) if pending.spread is None else pending.spread.tolist()
            high, low = values[:4], [~v for v in values[4:]]
            if high[:3] == low[:3] and high[3] == 0:  # the common case: one digest, nothing non-finite anywhere
                verdict = judge(pending.step, [hex_digest(words[:2])] * self.world_size, [0] * self.world_size)
            else:
                verdict = self._gathered(pending, words, same_shape=high[2] == low[2])
        self.last = verdict
        self._report(verdict, len(pending.names))
        return verdict

    def _all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        if self.world_size == 1:
            return [tensor]
        gathered = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(gathered, tensor, group=self.group)
        return gathered

    def _gathered(
        self, pending: _Pending, words: list[int], *, same_shape: bool, rows: list[list[int]] | None = None
    ) -> Judgement:
        """The slow path: every rank's digest and non-finite count (gathered, unless the carried ``rows`` of
        ``[h1, h2, tensors, non-finite elements]`` hold them), and at an onset the tensors that differ."""
        if rows is None:
            row = torch.tensor([words[0], words[1], pending.nonfinite], dtype=torch.int64, device=self.device)
            values = [r.tolist() for r in self._all_gather(row)]
        else:
            values = [[r[0], r[1], r[3]] for r in rows]
        verdict = judge(pending.step, [hex_digest(v[:2]) for v in values], [v[2] for v in values])
        if verdict.agree or verdict.groups == self._split or not same_shape:
            return verdict
        # A new divergence: name the tensors (a per-tensor all-gather, at the onset only).
        gathered = [g.tolist() for g in self._all_gather(torch.cat([pending.v1, pending.v2]))]
        base = verdict.groups[0][0] if verdict.reference is None else verdict.digests.index(verdict.reference)
        odd = verdict.odd_ranks or tuple(r for r, d in enumerate(verdict.digests) if d != verdict.digests[base])
        count = len(pending.names)
        reference_row = gathered[base]
        differing: list[str] = []
        for rank in odd:
            theirs = gathered[rank]
            for i, name in enumerate(pending.names):
                same = (theirs[i], theirs[count + i]) == (reference_row[i], reference_row[count + i])
                if not same and name not in differing:
                    differing.append(name)
        return replace(verdict, tensors=tuple(differing[:MAX_NAMED]))

    def _one_by_one(
        self, named: list[tuple[str, torch.Tensor]], batch: BatchResult, flagged: list[int]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`_local`'s sums where the batch did not take every tensor: the rest one by one (their non-finite
        ones appended to ``flagged``), merged with the batch's in ``named``'s order."""
        here = self.device
        s1: list[torch.Tensor | None] = [None] * len(named)
        s2: list[torch.Tensor | None] = [None] * len(named)
        for position, a, b in zip(
            batch.positions,
            torch.cat(batch.s1 or [torch.zeros(0, dtype=torch.int64)]),
            torch.cat(batch.s2 or [torch.zeros(0, dtype=torch.int64)]),
            strict=True,
        ):
            s1[position], s2[position] = a, b
        floats: dict[torch.dtype, tuple[list[int], list[torch.Tensor]]] = {}
        for index, (_name, tensor) in enumerate(named):
            if s1[index] is not None:
                continue
            s1[index], s2[index] = self.sums.sums(tensor)
            total = _float_sum(tensor)
            if total is not None:
                where, values = floats.setdefault(total.dtype, ([], []))
                where.append(index)
                values.append(total if total.device == here else total.to(here))
        for where, values in floats.values():
            stacked = torch.isfinite(torch.stack(values))
            if not bool(stacked.all()):  # the rare case: find which ones
                flagged.extend(where[i] for i in torch.nonzero(~stacked).reshape(-1).tolist())
        if not named:
            empty = torch.zeros(0, dtype=torch.int64, device=here)
            return empty, empty.clone()
        v1 = torch.stack([a.to(here) for a in s1 if a is not None])
        return v1, torch.stack([b.to(here) for b in s2 if b is not None])

    def _local_nonfinite(self, step: int, bad: list[tuple[str, int]]) -> None:
        """``detect.nonfinite`` on this rank when its parameters start holding NaN/Inf (local, no collective)."""
        if not bad:
            self._nonfinite_reported = False
            return
        if self._nonfinite_reported:
            return
        self._nonfinite_reported = True
        self.emit(
            DETECT_NONFINITE,
            rank=self._global[self.rank],
            detector=DETECTOR,
            step=step,
            tensors=[name for name, _ in bad[:MAX_NAMED]],
            count=sum(n for _, n in bad),
        )

    def _report(self, verdict: Judgement, tensors: int) -> None:
        if verdict.agree:
            self._split = None
        onset = not verdict.agree and verdict.groups != self._split
        if onset:
            self._split = verdict.groups
            self.detections.append(verdict)
        if self.rank != self.reporter:
            return
        g = self._global
        self.emit(
            GUARD_CONSISTENCY,
            rank=g[self.rank],
            detector=DETECTOR,
            step=verdict.step,
            agree=verdict.agree,
            digest=verdict.reference,
            tensors=tensors,
            odd_ranks=[g[r] for r in verdict.odd_ranks],
            nonfinite_ranks=[g[r] for r in verdict.nonfinite_ranks],
            every=self.every,
        )
        if onset:
            culprit = None if verdict.culprit is None else g[verdict.culprit]
            self.emit(
                DETECT_DIVERGENCE,
                rank=g[self.rank] if culprit is None else culprit,
                detector=DETECTOR,
                reporter=g[self.rank],
                step=verdict.step,
                odd_ranks=[g[r] for r in verdict.odd_ranks],
                culprit_rank=culprit,
                groups=[[g[r] for r in group] for group in verdict.groups],
                digest=verdict.reference,
                digests=list(verdict.digests),
                tensors=list(verdict.tensors),
                message=verdict.describe(),
            )


__all__ = ["DEFAULT_EVERY", "DETECTOR", "ConsistencyGuard", "Judgement", "TensorSums", "hex_digest", "judge"]
