"""What the in-job agent reports about training by itself, so the training checks have evidence with no more
than the one ``attach`` line and the loop hooks.

Events (``attempt`` is ``TORCHELASTIC_RESTART_COUNT``, 0 on the first launch; ``rank`` the job's rank):

- ``target.start`` {pid, attempt, world_size} at ``attach``: the rank's process (what a ``kill {rank: R}``
  resolves) and its attempt (what restarts are counted from).
- ``target.step`` {step, attempt, loss, samples} at ``end_step``: ``loss`` when ``after_backward(loss)`` got
  it; ``samples`` when the job passed its data once (``attach(..., data=loader)`` or ``agent.track(...)``).
  Under torchft (``attach(..., manager=)``) ``step`` is torchft's step after the optimizer step, with
  ``committed`` (whether this replica committed it) and ``participants``, as the replica checks read them.
- ``target.checkpoint`` {step, path, attempt, seen} when the job saves a state that holds the model's
  ``state_dict`` with ``torch.save`` or ``torch.distributed.checkpoint.save`` while attached (``seen``: which
  call), at the step of the latest ``begin_step``; once per step; or on ``agent.checkpoint_saved(step, path)``.
- ``target.resume`` {step, attempt, path, seen} at the first ``begin_step(S)`` of an attempt with S > 1: the
  job resumed from step S - 1 (``seen: "first step"``), with the path of the last load of the model's state
  the agent saw (``torch.load`` / ``torch.distributed.checkpoint.load`` after ``attach``: ``seen`` names it); or
  on ``agent.resumed(step, path)`` (why the first step and not the load: docs/design/your-script.md).
  ``agent.resumed(step, path, verified=True)`` adds ``verified``: the job checked the checkpoint before
  loading it.
- ``target.digest`` {digest, step, attempt} at ``close`` (or at a normal exit, with no per-step calls in the
  loop): sha256 over the model's ``state_dict`` and the optimizer's state (:func:`state_digest`), after the
  agent healed its faults: what ``matches_golden`` compares with a fault-free run. With the plan's
  ``digest_every: k`` also after every k-th committed step (torchft's step under torchft; a step torchft did
  not commit is not digested): what ``replicas_agree`` compares across replica groups.

A job that reports some of these itself names them in ``attach(..., job_emits={...})`` (``"all"``: the agent
reports none, as the reference trainer does), so no event is reported twice. Outside a chaos run
(``CHAOS_EVENTS`` unset) the agent reports nothing, wraps nothing and hashes nothing.

Sample ids: the dataset indices the job's sampler yields. A DataLoader is tracked per delivered batch (a
batch's indices are taken from its batch sampler, in order, so worker prefetching does not shift them); a
step's samples are the batches delivered since the previous ``end_step``, except that the first step of an
attempt counts only the batches delivered inside it or else the last one before it (a job that resumes
mid-epoch by iterating past the batches it already trained does not report those). Across epochs an id is
``epoch * len(dataset) + index`` (the sampler's ``epoch`` when it has one, as DistributedSampler does, else
the count of passes over the loader), so a second epoch's samples are new ids. A bare sampler
(``agent.track(sampler)``) is counted per index it yields, without the first-step rule.

Wrapping is per attached agent and undone at ``close``: ``torch.save``/``torch.load`` (and the checkpoint
module's ``save``/``load`` when the job imported it before ``attach``) call through unchanged, and a tracked
loader or sampler gets its own class back. A job that binds ``from torch import save`` before attaching calls
the original: it reports with ``agent.checkpoint_saved`` instead.
"""

from __future__ import annotations

import functools
import hashlib
import operator
import os
import sys
from collections import deque
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any, Literal, SupportsIndex

import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

from chaos import events
from chaos.event_kinds import TARGET_CHECKPOINT, TARGET_DIGEST, TARGET_RESUME, TARGET_START, TARGET_STEP
from chaos.injob.bitflip import tensor_bytes

REPORTS = (TARGET_START, TARGET_STEP, TARGET_CHECKPOINT, TARGET_RESUME, TARGET_DIGEST)
"""The event kinds the agent reports by itself (each can be left to the job: ``job_emits``)."""

JobEmits = Collection[str] | Literal["all"]
Emit = Callable[..., None]
SampleId = int | str
_PREFIXES = ("module.", "_orig_mod.")  # DDP's and torch.compile's wrappers prefix the inner model's keys
_MAX_DEPTH = 3  # how deep into a saved object the model's state is looked for ({"model": sd} is depth 1)


