"""The cached rung of the gateway's ladder for streamed chat answers: earlier complete answers by prompt,
replayed as a degraded stream when no model rung can answer.

Contracts:

- :class:`AnswerCache` holds the token texts of the last complete answer to each prompt (an LRU of ``size``
  prompts; thread-safe). The gateway fills it as model streams end cleanly; nothing else writes it.
- :func:`stream_cached` answers one request from it: a hit replays the cached tokens (at most ``max_tokens``),
  a miss :data:`DEGRADED_TEXT`. Every chunk names ``backend: cache`` and carries ``degraded: true`` and
  ``cached`` (hit or miss); token chunks carry their position ``token``. A fresh answer opens with the role
  chunk and the head ``X-Backend: cache``; every answer closes with the ``finish_reason`` chunk and the
  format's end marker. No pacing: the cache answers as fast as the client reads.
- Resuming a stream cut after ``k`` tokens continues only a hit that holds more than ``k`` tokens (the same
  answer: a prompt's tokens are the same on every replica); the cache cannot continue an answer it does not
  hold, so otherwise it writes nothing and returns False (the caller cuts the client's stream).
"""

from __future__ import annotations

import itertools
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence

from chaos.reference.serving.chat import StreamWriter, chunk
from chaos.spec.serving import CACHE

DEGRADED_TEXT: tuple[str, ...] = tuple(f"{w} " for w in "the model is busy right now please ask again later".split())
_IDS = itertools.count()


class AnswerCache:
    """The last complete answer (its token texts) to each of the ``size`` most recently answered prompts."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._answers: OrderedDict[str, tuple[str, ...]] = OrderedDict()

    def remember(self, prompt: str, tokens: Sequence[str]) -> None:
        """Store a complete answer to ``prompt`` (replacing an older one)."""
        if not tokens:
            return
        with self._lock:
            self._answers[prompt] = tuple(tokens)
            self._answers.move_to_end(prompt)
            while len(self._answers) > self.size:
                self._answers.popitem(last=False)

    def lookup(self, prompt: str) -> tuple[str, ...] | None:
        with self._lock:
            return self._answers.get(prompt)

    def __len__(self) -> int:
        return len(self._answers)


def stream_cached(out: StreamWriter, cache: AnswerCache, prompt: str, max_tokens: int | None, start: int = 0) -> bool:
    """Answer ``prompt`` on ``out`` from ``cache`` from token ``start`` on (see the module docstring); False
    when a resumed stream cannot be continued (nothing written)."""
    hit = cache.lookup(prompt)
    tokens = hit if hit is not None else DEGRADED_TEXT
    if max_tokens is not None:
        tokens = tokens[:max_tokens]
    if start > 0 and (hit is None or len(tokens) <= start):
        return False
    answer_id = f"chatcmpl-cache-{os.getpid()}-{next(_IDS)}"
    marks = {"degraded": True, "cached": hit is not None}
    if not out.started:
        out.start(CACHE)
    if start == 0:
        out.event({**chunk(answer_id, CACHE, role=True), **marks})
    for position in range(start, len(tokens)):
        out.event({**chunk(answer_id, CACHE, content=tokens[position], token=position), **marks})
    out.event({**chunk(answer_id, CACHE, finish="length"), **marks})
    out.finish()
    return True
