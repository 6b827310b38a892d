"""The gateway's relay of one streamed chat answer down its ladder of replicas.

Contract of :func:`relay` (``rungs`` in ladder order; each skipped unless up and its breaker allows):

- Before the client has seen anything, a rung that is refused, times out, answers 5xx or not a stream is a
  breaker failure and the next rung is tried (as for ``/v1/predict``); a 4xx is passed through as is. No rung
  left: 502 ``{"error": ...}`` with ``X-Backend: gateway``.
- Once a rung answers 200, the client gets the head (``X-Backend``: that rung) and every chunk object as it
  arrives, unchanged (each names the replica that produced it). A clean end (``[DONE]`` for SSE, the last
  HTTP chunk for JSON lines) is relayed and counts as the rung's success.
- An upstream cut mid-stream (EOF or reset without the end marker, malformed framing, no byte for
  ``timeout``) is a breaker failure. With ``resume`` the next usable rung is asked for the same request with
  ``resume_from: k`` (k = tokens relayed so far) and its chunks are relayed on; without ``resume``, or with no
  rung left, the client's connection is closed with its body unfinished: the client sees the cut.
- A client that hangs up ends the relay without counting against the upstream.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from chaos.reference.serving.breaker import CircuitBreaker
from chaos.reference.serving.chat import CHAT_PATH, DONE_EVENT, SSE, ClientGone, StreamWriter, is_token
from chaos.reference.serving.health import ReplicaHealth
from chaos.spec.serving import ReplicaEndpoint


class Rung(Protocol):
    name: str
    endpoint: ReplicaEndpoint
    health: ReplicaHealth
    breaker: CircuitBreaker


class UpstreamCut(Exception):
    """The upstream's stream ended without its end marker."""


def _payloads(response: http.client.HTTPResponse, sse: bool) -> Iterator[bytes]:
    """The chunk objects of an upstream stream, as raw JSON; returns at its end marker, raises
    :class:`UpstreamCut` (or the socket's error) when it ends otherwise."""
    data: list[bytes] = []
    while True:
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


def _open(rung: Rung, body: bytes, accept: str, timeout: float) -> tuple[http.client.HTTPConnection, Any]:
    conn = http.client.HTTPConnection(rung.endpoint.host, rung.endpoint.port, timeout=timeout)
    try:
        conn.request("POST", CHAT_PATH, body=body, headers={"Content-Type": "application/json", "Accept": accept})
        return conn, conn.getresponse()
    except BaseException:
        conn.close()
        raise


def relay(rungs: Sequence[Rung], out: StreamWriter, request: dict[str, Any], timeout: float, resume: bool) -> str:
    """Relay one streamed answer to ``out`` (see the module docstring); returns the first backend that
    answered (``gateway`` when none did)."""
    sent = 0  # tokens the client has received
    first = "gateway"
    for rung in rungs:
        if out.started and not resume:
            break
        if not rung.health.up or not rung.breaker.allow():
            continue
        body = json.dumps({**request, "stream": True, **({"resume_from": sent} if out.started else {})}).encode()
        try:
            conn, response = _open(rung, body, out.fmt, timeout)
        except Exception:  # noqa: BLE001 - refused, reset, timed out: the next rung
            rung.breaker.failure()
            continue
        try:
            if response.status != 200:
                if response.status >= 500 or out.started:
                    rung.breaker.failure()
                    continue
                rung.breaker.success()  # a 4xx is the request's fault: passed through
                out.handler.send_raw(response.status, response.read(), {"X-Backend": rung.name})
                return rung.name
            if not out.started:
                out.start(rung.name)
                first = rung.name
            try:
                for payload in _payloads(response, out.fmt == SSE):
                    out.payload(payload)
                    sent += is_token(payload)
            except ClientGone:
                raise
            except Exception:  # noqa: BLE001 - cut, reset, timed out, malformed: resume or cut
                rung.breaker.failure()
                continue
            rung.breaker.success()
            out.finish()
            return first
        finally:
            conn.close()
    if out.started:
        out.cut()
    else:
        out.handler.send_json(
            502, {"error": "no backend could stream", "backends": [r.name for r in rungs]}, {"X-Backend": "gateway"}
        )
    return first