def attempt_from_env() -> int:
    """This process's restart attempt: torchrun's ``TORCHELASTIC_RESTART_COUNT`` (0 when unset)."""
    value = os.environ.get("TORCHELASTIC_RESTART_COUNT", "")
    return int(value) if value.isdigit() else 0


def state_digest(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> str:
    """sha256 over the model's ``state_dict`` (by name) and the optimizer's state (by parameter index, then key):
    equal digests mean bitwise-equal training state."""
    h = hashlib.sha256()
    tensors: list[tuple[str, Any]] = sorted(model.state_dict().items())
    if optimizer is not None:
        for index, state in sorted(optimizer.state_dict()["state"].items()):
            tensors += [(f"optim.{index}.{key}", value) for key, value in sorted(state.items())]
    for name, value in tensors:
        t = torch.as_tensor(value).detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}\n".encode())
        h.update(tensor_bytes(t))
    return h.hexdigest()


def _strip(key: str) -> str:
    changed = True
    while changed:
        changed = False
        for prefix in _PREFIXES:
            if key.startswith(prefix):
                key, changed = key[len(prefix) :], True
    return key


def holds_model(obj: object, model: nn.Module) -> bool:
    """Whether ``obj`` (what was saved or loaded) holds ``model``'s state: a mapping, at most three levels
    down, whose keys are the model's ``state_dict`` keys (a DDP or compile prefix stripped), or that holds a
    tensor sharing storage with one of the model's (a ``state_dict`` taken from the live model)."""
    own = model.state_dict()
    keys = set(own)
    storages = {t.untyped_storage().data_ptr() for t in own.values() if t.numel() > 0}

    def walk(value: object, depth: int) -> bool:
        if depth > _MAX_DEPTH:
            return False
        if isinstance(value, Mapping):
            names = {_strip(k) for k in value if isinstance(k, str)}
            if keys and names == keys:
                return True
            for item in value.values():
                if isinstance(item, torch.Tensor) and item.numel() > 0:
                    if item.untyped_storage().data_ptr() in storages:
                        return True
                elif walk(item, depth + 1):
                    return True
            return False
        if isinstance(value, (list, tuple)):
            return any(walk(item, depth + 1) for item in value)
        return False

    return walk(obj, 0)


def _path_text(where: object) -> str | None:
    """A save's or load's destination as text: a path, or an open file's name; None for a buffer."""
    if isinstance(where, (str, os.PathLike)):
        return os.fsdecode(where)
    name = getattr(where, "name", None)
    return name if isinstance(name, str) else None


# ---------------------------------------------------------------------------------------------------------
# Watching checkpoint saves and loads: one wrapper per function, shared by every attached agent.

_watchers: list[Progress] = []
_originals: dict[tuple[object, str], Any] = {}


def _notify(what: Literal["save", "load"], seen: str, obj: object, where: object) -> None:
    for watcher in list(_watchers):
        try:
            watcher.observed(what, seen, obj, where)
        except Exception:  # noqa: BLE001 - reporting must never break the job's own save or load
            continue


def _wrap(owner: object, name: str, what: Literal["save", "load"], seen: str, *, state_first: bool) -> None:
    original = getattr(owner, name)
    _originals[(owner, name)] = original

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        if state_first:  # torch.distributed.checkpoint: save/load(state_dict, *, checkpoint_id=...)
            state = args[0] if args else kwargs.get("state_dict")
            writer = kwargs.get("storage_writer") or kwargs.get("storage_reader")
            where = kwargs.get("checkpoint_id") or getattr(writer, "path", None)
        elif what == "save":  # torch.save(obj, f)
            state, where = (args[0] if args else kwargs.get("obj")), (args[1] if len(args) > 1 else kwargs.get("f"))
        else:  # torch.load(f) returns the state
            state, where = result, (args[0] if args else kwargs.get("f"))
        _notify(what, seen, state, where)
        return result

    setattr(owner, name, wrapper)


def _watch(progress: Progress) -> None:
    if not _watchers:
        _wrap(torch, "save", "save", "torch.save", state_first=False)
        _wrap(torch, "load", "load", "torch.load", state_first=False)
        dcp = sys.modules.get("torch.distributed.checkpoint")  # only when the job uses it: never import it here
        if dcp is not None:
            if hasattr(dcp, "save"):
                _wrap(dcp, "save", "save", "torch.distributed.checkpoint.save", state_first=True)
            if hasattr(dcp, "load"):
                _wrap(dcp, "load", "load", "torch.distributed.checkpoint.load", state_first=True)
    _watchers.append(progress)


