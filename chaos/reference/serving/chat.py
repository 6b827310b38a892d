"""The streaming wire of the reference serving stack (no torch): an OpenAI-style ``/v1/chat/completions``.

Contracts (the model server speaks them, the gateway relays them):

- Request: a JSON object with ``messages`` (a list of ``{role, content}``; the prompt is their contents
  joined by newlines) or ``prompt`` (text); optional ``max_tokens`` (int >= 1), ``stream`` (bool) and
  ``resume_from`` (int >= 0, an mlchaos extension: the first k tokens were already delivered by another
  replica; generate them silently and stream from token k on).
- Streamed answer (``stream: true``): 200, ``Transfer-Encoding: chunked``, header ``X-Backend``; format by the
  request's ``Accept``: ``text/event-stream`` (default) frames each chunk object as ``data: JSON`` and a blank
  line and ends with ``data: [DONE]``; ``application/x-ndjson`` writes one JSON line per chunk object and
  ends with the last HTTP chunk. Chunk objects have the OpenAI shape (``object: chat.completion.chunk``,
  ``choices[0].delta.content``, ``finish_reason``) plus ``backend`` (the replica) and, on token chunks,
  ``token`` (its position in the answer, from 0). A role chunk (``delta: {role}``) opens a fresh answer (not
  a resumed one) and a ``finish_reason: "length"`` chunk closes it.
- Whole answer (``stream: false``): 200 ``{object: chat.completion, choices[0].message.content, usage,
  backend}``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Literal

from chaos.reference.serving.wire import JsonHandler, RequestError

CHAT_PATH = "/v1/chat/completions"
Format = Literal["text/event-stream", "application/x-ndjson"]
SSE: Format = "text/event-stream"
NDJSON: Format = "application/x-ndjson"
DONE_EVENT = b"data: [DONE]\n\n"


@dataclass(frozen=True)
class ChatRequest:
    prompt: str
    max_tokens: int | None
    stream: bool
    resume_from: int


def _count(request: dict[str, Any], key: str, low: int) -> int | None:
    value = request.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise RequestError(f"{key!r} must be an integer >= {low}")
    return value


def parse_chat(body: bytes) -> ChatRequest:
    """The chat request in ``body``; raises :class:`RequestError` when it is not one."""
    try:
        request = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(f"body is not JSON: {exc}") from exc
    return chat_request(request)


def chat_request(request: object) -> ChatRequest:
    """The chat request in a parsed JSON body; raises :class:`RequestError` when it is not one."""
    if not isinstance(request, dict):
        raise RequestError("body must be a JSON object with 'messages' or 'prompt'")
    messages = request.get("messages")
    if isinstance(messages, list) and messages:
        if not all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages):
            raise RequestError("each message needs a string 'content'")
        prompt = "\n".join(m["content"] for m in messages)
    elif isinstance(request.get("prompt"), str):
        prompt = request["prompt"]
    else:
        raise RequestError("body needs 'messages' (a non-empty list) or 'prompt' (a string)")
    return ChatRequest(
        prompt=prompt,
        max_tokens=_count(request, "max_tokens", 1),
        stream=request.get("stream") is True,
        resume_from=_count(request, "resume_from", 0) or 0,
    )


def stream_format(accept: str | None) -> Format:
    """The answer format a request's ``Accept`` asks for (SSE unless it names only JSON lines)."""
    if accept and NDJSON in accept and SSE not in accept:
        return NDJSON
    return SSE


def chunk(
    answer_id: str,
    backend: str,
    *,
    content: str | None = None,
    token: int | None = None,
    role: bool = False,
    finish: str | None = None,
) -> dict[str, Any]:
    """One ``chat.completion.chunk`` object."""
    delta: dict[str, Any] = {"role": "assistant"} if role else {}
    if content is not None:
        delta["content"] = content
    answer: dict[str, Any] = {
        "id": answer_id,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": "mlchaos-token-lm",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        "backend": backend,
    }
    if token is not None:
        answer["token"] = token
    return answer


def completion(answer_id: str, backend: str, text: str, prompt_tokens: int, tokens: int) -> dict[str, Any]:
    """The whole answer of a ``stream: false`` request."""
    return {
        "id": answer_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": "mlchaos-token-lm",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": tokens, "total_tokens": prompt_tokens + tokens},
        "backend": backend,
    }


def token_text(payload: bytes) -> str | None:
    """The token one relayed payload carries (a chunk's non-empty content), or None when it carries none."""
    try:
        doc = json.loads(payload)
        content = doc["choices"][0]["delta"].get("content")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return None
    return content if isinstance(content, str) and content != "" else None


class ClientGone(Exception):
    """Writing to the client failed: it hung up (not the upstream's fault)."""


class StreamWriter:
    """A streamed answer on one handler's connection: :meth:`start` (the head), :meth:`payload` per chunk
    object, then :meth:`finish` (end marker and last chunk) or :meth:`cut` (the connection closes with the
    body unfinished, as a dying server's would). Write failures raise :class:`ClientGone`."""

    def __init__(self, handler: JsonHandler, fmt: Format) -> None:
        self.handler = handler
        self.fmt = fmt
        self.started = False

    def start(self, backend: str) -> None:
        h = self.handler
        try:
            h.send_response(200)
            h.send_header("Content-Type", self.fmt)
            h.send_header("Cache-Control", "no-cache")
            h.send_header("Transfer-Encoding", "chunked")
            h.send_header("X-Backend", backend)
            h.end_headers()
        except OSError as exc:
            raise ClientGone(str(exc)) from exc
        self.started = True

    def payload(self, raw: bytes) -> None:
        """One chunk object, already JSON."""
        self._chunk(b"data: " + raw + b"\n\n" if self.fmt == SSE else raw + b"\n")

    def event(self, answer: dict[str, Any]) -> None:
        self.payload(json.dumps(answer, separators=(",", ":")).encode())

    def finish(self) -> None:
        if self.fmt == SSE:
            self._chunk(DONE_EVENT)
        self._write(b"0\r\n\r\n")

    def cut(self) -> None:
        self.handler.close_connection = True

    def _chunk(self, data: bytes) -> None:
        self._write(b"%x\r\n%s\r\n" % (len(data), data))

    def _write(self, data: bytes) -> None:
        try:
            self.handler.wfile.write(data)
        except OSError as exc:
            raise ClientGone(str(exc)) from exc
