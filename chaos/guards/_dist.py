"""Run a function on every rank of a fresh local gloo process group, with a deadline and results returned.

Used by the SDC coverage campaign, the checksum benchmark and the guard tests. ``torch.multiprocessing.spawn``
has neither a timeout nor a way to return values, and a hung collective must never hang a test or a CI job,
so this starts the ranks itself, collects each rank's return value over a queue, relays progress messages, and
kills the ranks it started when the deadline passes or one of them fails.

Ranks are forked from a forkserver that imported torch once (per calling process), not spawned: a fresh
interpreter per rank paid torch's import (seconds on a small machine) at every group. The forkserver is a
clean process (it never ran a collective or started a thread), so forking it is safe where forking the caller
(which may hold torch's thread pools or a process group) would not be.
"""

from __future__ import annotations

import queue as queue_mod
import socket
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Protocol

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


class Report(Protocol):
    """What a rank function calls to send a (picklable) progress message to the parent."""

    def __call__(self, message: Any) -> None: ...


RankFn = Callable[..., Any]


class GroupFailed(RuntimeError):
    """A rank raised, died, or the group ran past its deadline; the message carries the rank's traceback."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it; a race is possible, and rare)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class _QueueReport:
    def __init__(self, channel: Any) -> None:
        self._channel = channel

    def __call__(self, message: Any) -> None:
        self._channel.put(("msg", message))


def _entry(
    fn: RankFn, rank: int, world_size: int, port: int, timeout_s: float, channel: Any, args: tuple[Any, ...]
) -> None:
    try:
        # One intra-op thread per rank: the ranks share the machine's cores, and oversubscription would make
        # every timing (and the campaign's runtime) noisy.
        torch.set_num_threads(1)
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout_s),
        )
        try:
            value = fn(rank, world_size, _QueueReport(channel), *args)
        finally:
            dist.destroy_process_group()
        channel.put(("result", rank, value))
    except BaseException:  # noqa: BLE001 - everything must reach the parent, or it would wait for the deadline
        channel.put(("error", rank, traceback.format_exc()))


def run_group(
    fn: RankFn,
    world_size: int,
    *args: Any,
    timeout_s: float = 120.0,
    on_message: Callable[[Any], None] | None = None,
) -> list[Any]:
    """Run ``fn(rank, world_size, report, *args)`` on ``world_size`` fresh processes in one gloo group.

    ``fn`` must be importable by name (a module-level function) and its arguments and return value picklable.
    Returns the per-rank return values, indexed by rank. Raises :class:`GroupFailed` with the first failing
    rank's traceback if any rank raises or dies, or when ``timeout_s`` passes; every started process is
    gone when this returns or raises. Collectives inside time out after ``timeout_s`` as well.
    """
    ctx = _rank_context()
    channel = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_entry, args=(fn, rank, world_size, port, timeout_s, channel, args), daemon=True)
        for rank in range(world_size)
    ]
    for proc in procs:
        proc.start()
    results: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(results) < world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise GroupFailed(f"group of {world_size} ranks ran past its {timeout_s:.0f} s deadline")
            try:
                item = channel.get(timeout=min(remaining, 1.0))
            except queue_mod.Empty:
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise GroupFailed(f"rank process {dead[0].pid} died with exit code {dead[0].exitcode}") from None
                continue
            if item[0] == "msg":
                if on_message is not None:
                    on_message(item[1])
            elif item[0] == "result":
                results[item[1]] = item[2]
            else:
                raise GroupFailed(f"rank {item[1]} failed:\n{item[2]}")
        return [results[rank] for rank in range(world_size)]
    finally:
        _reap(procs)
        channel.close()


# What the forkserver imports before it forks the first rank: everything a rank needs from torch.
_PRELOAD = ["torch", "torch.distributed", "torch.multiprocessing"]


def _rank_context() -> Any:
    """The forkserver context, its preload set before the server's first start (later calls change nothing)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
    return ctx


def _reap(procs: list[Any]) -> None:
    """Join our own processes; terminate, then kill, the ones still running (by their Process objects)."""
    for proc in procs:
        proc.join(timeout=10)
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
            proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5)
