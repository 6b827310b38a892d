"""A streaming model server written the way users write a small OpenAI-compatible one: a tiny torch language
model that produces one token per forward pass, behind Python's own HTTP server, answering in Server-Sent
Events.

It imports nothing from mlchaos. Run two behind a load balancer (``scenarios/serving-stream-haproxy-killed.yaml``)::

    python3 tests/jobs/user_stream_server.py --port 18181 --model big
    python3 tests/jobs/user_stream_server.py --port 18182 --model small

- ``POST /v1/chat/completions`` with ``{"messages": [{"role": "user", "content": "..."}], "stream": true,
  "max_tokens": N}`` answers 200 ``text/event-stream`` (HTTP/1.1 chunked): the headers at once, a role chunk,
  then one ``data: {...}`` event per token (``object: chat.completion.chunk``, ``model``,
  ``choices[0].delta.content``), a ``finish_reason: "length"`` chunk and ``data: [DONE]``. Without
  ``stream: true`` it answers the whole completion as one JSON object. 400 for a body that is not such JSON.
  The server does not know its name in the fleet: the load balancer says who answered (a response header).
- ``GET /healthz`` answers 200 ``{"ok": true}`` once the model is loaded (the load balancer's health check).
- ``--prefill`` seconds before the first token and ``--token-delay`` seconds before each token (the accelerator
  time a real model would take, without using the CPU); ``--max-tokens`` caps an answer (and is the default).
- A client that hangs up stops its generation. SIGTERM stops the server (exit 0).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import signal
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType

import torch
from torch import nn

WORDS = (
    "the a model token stream answer request fast slow first last open safe load time step batch queue node "
    "big small warm cold read write send wait done more less some every each never always maybe yes no ok"
).split()
SIZES = {"big": 256, "small": 32}


class TinyLM(nn.Module):
    """A GRU language model: the prompt's hash sets the first state, each token is one cell step and a head."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.encode = nn.Linear(16, hidden)
        self.embed = nn.Embedding(len(WORDS), 16)
        self.cell = nn.GRUCell(16, hidden)
        self.head = nn.Linear(hidden, len(WORDS))

    def start(self, prompt: str) -> torch.Tensor:
        digest = hashlib.sha256(prompt.encode()).digest()
        features = torch.tensor([b / 255.0 for b in digest[:16]]).unsqueeze(0)
        return torch.tanh(self.encode(features))

    def step(self, state: torch.Tensor, token: int) -> tuple[torch.Tensor, int]:
        state = self.cell(self.embed(torch.tensor([token])), state)
        return state, int(self.head(state).argmax())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--model", choices=sorted(SIZES), default="big")
    parser.add_argument("--prefill", type=float, default=0.02)
    parser.add_argument("--token-delay", type=float, default=0.04)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    model = TinyLM(SIZES[args.model]).eval()
    lock = threading.Lock()  # one forward at a time, as on one accelerator

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
            """One HTTP chunk, flushed: the client sees each token as it is made."""
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        def _event(self, answer_id: str, delta: dict[str, str], finish: str | None = None) -> None:
            chunk = {
                "id": answer_id,
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": args.model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
            self._send(b"data: " + json.dumps(chunk).encode() + b"\n\n")

        def do_GET(self) -> None:  # noqa: N802 - the base class's name
            if self.path == "/healthz":
                self._answer(200, {"ok": True, "model": args.model})
            else:
                self._answer(404, {"error": "not found"})

        def do_POST(self) -> None:  # noqa: N802 - the base class's name
            length = int(self.headers.get("Content-Length") or 0)
            try:
                request = json.loads(self.rfile.read(length))
                prompt = "\n".join(m["content"] for m in request["messages"])
                max_tokens = min(int(request.get("max_tokens") or args.max_tokens), args.max_tokens)
                stream = request.get("stream") is True
            except (ValueError, KeyError, TypeError) as exc:
                self._answer(400, {"error": f"bad request: {exc}"})
                return
            if self.path != "/v1/chat/completions":
                self._answer(404, {"error": "not found"})
                return
            answer_id = f"chatcmpl-{uuid.uuid4().hex[:12]}"
            if not stream:
                time.sleep(args.prefill + args.token_delay * max_tokens)
                words = []
                with lock, torch.no_grad():
                    state, token = model.start(prompt), 0
                    for _ in range(max_tokens):
                        state, token = model.step(state, token)
                        words.append(WORDS[token])
                message = {"role": "assistant", "content": " ".join(words)}
                choice = {"index": 0, "message": message, "finish_reason": "length"}
                self._answer(
                    200, {"id": answer_id, "object": "chat.completion", "model": args.model, "choices": [choice]}
                )
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                self._event(answer_id, {"role": "assistant"})
                time.sleep(args.prefill)
                with lock, torch.no_grad():
                    state = model.start(prompt)
                token = 0
                for _ in range(max_tokens):
                    time.sleep(args.token_delay)
                    with lock, torch.no_grad():
                        state, token = model.step(state, token)
                    self._event(answer_id, {"content": WORDS[token] + " "})
                self._event(answer_id, {}, finish="length")
                self._send(b"data: [DONE]\n\n")
                self._send(b"")  # the last chunk
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True  # the client went away: stop generating for it

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 2048  # what uvicorn and gunicorn listen with; socketserver's default is 5

        def handle_error(self, request: object, client_address: object) -> None:
            pass  # a health check or client that hangs up early is not an error worth a traceback

    server = Server((args.host, args.port), Handler)

    def stop(signum: int, frame: FrameType | None) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    print(f"serving {args.model} on {args.host}:{args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