def _unwatch(progress: Progress) -> None:
    if progress in _watchers:
        _watchers.remove(progress)
    if not _watchers:
        for (owner, name), original in _originals.items():
            setattr(owner, name, original)
        _originals.clear()


# ---------------------------------------------------------------------------------------------------------
# Sample ids.


def _sample_id(value: object, offset: int) -> SampleId:
    # An int-like index (int, numpy or 0-d tensor integer) is offset by its pass; anything else is kept as text.
    if isinstance(value, SupportsIndex) and not isinstance(value, bool):
        try:
            return offset + operator.index(value)
        except TypeError:  # e.g. a float tensor: __index__ exists and refuses
            pass
    return str(value)


def _ids(item: object, offset: int) -> list[SampleId]:
    if isinstance(item, (list, tuple)):
        return [_sample_id(v, offset) for v in item]
    if isinstance(item, torch.Tensor):
        return [_sample_id(v, offset) for v in item.reshape(-1).tolist()]
    return [_sample_id(item, offset)]


def _swap_iter(obj: object, iterate: Callable[[Callable[[], Iterator[Any]]], Iterator[Any]]) -> Callable[[], None]:
    """Route ``iter(obj)`` through ``iterate(make)`` (``make`` creates the original iterator) by giving ``obj`` a
    subclass of its own class (``__iter__`` is looked up on the type, so an instance attribute would not do);
    returns the undo."""
    cls = type(obj)

    def __iter__(self: object) -> Iterator[Any]:
        return iterate(lambda: cls.__iter__(self))  # type: ignore[attr-defined]

    sub = type(
        cls.__name__, (cls,), {"__iter__": __iter__, "__module__": cls.__module__, "__qualname__": cls.__qualname__}
    )
    obj.__class__ = sub

    def undo() -> None:
        if type(obj) is sub:
            obj.__class__ = cls

    return undo


class _Delivered:
    """A DataLoader's iterator that tells the tracker each time it delivers a batch (and otherwise is it)."""

    def __init__(self, tracker: Samples, make: Callable[[], Iterator[Any]]) -> None:
        tracker.new_pass()  # before the original iterator exists: its workers prefetch (draw indices) at once
        self._tracker = tracker
        self._it = make()

    def __iter__(self) -> _Delivered:
        return self

    def __next__(self) -> Any:
        batch = next(self._it)
        self._tracker.delivered()
        return batch

    def __len__(self) -> int:
        return len(self._it)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        if name == "_it":  # not set yet (the original iterator failed to start): no recursion
            raise AttributeError(name)
        return getattr(self._it, name)


