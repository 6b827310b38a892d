"""Rollback after a late-detected silent data corruption: back to the newest checkpoint OLDER than the corruption.

A weight corrupted on one rank (a bit flip in memory) is invisible to DDP, which averages gradients and never
compares weights; the cross-rank consistency guard (:mod:`chaos.guards.consistency`) sees it only at its next
check, ``every`` steps later. By then the newest checkpoint may already hold the corruption (the poisoned rank's
gradients reached every rank through the all-reduce at the corruption step itself), so resuming from it would
keep the corruption. What the job knows is when the guard last verified the ranks clean: the state at that step
was identical on every rank, so a checkpoint at or before it predates the corruption of any one rank. That is
the rollback target; with none, the job starts again from scratch (the initial state is clean by construction).

- :func:`rollback_candidates` / :func:`rollback_step`: the decision, pure (checkpoint steps, the last step the
  guard verified clean, the detection step -> the step to roll back to, or None: from scratch).
- :class:`SdcRollback`: the trainer side. After each step it reads the guard's newest verdict (identical on every
  rank: the guard judges gathered values), so every rank decides to roll back at the same step without another
  collective. Rank 0 lists the committed checkpoints and broadcasts the candidates; every rank verifies its own
  file against the manifest (:func:`checkpoint_store.read_part`) and the ranks take the newest candidate that
  verified on all of them (an all-reduce MIN), else the next older one, else scratch. Every rank then loads it
  IN PLACE (model, optimizer, RNG), takes rank 0's tensors (a broadcast, as DDP does at construction, so the
  replicas are identical whatever the checkpoint held), deletes the checkpoints newer than the target (they may
  hold the corruption: a later restart must not resume from them), emits ``target.rollback`` and rewinds the
  loop (:class:`Steps`) to the step after the target.

Why in place rather than exiting so that torchrun restarts the group: a detected divergence is not a process
failure. The processes and the process group are healthy; a restart would cost a rendezvous, the imports and one
of the job's ``max_restarts``, and it would rebuild DDP's gradient buckets, which makes a replay bit-identical only
for two ranks (see :func:`chaos.reference.trainer.main`). In place, the same DDP object replays the same
reductions, so the replay is bit-identical for any world size. A once-firing in-job fault does not fire again
in the replay: the agent marks it fired in the run directory. No ``target.resume`` is emitted (the attempt did
not change; the lineage checks read a step reported twice in one attempt as "the latest report wins", which is
exactly what a rollback means).

The last verdict of the run (the final step's check) is taken at the final step itself (:meth:`SdcRollback.
after_step` waits for it there instead of at ``agent.close()``), so a divergence found there is rolled back too.
A job that keeps diverging (a stuck fault that fires again) gives up after ``max_rollbacks`` (RuntimeError).

Events: ``target.rollback`` on every rank {from_step (the step that just ran), to_step (0: from scratch),
reason, detected_step (the step the guard hashed when it saw the divergence), last_clean_step (the newest step it
had verified clean, or null), path (the checkpoint loaded, or null), policy, rollbacks (this one's number),
odd_ranks, removed (checkpoint steps deleted as suspect), rejected (candidates some rank could not verify),
attempt, duration_s (this rank's verify + load)}.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import nn

from chaos import events
from chaos.event_kinds import TARGET_ROLLBACK as ROLLBACK
from chaos.guards.consistency import ConsistencyGuard, Judgement
from chaos.reference import checkpoint_store
from chaos.reference.trainer_state import build_model, build_optimizer

Policy = Literal["clean", "newest"]
POLICIES: tuple[Policy, ...] = ("clean", "newest")
DEFAULT_MAX_ROLLBACKS = 3
Emit = Callable[..., None]


# --- the decision (pure) -----------------------------------------------------------------------------------


def rollback_candidates(checkpoints: Iterable[int], *, last_clean: int | None, detected: int) -> list[int]:
    """Checkpoint steps a rollback may go to, newest first: those at or before ``last_clean``, the newest step
    the consistency guard verified identical on every rank. Empty: none (``last_clean`` None, or every
    checkpoint is newer): the job must start again from scratch.

    ``detected`` is the step whose check saw the divergence; the guard verified ``last_clean`` before it, so
    ``last_clean < detected`` (ValueError otherwise, and for negative steps). Checkpoints after ``last_clean``
    are never candidates, even if older than ``detected``: the corruption happened somewhere in
    (``last_clean``, ``detected``] and the job cannot tell where.
    """
    if detected < 0 or (last_clean is not None and last_clean < 0):
        raise ValueError(f"steps must be >= 0: detected={detected}, last_clean={last_clean}")
    if last_clean is not None and last_clean >= detected:
        raise ValueError(f"last_clean ({last_clean}) must precede the detection ({detected})")
    steps = sorted(set(checkpoints), reverse=True)
    if any(s < 0 for s in steps):
        raise ValueError(f"checkpoint steps must be >= 0, got {steps}")
    if last_clean is None:
        return []
    return [s for s in steps if s <= last_clean]


def rollback_step(checkpoints: Iterable[int], *, last_clean: int | None, detected: int) -> int | None:
    """The step to roll back to: the newest checkpoint at or before ``last_clean``; None: start from scratch.
    See :func:`rollback_candidates`."""
    candidates = rollback_candidates(checkpoints, last_clean=last_clean, detected=detected)
    return candidates[0] if candidates else None


def newest_candidates(checkpoints: Iterable[int]) -> list[int]:
    """The broken policy (``--sabotage rollback-newest``): every checkpoint, newest first, whatever it holds."""
    return sorted(set(checkpoints), reverse=True)


# --- the loop it rewinds -----------------------------------------------------------------------------------


class Steps:
    """The training loop's steps ``first .. last`` (1-based, inclusive), rewindable: ``for step in steps``."""

    def __init__(self, first: int, last: int) -> None:
        self.last = last
        self._next = first

    def __iter__(self) -> Iterator[int]:
        return self

    def __next__(self) -> int:
        if self._next > self.last:
            raise StopIteration
        step = self._next
        self._next += 1
        return step

    def restart_after(self, step: int) -> None:
        """The next step is ``step + 1`` (the state of ``step`` was just restored)."""
        self._next = step + 1


