"""Retry a checkpoint save with exponential backoff: what a job should do when storage fails for a while.

Lablup's operations report: transient storage errors (``EIO`` from a flaky network filesystem, ``ENOSPC`` until
an old checkpoint is cleaned up) must neither crash the job nor be retried in a tight loop. :func:`save_with_retry`
runs ``save`` and, when it raises an ``OSError`` with a transient errno (:data:`TRANSIENT`), reports
``target.checkpoint_retry`` {step, attempt (the failed try, 1-based), errno_name, error, delay_s}, sleeps
``delay_s`` (``base_s`` x ``factor``^(attempt-1), capped at ``cap_s``) and tries again, up to ``max_attempts``
tries; then it reports ``target.checkpoint_failed`` {step, attempts, error} and re-raises (the job exits non-zero).

Only the save's LOCAL phase is retried. ``save`` takes a ``collective`` context factory (as
:func:`chaos.reference.checkpoint_store.save` does) and enters it around each of its collectives; a
failure after the first collective began is not retried but re-raised, because repeating the save then would
call a gather while the peers wait in a barrier. Every rank writes to the same storage, so in an error window
each rank retries its own part before the first collective, and the ranks meet there once their writes succeed.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import TypeVar

from chaos.event_kinds import TARGET_CHECKPOINT_FAILED, TARGET_CHECKPOINT_RETRY
from chaos.events import emit

T = TypeVar("T")

TRANSIENT = frozenset(
    {errno.EIO, errno.ENOSPC, errno.EDQUOT, errno.EAGAIN, errno.EINTR, errno.EBUSY, errno.ETIMEDOUT, errno.ESTALE}
)
"""Errors a save may meet for a while and then not (a flaky mount, a full disk that gets cleaned)."""


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff: the delay after failed try ``k`` (1-based) is ``base_s * factor**(k-1)``, at most
    ``cap_s``; at most ``max_attempts`` tries in all."""

    base_s: float = 0.2
    factor: float = 2.0
    cap_s: float = 5.0
    max_attempts: int = 8

    def delay(self, attempt: int) -> float:
        return min(self.base_s * self.factor ** (attempt - 1), self.cap_s)


DEFAULT = Backoff()


def save_with_retry(
    save: Callable[..., T],
    *,
    step: int,
    rank: int,
    collective: Callable[[], AbstractContextManager[None]] = nullcontext,
    policy: Backoff = DEFAULT,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """``save(collective=...)`` with retries (see the module docstring); returns what it returns."""
    attempt = 0
    while True:
        attempt += 1
        began = False

        @contextmanager
        def watched() -> Iterator[None]:
            nonlocal began
            began = True
            with collective():
                yield

        try:
            return save(collective=watched)
        except OSError as exc:
            code = exc.errno if exc.errno is not None else 0
            name = errno.errorcode.get(code, str(code))
            error = f"{type(exc).__name__}: {exc}"[:300]
            if began or code not in TRANSIENT or attempt >= policy.max_attempts:
                emit(TARGET_CHECKPOINT_FAILED, rank=rank, step=step, attempts=attempt, error=error, errno_name=name)
                raise
            delay = policy.delay(attempt)
            emit(
                TARGET_CHECKPOINT_RETRY,
                rank=rank,
                step=step,
                attempt=attempt,
                errno_name=name,
                error=error,
                delay_s=round(delay, 6),
                pid=os.getpid(),
            )
            sleep(delay)
