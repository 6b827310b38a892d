"""The gateway's relay of one streamed chat answer down its ladder of replicas, then the cached rung.

Contract of :func:`relay` (``rungs`` in ladder order; each skipped unless up and its breaker allows):

- Before the client has a token, a rung that is refused, times out, answers 5xx or not a stream, or ends or
  is cut before its first token is a breaker failure and the next rung is tried afresh (as for
  ``/v1/predict``); a 4xx is passed through as is. With ``first_token_timeout``, a rung whose first token has
  not come that long after the attempt began counts as timed out too (a slow replica costs at most that much
  time to first token). The client's head (``X-Backend``: that rung) goes out with the first token, after the
  chunks that came before it (the role chunk); then every chunk object as it arrives, unchanged (each names
  the replica that produced it). A clean end (``[DONE]`` for SSE, the last HTTP chunk for JSON lines) is
  relayed and counts as the rung's success; the answer's tokens then fill ``cache`` under its prompt.
- An upstream cut after the client has tokens (EOF or reset without the end marker, malformed framing, no
  byte for ``timeout``) is a breaker failure. With ``resume`` the next usable rung is asked for the same
  request with ``resume_from: k`` (k = tokens relayed so far) and its chunks are relayed on; without
  ``resume``, or with no rung left, the client's connection is closed with its body unfinished: the client
  sees the cut.
- No model rung left: with ``cache`` (the gateway's ``cache_fallback``) the cached rung answers
  (:func:`~chaos.reference.serving.answer_cache.stream_cached`: a fresh answer always; a resumed one only
  when the cache holds that answer, and only with ``resume``); else 502 ``{"error": ...}`` with
  ``X-Backend: gateway`` before any token, a cut after.
- A client that hangs up ends the relay without counting against the upstream.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal, Protocol

from chaos.reference.serving.answer_cache import AnswerCache, stream_cached
from chaos.reference.serving.breaker import CircuitBreaker
from chaos.reference.serving.chat import (
    CHAT_PATH,
    DONE_EVENT,
    SSE,
    ChatRequest,
    ClientGone,
    StreamWriter,
    chat_request,
    token_text,
)
from chaos.reference.serving.health import ReplicaHealth
from chaos.reference.serving.wire import RequestError
from chaos.spec.serving import CACHE, ReplicaEndpoint

GATEWAY = "gateway"  # the X-Backend of an answer no rung gave
Outcome = Literal["done", "failed", "passed"]


class Rung(Protocol):
    name: str
    endpoint: ReplicaEndpoint
    health: ReplicaHealth
    breaker: CircuitBreaker


class UpstreamCut(Exception):
    """The upstream's stream ended without its end marker."""


def _payloads(response: http.client.HTTPResponse, sse: bool, before_read: Callable[[], None]) -> Iterator[bytes]:
    """The chunk objects of an upstream stream, as raw JSON; returns at its end marker, raises
    :class:`UpstreamCut` (or the socket's error) when it ends otherwise. ``before_read`` runs before each
    line is read (it sets the socket's timeout)."""
    data: list[bytes] = []
    while True:
        before_read()
        line = response.readline()
        if not line:  # the body ended: the end marker for JSON lines, a cut for SSE
            if sse:
                raise UpstreamCut("the stream ended without data: [DONE]")
            return
        line = line.rstrip(b"\r\n")
        if not sse:
            if line.strip():
                yield line
            continue
        if line.startswith(b"data:"):
            value = line[5:]
            data.append(value[1:] if value[:1] == b" " else value)
        elif not line and data:
            payload = b"\n".join(data)
            data.clear()
            if payload.strip() == DONE_EVENT[6:-2]:
                return
            yield payload


def _open(
    rung: Rung, body: bytes, accept: str, timeout: float
) -> tuple[http.client.HTTPConnection, socket.socket, http.client.HTTPResponse]:
    conn = http.client.HTTPConnection(rung.endpoint.host, rung.endpoint.port, timeout=timeout)
    try:
        conn.request("POST", CHAT_PATH, body=body, headers={"Content-Type": "application/json", "Accept": accept})
        sock = conn.sock  # getresponse may let go of it (the response keeps reading from it)
        return conn, sock, conn.getresponse()
    except BaseException:
        conn.close()
        raise