class Samples:
    """The sample ids the job's data yields, step by step (see the module docstring)."""

    def __init__(self) -> None:
        self._drawn: deque[list[SampleId]] = deque()  # batches the batch sampler yielded, not yet delivered
        self._pending: list[list[SampleId]] = []  # batches delivered since the last end_step
        self._before = 0  # how many of them came before this step's begin_step
        self._passes = 0
        self._per_batch = True  # a DataLoader: batches; a bare sampler: single indices (no first-step rule)
        self._undo: list[Callable[[], None]] = []

    def track(self, data: object) -> None:
        """Start tracking a DataLoader (per delivered batch) or a sampler / batch sampler (per yielded item).
        ValueError for data with no indices (an IterableDataset) or that cannot be iterated."""
        if isinstance(data, DataLoader):
            if isinstance(data.dataset, IterableDataset):
                raise ValueError(
                    "data= is a DataLoader over an IterableDataset: it has no sample indices to report; pass a "
                    "map-style dataset's loader, or leave data= out (exactly_once then has no evidence)"
                )
            source: object = data.batch_sampler if data.batch_sampler is not None else data.sampler
            self._undo.append(
                _swap_iter(source, lambda make: self._drawing(make, data.sampler, data.dataset, queue=True))
            )
            self._undo.append(_swap_iter(data, lambda make: _Delivered(self, make)))
            return
        if not hasattr(type(data), "__iter__"):
            raise ValueError(f"track() takes a DataLoader or a sampler (something that yields indices), not {data!r}")
        self._per_batch = False
        self._undo.append(
            _swap_iter(data, lambda make: self._drawing(make, data, getattr(data, "dataset", None), queue=False))
        )

    def _drawing(
        self, make: Callable[[], Iterator[Any]], sampler: object, dataset: object, *, queue: bool
    ) -> Iterator[Any]:
        if not queue:
            self._passes += 1
        epoch = getattr(sampler, "epoch", None)
        pass_index = epoch if isinstance(epoch, int) else self._passes - 1
        try:
            size = len(dataset)  # type: ignore[arg-type]
        except TypeError:
            size = 0
        offset = pass_index * size
        it = make()  # the original __iter__ reads the sampler's epoch now: so does the offset above

        def draw() -> Iterator[Any]:
            for item in it:
                ids = _ids(item, offset)
                if queue:
                    self._drawn.append(ids)
                else:
                    self._pending.append(ids)
                yield item

        return draw()

    def new_pass(self) -> None:
        """A new pass over the loader: batches the previous iterator drew but never delivered are dropped."""
        self._drawn.clear()
        self._passes += 1

    def delivered(self) -> None:
        self._pending.append(self._drawn.popleft() if self._drawn else [])

    def begin_step(self) -> None:
        self._before = len(self._pending)

    def take(self, first: bool) -> list[SampleId]:
        """The ids of the step that just ended (``first``: the first step of this attempt)."""
        batches = self._pending
        if first and self._per_batch:
            inside = batches[self._before :]
            batches = inside if inside else batches[: self._before][-1:]
        self._pending, self._before = [], 0
        return [i for batch in batches for i in batch]

    def close(self) -> None:
        while self._undo:
            self._undo.pop()()


# ---------------------------------------------------------------------------------------------------------


def _kinds(job_emits: JobEmits) -> frozenset[str]:
    if job_emits == "all":
        return frozenset()
    unknown = sorted(set(job_emits) - set(REPORTS))
    if isinstance(job_emits, str) or unknown:
        raise ValueError(
            f"job_emits={job_emits!r}: name the events the job reports itself, a set of {', '.join(REPORTS)}, or 'all'"
        )
    return frozenset(REPORTS) - frozenset(job_emits)


