"""A cached-answers server written the way users write the last rung of a fallback ladder: no model, only the
answers recorded earlier from the big model, replayed in the same OpenAI-style Server-Sent Events a model server
streams. Python's standard library only: one asyncio event loop (a cache waits on nothing but its clients), with
the little HTTP/1.1 it needs written out by hand.

It imports nothing from mlchaos. Run it as a load balancer's last backup server
(``scenarios/serving-stream-haproxy-ladder.yaml``)::

    python3 tests/jobs/user_answer_cache.py --port 18183 --answers scenarios/haproxy/cached-answers.json

- ``--answers`` is a JSON object mapping a prompt (the user messages' contents joined by newlines, as
  ``tests/jobs/user_stream_server.py`` reads them) to the answer text.
- ``POST /v1/chat/completions`` with ``"stream": true`` answers 200 ``text/event-stream`` (HTTP/1.1 chunked) in
  user_stream_server.py's wire format: a role chunk, one ``data: {...}`` event per word of the cached answer (at
  most ``max_tokens``), a ``finish_reason: "length"`` chunk and ``data: [DONE]``; ``model`` is ``cache``.
  Without ``stream: true`` it answers the whole completion as one JSON object. A prompt not in the cache is an
  honest miss: 404 ``{"error": ...}``, never an invented answer. 400 for a body that is not such JSON.
- ``GET /healthz`` answers 200 ``{"ok": true}`` (the load balancer's health check).
- ``--token-delay`` seconds before each word (a cache is fast). SIGTERM stops the server (exit 0).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path


def load_answers(path: Path) -> dict[str, str]:
    """The cached answers, prompt -> answer text."""
    answers = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(answers, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in answers.items()):
        raise SystemExit(f"{path}: expected a JSON object of prompt -> answer text")
    return answers


def head(status: int, headers: dict[str, str]) -> bytes:
    """A response's status line and headers."""
    lines = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def json_response(status: int, body: Mapping[str, object]) -> bytes:
    data = json.dumps(body).encode()
    return head(status, {"Content-Type": "application/json", "Content-Length": str(len(data))}) + data


def chunk(data: bytes) -> bytes:
    """One HTTP chunk: the client sees each word as it is sent."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def event(answer_id: str, delta: dict[str, str], finish: str | None = None) -> bytes:
    """One Server-Sent Event of a streamed chat completion, as a chunk."""
    body = {
        "id": answer_id,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": "cache",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return chunk(b"data: " + json.dumps(body).encode() + b"\n\n")


@dataclass(frozen=True)
class Cache:
    """The answers (prompt -> answer text), served to each client connection in a task of its own."""

    answers: dict[str, str]
    token_delay: float  # seconds before each word

    async def connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await self.exchange(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass  # a health check or client that hangs up early (or sends garbage) is not worth a traceback
        except asyncio.CancelledError:
            pass  # SIGTERM: the server stops, and its connections with it
        finally:
            writer.close()

    async def exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Read one request and answer it; whether the connection stays open for another."""
        words = (await reader.readline()).decode("latin-1").split()
        if not words:
            return False  # the client closed the connection
        headers: dict[str, str] = {}
        while (line := await reader.readline()).strip():
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        if len(words) != 3:
            writer.write(json_response(400, {"error": "bad request line"}))
            return False
        method, path, version = words
        body = await reader.readexactly(int(headers.get("content-length") or 0))
        if method == "GET" and path == "/healthz":
            writer.write(json_response(200, {"ok": True, "model": "cache", "answers": len(self.answers)}))
        elif method == "GET":
            writer.write(json_response(404, {"error": "not found"}))
        elif method == "POST":
            await self.complete(path, body, writer)
        else:
            writer.write(json_response(501, {"error": f"unsupported method {method}"}))
        await writer.drain()
        connection = headers.get("connection", "").lower()  # HTTP/1.1 keeps it open unless told
        return connection != "close" and (version == "HTTP/1.1" or connection == "keep-alive")

    async def complete(self, path: str, body: bytes, writer: asyncio.StreamWriter) -> None:
        """``POST /v1/chat/completions``: the cached answer, streamed or whole; 404 on a miss."""
        try:
            request = json.loads(body)
            prompt = "\n".join(m["content"] for m in request["messages"])
            max_tokens = int(request.get("max_tokens") or 1 << 30)
            stream = request.get("stream") is True
        except (ValueError, KeyError, TypeError) as exc:
            writer.write(json_response(400, {"error": f"bad request: {exc}"}))
            return
        if path != "/v1/chat/completions":
            writer.write(json_response(404, {"error": "not found"}))
            return
        cached = self.answers.get(prompt)
        if cached is None:
            writer.write(json_response(404, {"error": "no cached answer for this prompt"}))
            return
        words = cached.split()[:max_tokens]
        answer_id = f"chatcmpl-{uuid.uuid4().hex[:12]}"
        if not stream:
            message = {"role": "assistant", "content": " ".join(words)}
            choice = {"index": 0, "message": message, "finish_reason": "length"}
            whole = {"id": answer_id, "object": "chat.completion", "model": "cache", "choices": [choice]}
            writer.write(json_response(200, whole))
            return
        sse = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "Transfer-Encoding": "chunked"}
        writer.write(head(200, sse) + event(answer_id, {"role": "assistant"}))
        for word in words:
            await writer.drain()
            await asyncio.sleep(self.token_delay)
            writer.write(event(answer_id, {"content": word + " "}))
        writer.write(event(answer_id, {}, finish="length") + chunk(b"data: [DONE]\n\n") + chunk(b""))


async def serve(host: str, port: int, cache: Cache) -> None:
    """Until SIGTERM."""
    server = await asyncio.start_server(cache.connection, host, port, backlog=2048)
    stopped = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopped.set)
    print(f"serving {len(cache.answers)} cached answers on {host}:{port}", flush=True)
    await stopped.wait()
    server.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--answers", type=Path, required=True)
    parser.add_argument("--token-delay", type=float, default=0.003)
    args = parser.parse_args()
    asyncio.run(serve(args.host, args.port, Cache(load_answers(args.answers), args.token_delay)))


if __name__ == "__main__":
    main()