def _attempt(
    rung: Rung,
    out: StreamWriter,
    request: dict[str, Any],
    texts: list[str],
    timeout: float,
    first_token_timeout: float | None,
) -> Outcome:
    """One try at one rung: ``done`` (its stream ended cleanly on ``out``), ``failed`` (a breaker failure: try
    the next rung) or ``passed`` (its 4xx went to the client as is). Each token relayed is appended to
    ``texts``."""
    resuming = out.started
    body = json.dumps({**request, "stream": True, **({"resume_from": len(texts)} if resuming else {})}).encode()
    deadline = None if resuming or first_token_timeout is None else time.monotonic() + first_token_timeout
    try:
        conn, sock, response = _open(
            rung, body, out.fmt, timeout if deadline is None else min(timeout, _left(deadline))
        )
    except Exception:  # noqa: BLE001 - refused, reset, timed out: the next rung
        rung.breaker.failure()
        return "failed"

    def before_read() -> None:
        nonlocal deadline
        if deadline is None:
            return
        if out.started:  # the first token came: from now on only the idle timeout
            deadline = None
            sock.settimeout(timeout)
        elif _left(deadline) <= 0:
            raise TimeoutError(f"no first token from {rung.name} within {first_token_timeout}s")
        else:
            sock.settimeout(min(timeout, _left(deadline)))

    try:
        if response.status != 200:
            if response.status >= 500 or resuming:
                rung.breaker.failure()
                return "failed"
            rung.breaker.success()  # a 4xx is the request's fault: passed through
            out.handler.send_raw(response.status, response.read(), {"X-Backend": rung.name})
            return "passed"
        held: list[bytes] = []  # chunks before the first token: the client gets them with it
        try:
            for payload in _payloads(response, out.fmt == SSE, before_read):
                text = token_text(payload)
                if text is None and not out.started:
                    held.append(payload)
                    continue
                if not out.started:
                    _start(out, rung, held)
                out.payload(payload)
                if text is not None:
                    texts.append(text)
        except ClientGone:
            raise
        except Exception:  # noqa: BLE001 - cut, reset, timed out, malformed: resume or cut
            rung.breaker.failure()
            return "failed"
        rung.breaker.success()
        if not out.started:  # a clean answer without a token
            _start(out, rung, held)
        out.finish()
        return "done"
    finally:
        conn.close()


def _left(deadline: float) -> float:
    """Seconds from now until ``deadline`` (a ``time.monotonic()`` value); negative once it has passed."""
    return deadline - time.monotonic()


def _start(out: StreamWriter, rung: Rung, held: list[bytes]) -> None:
    """Open the client's answer as ``rung``'s: the head, then the chunks held back until its first token."""
    out.start(rung.name)
    for early in held:
        out.payload(early)


def _asked(request: dict[str, Any]) -> ChatRequest | None:
    try:
        return chat_request(request)
    except RequestError:
        return None


def relay(
    rungs: Sequence[Rung],
    out: StreamWriter,
    request: dict[str, Any],
    timeout: float,
    resume: bool,
    *,
    first_token_timeout: float | None = None,
    cache: AnswerCache | None = None,
) -> str:
    """Relay one streamed answer to ``out`` (see the module docstring); returns the backend that gave the client
    its first token (``cache`` for the cached rung, ``gateway`` when none did)."""
    texts: list[str] = []  # the tokens the client has received
    asked = _asked(request) if cache is not None else None  # what the cached rung answers and remembers
    first = GATEWAY
    for rung in rungs:
        if out.started and not resume:
            break
        if not rung.health.up or not rung.breaker.allow():
            continue
        started = out.started
        outcome = _attempt(rung, out, request, texts, timeout, first_token_timeout)
        if out.started and not started:
            first = rung.name
        if outcome == "passed":
            return rung.name
        if outcome == "done":
            if cache is not None and asked is not None:
                cache.remember(asked.prompt, texts)
            return first
    if cache is not None and asked is not None and (resume or not out.started):
        started = out.started
        if stream_cached(out, cache, asked.prompt, asked.max_tokens, len(texts)):
            return first if started else CACHE
    if out.started:
        out.cut()
    else:
        out.handler.send_json(
            502, {"error": "no backend could stream", "backends": [r.name for r in rungs]}, {"X-Backend": GATEWAY}
        )
    return first