class Progress:
    """One rank's automatic reports (see the module docstring); the agent calls it from its hooks."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None,
        *,
        rank: int,
        world_size: int,
        emit: Emit,
        job_emits: JobEmits = (),
        data: object | None = None,
    ) -> None:
        kinds = _kinds(job_emits)
        # Outside a chaos run events.emit writes nothing: then wrap, track and hash nothing either.
        self.active = emit is not events.emit or bool(os.environ.get(events.ENV_EVENTS))
        self.kinds = kinds if self.active else frozenset()
        self.model = model
        self.optimizer = optimizer
        self.rank = rank
        self.emit = emit
        self.attempt = attempt_from_env()
        self.step = 0  # the latest begin_step's step
        self._first: int | None = None  # this attempt's first step
        self._resumed = False
        self._saved: set[int] = set()
        self._loaded: tuple[str, str | None] | None = None  # (seen, path) of the last load of the model's state
        self._loss: torch.Tensor | None = None
        self._samples: Samples | None = None
        self._watching = False
        self._closed = False
        # Fields that replace or extend a step's report (torchft: its own step, committed, participants).
        self.step_fields: Callable[[], Mapping[str, Any]] | None = None
        self.digest_every = 0  # a digest after every k-th committed step too (the plan's digest_every)
        self._digested = -1
        if data is not None:  # first: data it cannot track is refused before anything is wrapped or reported
            self.track(data)
        if TARGET_START in self.kinds:
            emit(TARGET_START, rank=rank, pid=os.getpid(), attempt=self.attempt, world_size=world_size)
        if self.kinds & {TARGET_CHECKPOINT, TARGET_RESUME}:
            _watch(self)
            self._watching = True

    # -- what the job hands over ------------------------------------------------------------------------
    def track(self, data: object) -> None:
        """Report the sample ids ``data`` (a DataLoader, or a sampler) yields on each ``target.step``."""
        if TARGET_STEP not in self.kinds:
            return
        if self._samples is None:
            self._samples = Samples()
        self._samples.track(data)

    def checkpoint_saved(self, step: int, path: str | os.PathLike[str] | None = None) -> None:
        """The job saved the state of ``step`` (at ``path``): report it (once per step)."""
        self._checkpoint(step, None if path is None else os.fspath(path), "explicit")

    def resumed(self, step: int, path: str | os.PathLike[str] | None = None, *, verified: bool | None = None) -> None:
        """The job resumed from the checkpoint of ``step``: report it (instead of the first-step inference);
        ``verified``: whether the job checked it before loading (e.g. against a manifest of checksums)."""
        self._resumed = True
        if self.active:
            extra = {} if verified is None else {"verified": verified}
            self.emit(
                TARGET_RESUME,
                rank=self.rank,
                step=step,
                attempt=self.attempt,
                path=None if path is None else os.fspath(path),
                seen="explicit",
                **extra,
            )

    def observed(self, what: Literal["save", "load"], seen: str, obj: object, where: object) -> None:
        """A wrapped save or load happened: keep it when it holds this model's state."""
        if self._closed or not holds_model(obj, self.model):
            return
        path = _path_text(where)
        if what == "load":
            self._loaded = (seen, path)
        elif self._first is not None:  # a save before the attempt's first step has no step to name
            self._checkpoint(self.step, path, seen)

    def _checkpoint(self, step: int, path: str | None, seen: str) -> None:
        if step in self._saved or not self.active:
            return
        self._saved.add(step)
        self.emit(TARGET_CHECKPOINT, rank=self.rank, step=step, path=path, attempt=self.attempt, seen=seen)

    # -- the loop hooks ---------------------------------------------------------------------------------
    def begin_step(self, step: int) -> None:
        self.step = step
        if self._samples is not None:
            self._samples.begin_step()
        if self._first is not None:
            return
        self._first = step
        if step > 1 and not self._resumed and TARGET_RESUME in self.kinds:
            seen, path = self._loaded if self._loaded is not None else ("first step", None)
            self._resumed = True
            self.emit(TARGET_RESUME, rank=self.rank, step=step - 1, attempt=self.attempt, path=path, seen=seen)

    def after_backward(self, loss: torch.Tensor | None) -> None:
        if loss is not None:
            self._loss = loss

    def end_step(self) -> None:
        fields = dict(self.step_fields()) if self.step_fields is not None else {}
        if TARGET_STEP in self.kinds:
            data: dict[str, Any] = {"step": self.step, "attempt": self.attempt}
            if self._loss is not None:
                data["loss"] = float(self._loss.item())  # item(): no detached tensor (a quarter of float(detach))
                self._loss = None
            if self._samples is not None:
                data["samples"] = self._samples.take(first=self.step == self._first)
            data.update(fields)
            self.emit(TARGET_STEP, rank=self.rank, **data)
        step = fields.get("step", self.step)
        committed = fields.get("committed", True) is not False
        if self.digest_every > 0 and committed and isinstance(step, int) and step > 0 and step != self._digested:
            if step % self.digest_every == 0 and TARGET_DIGEST in self.kinds:
                self._digested = step
                digest = state_digest(self.model, self.optimizer)
                self.emit(TARGET_DIGEST, rank=self.rank, digest=digest, step=step, attempt=self.attempt)

    def close(self) -> None:
        """Report the final digest (once), then undo every wrap."""
        if self._closed:
            return
        self._closed = True
        if TARGET_DIGEST in self.kinds:
            digest = state_digest(self.model, self.optimizer)
            self.emit(TARGET_DIGEST, rank=self.rank, digest=digest, step=self.step, attempt=self.attempt)
        if self._watching:
            _unwatch(self)
        if self._samples is not None:
            self._samples.close()


class ProgressCalls:
    """The agent's explicit reporting calls (mixed into :class:`chaos.agent.Agent`)."""

    progress: Progress

    def track(self, data: object) -> None:
        """Report the sample ids ``data`` (a DataLoader, or a sampler) yields, on each ``target.step``."""
        self.progress.track(data)

    def checkpoint_saved(self, step: int, path: str | os.PathLike[str] | None = None) -> None:
        """Report a checkpoint of ``step`` at ``path`` (for saves the agent cannot see)."""
        self.progress.checkpoint_saved(step, path)

    def resumed(self, step: int, path: str | os.PathLike[str] | None = None, *, verified: bool | None = None) -> None:
        """Report that this attempt resumed from the checkpoint of ``step`` (call before the first step);
        ``verified=True`` when the job checked it first (what ``resumed_from_verified_checkpoint`` asks)."""
        self.progress.resumed(step, path, verified=verified)
