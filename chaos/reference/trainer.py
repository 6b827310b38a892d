"""Reference training job: a tiny deterministic DDP model whose result must survive faults bit for bit.

Launched by torchrun (``python -m torch.distributed.run ... -m chaos.reference.trainer --checkpoint-dir D``)
and instrumented only through :func:`chaos.events.emit`, so the harness sees its steps, checkpoints,
restarts, detections and final digest without talking to it.

Contracts the harness and its checks rely on:

- **Pure data.** Sample ``i`` is a pure function of ``(seed, i)``. Global step ``s`` (1-based) consumes ids
  ``[(s-1)*B*W, s*B*W)``; rank ``r`` takes the contiguous slice ``[(s-1)*B*W + r*B, (s-1)*B*W + (r+1)*B)``.
  A fault-free run therefore consumes every id ``0 .. steps*B*W-1`` exactly once.
- **Exact resumption.** Every ``--checkpoint-every`` steps the ranks write a checkpoint (model, optimizer,
  step, RNG state, config) with a two-phase commit: each rank its own file, then rank 0 a manifest with every
  file's sha256 and size and an atomic ``latest`` pointer (:mod:`chaos.reference.checkpoint_store`).
  On start every rank verifies its own file against the manifest and the ranks resume, at ``step + 1``, from
  the newest checkpoint that verified on ALL of them (older ones when the newest is torn, corrupt, missing a
  file, or only named by a stale pointer; ``checkpoint_store.KEEP`` are kept).
  Resumed training ends with the same digest as uninterrupted training (verified for world size 2; see
  :func:`main` for why larger worlds are not guaranteed bit-identical).
- **Digest.** ``target.digest`` carries a sha256 over model parameters and optimizer state tensors in a
  canonical order (:func:`state_digest`); rank 0 also writes ``<checkpoint-dir>/final-digest.txt``.
- **Detection.** A gloo collective that raises (peer killed: connection closed/reset; peer frozen: timeout
  after ``--pg-timeout``) is reported as ``detect.collective_timeout`` or ``detect.collective_error`` and
  the rank exits 1, so torchrun restarts the group. When the error says the peer is gone (the process-group
  timeout, or a connection closed/reset/refused, a gloo read/write error) the rank also reports
  ``detect.peer_lost``, right after the collective_* event (scenarios that take the first detection keep
  seeing that one).
  A rank whose own checkpoint write (or rank 0's commit) has not finished after ``--pg-timeout`` seconds reports
  ``detect.checkpoint_stall`` (a save watchdog, :func:`checkpoint_store.save`): storage that every rank writes to
  (a shared filesystem) stalls them all in I/O, where no collective is waiting to time out.
- **Guards** (all off by default): ``--guard checksum`` (checksummed gradient
  all-reduce, ``detect.sdc``), ``--anomaly-guard`` (``detect.grad_anomaly``), ``--straggler-guard`` (a rank
  whose local work per step is far above its peers', :mod:`chaos.guards.straggler`): once per step, right
  after the gradient sync, every rank sends rank 0 its local time and its time blocked in collectives (one
  tiny gloo gather); rank 0 reports a rank whose local time summed over the last ``--straggler-window`` K
  steps (default 5) is at least ``--straggler-ratio`` R (default 2.0) times the median of the other ranks'
  sums AND above it by at least ``--straggler-min-excess`` S seconds (default 0.2), once per episode (it
  re-arms after K steps back under the threshold). It reads clocks only: model, optimizer and data order are
  untouched, so the digest is the same with it on or off. A rank's checkpoint writes count as its local work.
  ``--straggler-links`` (three ranks or more) adds a ping-pong to each rank's ring successor per step and names a
  rank both of whose ring links are slow (a delayed path into or out of its host; ``cause: "link"``).
- **Consistency guard** (on; ``--consistency-every N``, default 10, 0 for off): every N steps, after the
  optimizer step, the ranks compare a digest of their parameters (:mod:`chaos.guards.consistency`; one small
  all-reduce) and report ``guard.consistency``, ``detect.divergence`` and ``detect.nonfinite``. It only reads
  the model, so the digest is the same with it on or off.
- **Sabotage** (``--sabotage`` or env ``CHAOS_SABOTAGE``, which wins) breaks recovery on purpose so tests
  can prove the checks catch it: ``skip-optimizer-restore`` restores model and step but not the optimizer
  (momentum is lost, so the final digest differs); ``skip-restore`` ignores checkpoints and starts from
  scratch (the digest is still bit-identical because training is a pure function of the seed; what breaks
  is progress: steps and sample ids are repeated, which progress/ETTR checks see); ``rollback-newest`` (with
  ``--rollback``) rolls back to the newest checkpoint, which may already hold the corruption.
- **Rollback** (``--rollback``, off by default): when the consistency guard finds the ranks diverged, every rank
  reloads in place the newest checkpoint at or before the last step the guard verified clean (scratch when
  there is none) and replays from there, emitting ``target.rollback`` (:mod:`chaos.reference.rollback`).

Events (``attempt`` is ``TORCHELASTIC_RESTART_COUNT``, 0 on the first launch):
``target.start`` {pid, attempt, world_size}; ``target.restart`` {attempt} (rank 0, attempt > 0);
``target.resume`` {step, attempt, path, verified, rejected}; ``target.restore`` {step, path, duration_s, bytes};
``target.checkpoint_rejected`` {step, path, reason}; ``target.step`` {step, loss, samples, attempt};
``target.checkpoint`` {step, path, attempt, duration_s, files, manifest} (every rank, once committed);
``target.digest`` {digest, step, attempt}; with ``--rollback``, ``target.rollback`` {from_step, to_step, reason,
detected_step, last_clean_step, path, removed, ...} (every rank);
``detect.collective_timeout`` / ``detect.collective_error`` {detector: "gloo", message, step};
``detect.peer_lost`` {detector: "pg_timeout" (the process-group timeout) or "gloo" (connection lost), message,
step, peer: "addr:port" named in the error, or null}; with ``--straggler-guard``, ``detect.straggler`` emitted
by rank 0 with ``rank`` = the STRAGGLER (not the reporter) {detector: "straggler", reporter: 0, step, window: K,
ratio: R, min_excess: S, observed_ratio (the straggler's sum over the others' median; null when that median is
0), compute_s: [per-rank local seconds over the window], wait_s: [per-rank seconds blocked in collectives over
the window; the straggler's is the smallest]}.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, fields
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from chaos.agent import Guards, attach
from chaos.event_kinds import (
    DETECT_COLLECTIVE_ERROR,
    DETECT_COLLECTIVE_TIMEOUT,
    DETECT_PEER_LOST,
    TARGET_DIGEST,
    TARGET_RESTART,
    TARGET_START,
    TARGET_STEP,
)
from chaos.events import emit
from chaos.guards.consistency import DEFAULT_EVERY
from chaos.guards.straggler import DEFAULT_MIN_EXCESS_S, DEFAULT_RATIO, DEFAULT_WINDOW, StragglerGuard
from chaos.reference import checkpoint_store
from chaos.reference.rollback import SdcRollback, Steps
from chaos.reference.save_retry import save_with_retry
from chaos.reference.trainer_state import (
    CHECKPOINT_FORMAT,
    HIDDEN,
    IN_FEATURES,
    SAMPLE_SEED_MULTIPLIER,
    build_model,
    build_optimizer,
    make_batch,
    sample,
    state_digest,
    step_sample_ids,
)

# This module is the trainer's one address (tests, scenarios' module:): it re-exports
# the data, model and checkpoint pieces that live in trainer_state.
__all__ = [
    "CHECKPOINT_FORMAT",
    "ENV_SABOTAGE",
    "FINAL_DIGEST_FILE",
    "HIDDEN",
    "IN_FEATURES",
    "SABOTAGES",
    "SAMPLE_SEED_MULTIPLIER",
    "Config",
    "build_model",
    "build_optimizer",
    "is_collective_failure",
    "main",
    "make_batch",
    "parse_args",
    "peer_address",
    "peer_loss_detector",
    "sample",
    "state_digest",
    "step_sample_ids",
]

SABOTAGES = ("none", "skip-optimizer-restore", "skip-restore", "rollback-newest")
ENV_SABOTAGE = "CHAOS_SABOTAGE"
FINAL_DIGEST_FILE = "final-digest.txt"
# How long an error path waits for destroy_process_group before giving up on it: gloo teardown after a
# frozen peer can block, and a detector that hangs would turn a detected fault into an undetected one.
_DESTROY_TIMEOUT_S = 5.0
# How long a finished job releases the GIL before tearing down the process group (see the end of main).
_TEARDOWN_GRACE_S = 0.1


@dataclass(frozen=True)
class Config:
    """Validated command line; see :func:`parse_args` for the meaning of each field."""

    steps: int
    batch_size: int
    checkpoint_every: int
    checkpoint_dir: Path
    step_time: float
    seed: int
    pg_timeout: float
    lr: float
    sabotage: str
    guard: str = "none"
    anomaly_guard: bool = False
    straggler_guard: bool = False
    straggler_window: int = DEFAULT_WINDOW
    straggler_ratio: float = DEFAULT_RATIO
    straggler_min_excess: float = DEFAULT_MIN_EXCESS_S
    straggler_links: bool = False
    consistency_every: int = DEFAULT_EVERY
    rollback: bool = False


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0.0:  # also rejects NaN
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0.0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _ratio(text: str) -> float:
    value = float(text)
    if not 1.0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 1, got {text}")
    return value


def parse_args(argv: Sequence[str] | None = None) -> Config:
    """Parse the CLI; env ``CHAOS_SABOTAGE`` (when set and non-empty) overrides ``--sabotage``."""
    parser = argparse.ArgumentParser(prog="chaos.reference.trainer", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=_positive_int, default=60, help="global steps to train (default 60)")
    parser.add_argument("--batch-size", type=_positive_int, default=16, help="samples per rank per step")
    parser.add_argument("--checkpoint-every", type=_positive_int, default=10, help="steps between checkpoints")
    parser.add_argument("--checkpoint-dir", type=Path, required=True, help="where ckpt-<step>/ checkpoints live")
    parser.add_argument(
        "--step-time", type=_non_negative_float, default=0.05, help="sleep per step so faults land mid-run"
    )
    parser.add_argument("--seed", type=_non_negative_int, default=1234, help="model init and data seed")
    parser.add_argument(
        "--pg-timeout", type=_positive_float, default=30.0, help="process-group (collective) timeout, s"
    )
    parser.add_argument("--lr", type=_positive_float, default=0.05, help="SGD learning rate")
    parser.add_argument("--sabotage", choices=SABOTAGES, default="none", help="break recovery on purpose")
    parser.add_argument(
        "--guard", choices=("none", "checksum"), default="none", help="gradient all-reduce guard (chaos.guards)"
    )
    parser.add_argument("--anomaly-guard", action="store_true", help="per-rank gradient/loss anomaly detection")
    parser.add_argument(
        "--straggler-guard", action="store_true", help="detect a rank whose local step time is far above its peers'"
    )
    parser.add_argument(
        "--straggler-window", type=_positive_int, default=DEFAULT_WINDOW, help="steps the straggler guard sums over"
    )
    parser.add_argument(
        "--straggler-ratio", type=_ratio, default=DEFAULT_RATIO, help="times the peers' median that counts as slow"
    )
    parser.add_argument(
        "--straggler-min-excess",
        type=_non_negative_float,
        default=DEFAULT_MIN_EXCESS_S,
        help="seconds over the peers' median (per window) a straggler must also exceed",
    )
    parser.add_argument(
        "--straggler-links",
        action="store_true",
        help="with --straggler-guard: also name a rank both of whose ring links are slow (3+ ranks)",
    )
    parser.add_argument(
        "--consistency-every",
        type=_non_negative_int,
        default=DEFAULT_EVERY,
        help=f"compare the ranks' parameters every N steps (default {DEFAULT_EVERY}; 0: off)",
    )
    parser.add_argument("--rollback", action="store_true", help="on a divergence, roll back to a clean checkpoint")
    args = parser.parse_args(argv)
    if args.rollback and args.consistency_every == 0:
        parser.error("--rollback acts on the consistency guard's verdicts: it needs --consistency-every N > 0")
    sabotage: str = args.sabotage
    env_sabotage = os.environ.get(ENV_SABOTAGE, "").strip()
    if env_sabotage:
        if env_sabotage not in SABOTAGES:
            parser.error(f"{ENV_SABOTAGE}={env_sabotage!r} is not one of {', '.join(SABOTAGES)}")
        sabotage = env_sabotage
    # Every option's argparse dest is the name of its Config field, so the whole namespace maps over.
    values = {field.name: getattr(args, field.name) for field in fields(Config)}
    return Config(**{**values, "sabotage": sabotage})


# --- failure handling ------------------------------------------------------------------------------------


def is_collective_failure(exc: BaseException) -> bool:
    """True when ``exc`` looks like a failed gloo collective rather than a bug in this job."""
    if isinstance(exc, dist.DistError):
        return True
    if not isinstance(exc, RuntimeError):
        return False
    text = str(exc).lower()
    return any(
        marker in text
        for marker in ("gloo", "connection", "timed out", "timeout", "closed", "reset by peer", "broken pipe")
    )


def _is_timeout(message: str) -> bool:
    text = message.lower()
    return "timed out" in text or "timeout" in text


# What gloo (and the socket layer under it) says when the peer on the other end of a pair went away.
_PEER_GONE_MARKERS = (
    "connection closed",
    "closed by peer",
    "connection reset",
    "reset by peer",
    "connection refused",
    "socket closed",
    "broken pipe",
    "read error",
    "write error",
)
# gloo writes a peer as "[127.0.0.1]:41234" (IPv6 "[::1]:41234"); its own source locations ("[../pair.cc:534]")
# never match because a file name is not made of hex digits, dots and colons.
_BRACKETED_PEER = re.compile(r"\[([0-9A-Fa-f:.]+(?:%[\w.-]+)?)\]:(\d{1,5})\b")
_PLAIN_PEER = re.compile(r"(?<![\w.:])(\d{1,3}(?:\.\d{1,3}){3}):(\d{1,5})\b")


def peer_loss_detector(message: str) -> str | None:
    """Which detector saw a lost peer in a collective's error ``message``, or None when it is not a peer loss.

    ``"pg_timeout"``: the collective ran into the process-group timeout (a frozen, partitioned or very slow
    peer; every collective of this job runs under that timeout). ``"gloo"``: the transport reported the peer's
    connection closed, reset or unreadable (a killed peer).
    """
    if _is_timeout(message):
        return "pg_timeout"
    text = message.lower()
    if any(marker in text for marker in _PEER_GONE_MARKERS):
        return "gloo"
    return None


def peer_address(message: str) -> str | None:
    """The first ``addr:port`` an error message names (IPv6 stays bracketed: ``[::1]:41234``), else None."""
    match = _BRACKETED_PEER.search(message)
    if match is not None and (":" in match.group(1) or match.group(1).count(".") == 3):
        host, port = match.groups()
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    match = _PLAIN_PEER.search(message)
    return f"{match.group(1)}:{match.group(2)}" if match is not None else None


def _shutdown_process_group(timeout: float) -> bool:
    """Destroy the default process group, giving up after ``timeout`` s; True when it finished."""
    if not dist.is_initialized():
        return True
    # A daemon thread, because destroy can block on a frozen peer and a thread cannot be cancelled.
    worker = threading.Thread(target=dist.destroy_process_group, name="destroy-pg", daemon=True)
    worker.start()
    worker.join(timeout)
    return not worker.is_alive()


# --- training --------------------------------------------------------------------------------------------


def _checkpoint_state(
    step: int, model: nn.Module, optimizer: torch.optim.Optimizer, cfg: Config, world_size: int
) -> dict[str, Any]:
    return {
        "format": CHECKPOINT_FORMAT,
        "step": step,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        # Nothing in training draws from the global RNG today; saving it keeps resumption exact if
        # something (dropout, shuffling) ever does.
        "rng": torch.get_rng_state(),
        "config": {"seed": cfg.seed, "batch_size": cfg.batch_size, "world_size": world_size, "lr": cfg.lr},
    }


def _check_compatible(state: dict[str, Any], cfg: Config, world_size: int, path: Path) -> None:
    # Resuming under a different seed/batch/world/lr could not be bit-identical; refuse loudly rather
    # than produce a digest that silently means something else.
    expected = {"seed": cfg.seed, "batch_size": cfg.batch_size, "world_size": world_size, "lr": cfg.lr}
    if state.get("config") != expected:
        raise ValueError(f"{path}: checkpoint config {state.get('config')} does not match this run {expected}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run one torchrun worker; return its exit code (0 after the final step, 1 on a collective failure).

    Bit-identical resumption holds because data is a pure function of the sample id, there is no other
    randomness, all state that evolves (model, momentum, step, RNG) is checkpointed, and with two ranks
    the gloo all-reduce is a single commutative addition. With more ranks the ring reduction order depends
    on the DDP bucket layout, which DDP rebuilds after the first iteration of every attempt, so exactness
    beyond world size 2 is not promised.
    """
    cfg = parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)

    # Emitted before rendezvous so a rank that never gets past init_process_group is still visible.
    emit(TARGET_START, rank=rank, pid=os.getpid(), attempt=attempt, world_size=world_size)
    if rank == 0 and attempt > 0:
        emit(TARGET_RESTART, rank=rank, attempt=attempt)

    torch.set_num_threads(1)  # one thread: reproducible reductions and no oversubscription of 2 cores
    torch.use_deterministic_algorithms(True)
    dist.init_process_group(backend="gloo", timeout=timedelta(seconds=cfg.pg_timeout))

    model = build_model(cfg.seed)
    optimizer = build_optimizer(model, cfg.lr)
    current_step = 0  # the step being attempted, reported with any detection
    try:
        start_step = 1
        if cfg.sabotage != "skip-restore":
            checkpoint_store.remove_own_temp_files(cfg.checkpoint_dir, rank)
            # Every rank verifies its own file against the manifest; the ranks agree on the newest step that
            # verified on all of them (it emits target.checkpoint_rejected, target.restore, target.resume).
            selected = checkpoint_store.restore(cfg.checkpoint_dir, rank=rank, world_size=world_size, attempt=attempt)
            if selected is not None:
                ckpt_step, ckpt_path, state = selected
                _check_compatible(state, cfg, world_size, ckpt_path)
                model.load_state_dict(state["model"])
                if cfg.sabotage != "skip-optimizer-restore":
                    optimizer.load_state_dict(state["optimizer"])
                torch.set_rng_state(state["rng"])
                start_step = ckpt_step + 1
        current_step = start_step

        # Wrapped after loading, so DDP's initial broadcast from rank 0 sends already-restored weights.
        ddp = DistributedDataParallel(model)
        # The in-job agent: fires this rank's planned SDC faults (CHAOS_PLAN) and runs the guards. Without a
        # plan it still installs the same guards, so golden and faulted runs share their numerics.
        agent = attach(
            model,
            optimizer=optimizer,
            ddp=ddp,
            guard=Guards(
                checksum=cfg.guard == "checksum", anomaly=cfg.anomaly_guard, consistency_every=cfg.consistency_every
            ),
            job_emits="all",  # this trainer reports its own start, steps, checkpoints, resume and digest
        )
        # The straggler guard only reads clocks and gathers two floats per rank: it never touches the model,
        # the optimizer or the data order, so the digest is the same with and without it.
        straggler = (
            StragglerGuard(
                window=cfg.straggler_window,
                ratio=cfg.straggler_ratio,
                min_excess=cfg.straggler_min_excess,
                links=cfg.straggler_links,
            )
            if cfg.straggler_guard
            else None
        )
        # Time inside a collective is waiting, not local work; the straggler guard must tell the two apart.
        blocked: Callable[[], AbstractContextManager[None]] = straggler.collective if straggler else nullcontext
        if straggler is not None:
            straggler.start()
        loss_fn = nn.MSELoss()
        steps = Steps(start_step, cfg.steps)  # rewound by a rollback (--rollback)
        rollback = (
            SdcRollback(
                agent.consistency,
                steps,
                model=model,
                optimizer=optimizer,
                directory=cfg.checkpoint_dir,
                seed=cfg.seed,
                lr=cfg.lr,
                rank=rank,
                world_size=world_size,
                attempt=attempt,
                policy="newest" if cfg.sabotage == "rollback-newest" else "clean",
            )
            if cfg.rollback
            else None
        )
        for step in steps:
            current_step = step
            agent.begin_step(step)
            ids = step_sample_ids(step, rank, cfg.batch_size, world_size)
            features, labels = make_batch(cfg.seed, ids)
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(ddp(features), labels)
            with blocked():
                loss.backward()  # the gradient all-reduce happens here; a dead or frozen peer surfaces here
                agent.after_backward(loss)  # the anomaly guard's all-reduce, if any
            if straggler is not None:
                # Right after the gradient sync, so a slow rank's lateness and its peers' wait in that sync
                # fall into the same step's numbers.
                straggler.exchange(step)
            if agent.allow_optimizer_step():  # False when every rank agreed a guard blocked this step
                optimizer.step()
            agent.end_step()
            emit(TARGET_STEP, rank=rank, step=step, loss=float(loss.item()), samples=ids, attempt=attempt)
            if rollback is not None and rollback.after_step(step):  # before this step's (poisoned) checkpoint
                continue  # every rank reloaded a checkpoint from before the corruption: replay from there
            if step % cfg.checkpoint_every == 0:
                # Two-phase commit (checkpoint_store): every rank writes its own file, rank 0 commits the
                # manifest and the pointer, and a barrier inside means no rank reports step K+1 before
                # checkpoint K is committed ("a rank reached K+1" implies "a restart resumes from >= K").
                # Each rank reports target.checkpoint {duration_s: its own save time, for goodput accounting}.
                # A transient storage error (EIO, ENOSPC) in the local write is retried with backoff (save_retry).
                save_with_retry(
                    partial(
                        checkpoint_store.save,
                        cfg.checkpoint_dir,
                        step,
                        _checkpoint_state(step, model, optimizer, cfg, world_size),
                        rank=rank,
                        world_size=world_size,
                        attempt=attempt,
                        stall_after=cfg.pg_timeout,  # storage stalled as long as a collective may wait
                    ),
                    step=step,
                    rank=rank,
                    collective=blocked,  # its gather and barrier are waiting, not local work
                )
            if cfg.step_time > 0:
                time.sleep(cfg.step_time)
    except Exception as exc:
        if not is_collective_failure(exc):
            raise
        full_message = str(exc)
        message = full_message[:300]
        kind = DETECT_COLLECTIVE_TIMEOUT if _is_timeout(message) else DETECT_COLLECTIVE_ERROR
        emit(kind, rank=rank, detector="gloo", message=message, step=current_step)
        # Emitted after the collective_* event, so scenarios that take the first detection keep seeing that one.
        lost_by = peer_loss_detector(full_message)
        if lost_by is not None:
            emit(
                DETECT_PEER_LOST,
                rank=rank,
                detector=lost_by,
                message=message,
                step=current_step,
                peer=peer_address(full_message),
            )
        print(f"ddp_trainer rank {rank}: {kind} at step {current_step}: {message}", file=sys.stderr, flush=True)
        if not _shutdown_process_group(_DESTROY_TIMEOUT_S):
            # The teardown is stuck in C++; exiting now (non-zero) is what lets torchrun restart us.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)
        return 1

    agent.close()  # heals in-job faults (undoing only their own change) before the final digest
    digest = state_digest(model, optimizer)
    final_step = max(start_step - 1, cfg.steps)
    emit(TARGET_DIGEST, rank=rank, digest=digest, step=final_step, attempt=attempt)
    if rank == 0:
        out = cfg.checkpoint_dir / FINAL_DIGEST_FILE
        cfg.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + f".tmp.{os.getpid()}")
        tmp.write_text(digest + "\n", encoding="utf-8")
        os.replace(tmp, out)
    # Give gloo's worker threads the GIL for a moment before teardown. A worker releases the last collective's
    # work object after the caller has already moved on, and that release needs the GIL; if this thread is by
    # then destroying the process group (DDP's reducer holds it; it goes when this frame is cleared), it holds
    # the GIL while joining that worker: a deadlock after the final step (seen in about half of the runs with
    # --step-time 0 and 3 ranks; a step-time sleep after the last step hid it).
    time.sleep(_TEARDOWN_GRACE_S)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
