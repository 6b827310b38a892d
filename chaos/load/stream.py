"""Reading one streamed answer as it arrives: its tokens, when each came, which backend produced it.

Contract: a :class:`StreamRead` is fed the body bytes of one 2xx response, already stripped of HTTP framing
(the engine de-chunks), with the loop time they arrived at.

- ``sse``: events are separated by a blank line; an event's ``data:`` lines are its payload; ``data: [DONE]``
  is the end marker (``done``). Comments, ``event:``/``id:``/``retry:`` lines are ignored.
- ``chunked``: each non-blank line is one payload; the end marker is the clean end of the body (the engine
  calls :meth:`StreamRead.body_ended`: the terminating zero chunk, a complete Content-Length, or EOF of a
  close-delimited body).
- A payload is a token when it is JSON with a non-empty ``choices.0.delta.content`` (or ``choices.0.text``),
  or JSON without ``choices`` at all, or any other non-empty text; an OpenAI chunk without content (the role
  or ``finish_reason`` chunk) is not one.
- The backend of a token is the spec's ``served_by`` ``{json: path}`` read on its payload, else the
  response's own backend (its header). ``backends`` lists the distinct ones in order of first appearance.

:func:`stream_fields` turns a reader (or None: no 2xx head came) into the stream fields of a
``load.request`` event; see :mod:`chaos.load` for their contract.
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import JsonValue

from chaos.load.codec import MISSING, Codec, lookup

Ended = Literal["complete", "cut", "error", "timeout"]
_DONE = b"[DONE]"


def _is_token(payload: bytes) -> tuple[bool, object]:
    """Whether one payload is a token, and its parsed JSON (:data:`MISSING` when it is not JSON)."""
    try:
        doc: object = json.loads(payload)
    except ValueError:
        return bool(payload.strip()), MISSING
    if isinstance(doc, dict) and "choices" in doc:
        content = lookup(doc, "choices.0.delta.content")
        if content is MISSING:
            content = lookup(doc, "choices.0.text")
        return isinstance(content, str) and content != "", doc
    return True, doc


class StreamRead:
    """The incremental reader of one streamed response (see the module docstring)."""

    __slots__ = (
        "codec",
        "sse",
        "header_backend",
        "degraded",
        "done",
        "tokens",
        "first",
        "last",
        "gaps",
        "backends",
        "_line",
        "_data",
    )

    def __init__(self, codec: Codec, header_backend: str | None, header_degraded: bool | None) -> None:
        self.codec = codec
        self.sse = codec.spec.stream == "sse"
        self.header_backend = header_backend
        self.degraded = header_degraded
        self.done = False  # the end marker arrived
        self.tokens = 0
        self.first: float | None = None  # loop time of the first token
        self.last = 0.0
        self.gaps: list[float] = []
        self.backends: list[str] = []
        self._line = bytearray()  # a line not yet complete
        self._data: list[bytes] = []  # the data lines of the SSE event being read

    def feed(self, data: bytes | bytearray, now: float) -> None:
        """Body bytes that arrived at loop time ``now``."""
        if self.done:
            return
        line = self._line
        line += data
        start = 0
        while not self.done:
            eol = line.find(b"\n", start)
            if eol < 0:
                break
            text = bytes(line[start:eol]).rstrip(b"\r")
            start = eol + 1
            if self.sse:
                self._sse_line(text, now)
            elif text.strip():
                self._payload(text, now)
        del line[:start]

    def body_ended(self) -> None:
        """The response body ended cleanly: the end marker of a ``chunked`` stream (a last line without a
        newline counts); nothing for ``sse``, whose marker is ``[DONE]``."""
        if self.sse or self.done:
            return
        if self._line.strip():
            self._payload(bytes(self._line), self.last)
            self._line.clear()
        self.done = True

    def _sse_line(self, text: bytes, now: float) -> None:
        if not text:  # a blank line dispatches the event
            if self._data:
                payload = b"\n".join(self._data)
                self._data.clear()
                if payload.strip() == _DONE:
                    self.done = True
                else:
                    self._payload(payload, now)
            return
        if text.startswith(b"data:"):
            value = text[5:]
            self._data.append(value[1:] if value[:1] == b" " else value)

    def _payload(self, payload: bytes, now: float) -> None:
        token, doc = _is_token(payload)
        if not token:
            return
        self.tokens += 1
        if self.first is None:
            self.first = now
        else:
            self.gaps.append(round(now - self.last, 6))
        self.last = now
        codec = self.codec
        backend = self.header_backend
        if doc is not MISSING:
            backend = codec.event_backend(doc) or backend
            if not self.degraded and codec.event_degraded(doc):
                self.degraded = True
        if backend is not None and (not self.backends or backend != self.backends[-1]):
            if backend not in self.backends:
                self.backends.append(backend)

    def backend(self) -> str | None:
        """The first backend that produced a token, else the response's own."""
        return self.backends[0] if self.backends else self.header_backend

    def ended(self, timed_out: bool) -> Ended:
        """How the stream ended, given that its request is over now (``timed_out``: by its timeout)."""
        if self.done:
            return "complete"
        if timed_out:
            return "timeout"
        return "cut" if self.tokens else "error"


def stream_fields(read: StreamRead | None, due: float, status: int | str, session: str | None) -> dict[str, JsonValue]:
    """The stream fields of one ``load.request`` event: ``read`` is None when no 2xx head arrived (refused,
    reset, non-2xx, timed out or cancelled before, dropped by the client)."""
    if read is None:
        ended: Ended = "timeout" if status == "timeout" else "error"
        return {
            "stream": True,
            "ttft_s": None,
            "gaps_s": [],
            "tokens": 0,
            "ended": ended,
            "backends": [],
            "resumed": False,
            "session": session,
        }
    ended = read.ended(status == "timeout")
    backends: list[JsonValue] = list(read.backends)
    return {
        "stream": True,
        "ttft_s": None if read.first is None else round(read.first - due, 6),
        "gaps_s": list(read.gaps),
        "tokens": read.tokens,
        "ended": ended,
        "backends": backends,
        "resumed": ended == "complete" and len(backends) >= 2,
        "session": session,
    }


def count_stream(totals: dict[str, int | float], fields: dict[str, JsonValue]) -> dict[str, JsonValue]:
    """Add one request's stream ``fields`` to the run's totals (complete, cut, resumed, tokens); returns them."""
    tokens = fields["tokens"]
    totals["tokens"] += tokens if isinstance(tokens, int) else 0
    if fields["ended"] == "complete":
        totals["complete"] += 1
    elif fields["ended"] == "cut":
        totals["cut"] += 1
    if fields["resumed"]:
        totals["resumed"] += 1
    return fields


def unfinished(stream: StreamRead, why: str = "the body ended without the end marker") -> str:
    """The ``error`` of a request whose stream did not reach its end marker."""
    return f"stream cut after {stream.tokens} tokens: {why}"[:300]
