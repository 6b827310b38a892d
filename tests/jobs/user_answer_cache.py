"""A cached-answers server written the way users write the last rung of a fallback ladder: no model, only the
answers recorded earlier from the big model, replayed in the same OpenAI-style Server-Sent Events a model server
streams. Python's standard library only.

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
import json
import signal
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType


def load_answers(path: Path) -> dict[str, str]:
    """The cached answers, prompt -> answer text."""
    answers = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(answers, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in answers.items()):
        raise SystemExit(f"{path}: expected a JSON object of prompt -> answer text")
    return answers


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--answers", type=Path, required=True)
    parser.add_argument("--token-delay", type=float, default=0.003)
    args = parser.parse_args()
    answers = load_answers(args.answers)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *values: object) -> None:  # noqa: A002 - the base class's name
            pass  # one line per request would flood the log

        def _answer(self, status: int, body: dict[str, object]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _send(self, data: bytes) -> None:
            """One HTTP chunk, flushed: the client sees each word as it is sent."""
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        def _event(self, answer_id: str, delta: dict[str, str], finish: str | None = None) -> None:
            chunk = {
                "id": answer_id,
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": "cache",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
            self._send(b"data: " + json.dumps(chunk).encode() + b"\n\n")

        def do_GET(self) -> None:  # noqa: N802 - the base class's name
            if self.path == "/healthz":
                self._answer(200, {"ok": True, "model": "cache", "answers": len(answers)})
            else:
                self._answer(404, {"error": "not found"})

        def do_POST(self) -> None:  # noqa: N802 - the base class's name
            length = int(self.headers.get("Content-Length") or 0)
            try:
                request = json.loads(self.rfile.read(length))
                prompt = "\n".join(m["content"] for m in request["messages"])
                max_tokens = int(request.get("max_tokens") or 1 << 30)
                stream = request.get("stream") is True
            except (ValueError, KeyError, TypeError) as exc:
                self._answer(400, {"error": f"bad request: {exc}"})
                return
            if self.path != "/v1/chat/completions":
                self._answer(404, {"error": "not found"})
                return
            cached = answers.get(prompt)
            if cached is None:
                self._answer(404, {"error": "no cached answer for this prompt"})
                return
            words = cached.split()[:max_tokens]
            answer_id = f"chatcmpl-{uuid.uuid4().hex[:12]}"
            if not stream:
                message = {"role": "assistant", "content": " ".join(words)}
                choice = {"index": 0, "message": message, "finish_reason": "length"}
                self._answer(200, {"id": answer_id, "object": "chat.completion", "model": "cache", "choices": [choice]})
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                self._event(answer_id, {"role": "assistant"})
                for word in words:
                    time.sleep(args.token_delay)
                    self._event(answer_id, {"content": word + " "})
                self._event(answer_id, {}, finish="length")
                self._send(b"data: [DONE]\n\n")
                self._send(b"")  # the last chunk
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True  # the client went away

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 2048  # what uvicorn and gunicorn listen with; socketserver's default is 5

        def handle_error(self, request: object, client_address: object) -> None:
            pass  # a health check or client that hangs up early is not an error worth a traceback

    server = Server((args.host, args.port), Handler)

    def stop(signum: int, frame: FrameType | None) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    print(f"serving {len(answers)} cached answers on {args.host}:{args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