# --- the trainer side --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Restored:
    """What a rollback loaded: the step (0: the initial state), the checkpoint's path (None for scratch), the
    candidates some rank rejected on the way, and this rank's seconds verifying and loading."""

    step: int
    path: Path | None
    rejected: tuple[int, ...]
    duration_s: float


def _broadcast_list(values: list[int], rank: int) -> list[int]:
    """Rank 0's ``values`` on every rank (the ranks must try the same candidates in the same order)."""
    box: list[Any] = [values if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    received = box[0]
    return [int(v) for v in received] if isinstance(received, list) else []


def _ranks_text(ranks: Sequence[int]) -> str:
    if not ranks:
        return "no single rank named"
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def _tensors(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Parameters by name, then each parameter's optimizer-state tensors by key: the same order on every rank."""
    out: list[torch.Tensor] = []
    named = sorted(model.named_parameters())
    out.extend(p.data for _, p in named)
    for _, p in named:
        state = optimizer.state.get(p, {})
        out.extend(v for _, v in sorted(state.items(), key=lambda kv: str(kv[0])) if isinstance(v, torch.Tensor))
    return out


class SdcRollback:
    """Rolls every rank back, in place, to the newest checkpoint older than a corruption the consistency guard
    found (see the module docstring). Call :meth:`after_step` on every rank after ``agent.end_step()`` (and the
    step's report) and before the step's checkpoint; it returns True when it rolled back (then skip the rest of
    the step: the loop's :class:`Steps` already points at the step after the target)."""

    def __init__(
        self,
        guard: ConsistencyGuard | None,
        steps: Steps,
        *,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        directory: Path,
        seed: int,
        lr: float,
        rank: int,
        world_size: int,
        attempt: int = 0,
        policy: Policy = "clean",
        max_rollbacks: int = DEFAULT_MAX_ROLLBACKS,
        emit: Emit = events.emit,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
        self.guard, self.steps = guard, steps
        self.model, self.optimizer = model, optimizer
        self.directory, self.seed, self.lr = directory, seed, lr
        self.rank, self.world_size, self.attempt = rank, world_size, attempt
        self.policy, self.max_rollbacks, self.emit = policy, max_rollbacks, emit
        self.last_clean: int | None = None  # the newest step the guard verified identical (and finite) everywhere
        self.rollbacks = 0
        self._seen = guard.checks if guard is not None else 0

    def after_step(self, step: int) -> bool:
        """Read the guard's newest verdict; on a divergence (or non-finite parameters) roll back. Collective
        when it rolls back, and at the last step when a check is in flight (every rank calls it every step)."""
        guard = self.guard
        if guard is None:
            return False
        if step == self.steps.last:
            guard.finish()  # the final check's verdict now, while the loop can still act on it
        if guard.checks == self._seen or guard.last is None:
            return False
        self._seen = guard.checks
        verdict = guard.last
        if verdict.agree and not verdict.nonfinite_ranks:
            self.last_clean = verdict.step
            return False
        self.roll_back(step, verdict)
        return True

    def roll_back(self, step: int, verdict: Judgement) -> Restored:
        """Restore every rank to the rollback target and rewind the loop; emits ``target.rollback``. Collective."""
        if self.rollbacks >= self.max_rollbacks:
            raise RuntimeError(
                f"the ranks diverged again at step {verdict.step} after {self.rollbacks} rollback(s): giving up "
                f"(a fault that persists across rollbacks needs the rank replaced, not another replay)"
            )
        assert self.guard is not None
        self.guard.finish()  # an exchange started at this step judges the state being discarded: drain it
        self._seen = self.guard.checks
        listed = checkpoint_store.committed_steps(self.directory) if self.rank == 0 else []
        if self.policy == "newest":
            candidates = newest_candidates(listed)
        else:
            candidates = rollback_candidates(listed, last_clean=self.last_clean, detected=verdict.step)
        restored = self._restore(_broadcast_list(candidates, self.rank))
        removed = self._remove_newer(restored.step)
        self.rollbacks += 1
        self.steps.restart_after(restored.step)
        decided_with = self.last_clean
        # What the replay starts from is what is known clean now (0: the initial state); later checks of the
        # replay re-verify the steps after it.
        self.last_clean = restored.step if self.policy == "clean" else self.last_clean
        why = "diverged" if not verdict.agree else "held non-finite parameters"
        odd = list(verdict.odd_ranks) or list(verdict.nonfinite_ranks)
        clean = "never" if decided_with is None else f"last at step {decided_with}"
        target = "scratch (step 0)" if restored.path is None else f"the checkpoint of step {restored.step}"
        self.emit(
            ROLLBACK,
            rank=self.rank,
            from_step=step,
            to_step=restored.step,
            reason=(
                f"the consistency guard found the ranks {why} at step {verdict.step} ({_ranks_text(odd)}); "
                f"verified clean {clean}; policy {self.policy}: rolled back to {target}"
            ),
            detected_step=verdict.step,
            last_clean_step=decided_with,
            path=None if restored.path is None else str(restored.path),
            policy=self.policy,
            rollbacks=self.rollbacks,
            odd_ranks=odd,
            removed=removed,
            rejected=list(restored.rejected),
            attempt=self.attempt,
            duration_s=round(restored.duration_s, 6),
        )
        return restored

    def _restore(self, candidates: Sequence[int]) -> Restored:
        """The newest of ``candidates`` that every rank verified (its own file against the manifest), loaded in
        place on every rank; the initial state when none did. Collective: the ranks try them in lockstep."""
        started = time.monotonic()
        rejected: list[int] = []
        for candidate in candidates:
            state: dict[str, Any] | None = None
            try:
                _, state = checkpoint_store.read_part(self.directory, candidate, self.rank, self.world_size)
            except checkpoint_store.Rejected as exc:
                print(f"rollback rank {self.rank}: checkpoint {candidate} rejected: {exc}", file=sys.stderr, flush=True)
            if checkpoint_store.all_min(0 if state is None else 1) == 0:
                rejected.append(candidate)
                continue
            assert state is not None
            self._load(state)
            path = checkpoint_store.step_dir(self.directory, candidate)
            return Restored(candidate, path, tuple(rejected), time.monotonic() - started)
        fresh = build_model(self.seed)  # seeds the global RNG as the job's own start did
        initial = {
            "model": fresh.state_dict(),
            "optimizer": build_optimizer(fresh, self.lr).state_dict(),
            "rng": torch.get_rng_state(),
        }
        self._load(initial)
        return Restored(0, None, tuple(rejected), time.monotonic() - started)

    def _load(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])  # copies into the same tensors: DDP keeps working on them
        self.optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"])
        # Rank 0's bytes everywhere: identical anyway for a checkpoint the guard verified, and whatever a
        # checkpoint held, the replicas leave a rollback identical (the guard then judges the replay).
        for tensor in _tensors(self.model, self.optimizer):
            dist.broadcast(tensor, src=0)

    def _remove_newer(self, step: int) -> list[int]:
        """Rank 0 deletes the checkpoints newer than ``step``, after every rank has loaded (a barrier)."""
        dist.barrier()
        removed: list[int] = []
        if self.rank == 0:
            for newer in checkpoint_store.list_steps(self.directory):
                if newer > step:
                    shutil.rmtree(checkpoint_store.step_dir(self.directory, newer), ignore_errors=True)
                    removed.append(newer)
        return _broadcast_list(removed, self.rank)


__all__ = [
    "DEFAULT_MAX_ROLLBACKS",
    "POLICIES",
    "ROLLBACK",
    "Policy",
    "Restored",
    "SdcRollback",
    "Steps",
    "newest_candidates",
    "rollback_candidates",
    "rollback_step",
]
