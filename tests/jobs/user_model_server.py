"""A model server written the way users write one: a small torch model behind Python's ``socketserver``, with
the little HTTP/1.1 it needs written out by hand (keep-alive connections, JSON bodies with a Content-Length).

It imports nothing from mlchaos. Run two behind a load balancer (``scenarios/serving-haproxy-failover.yaml``)::

    python3 tests/jobs/user_model_server.py --port 18181 --model large
    python3 tests/jobs/user_model_server.py --port 18182 --model small

- ``POST /v1/predict`` with ``{"prompt": "..."}`` answers 200 ``{"label": int, "model": NAME, "degraded": bool}``
  (``degraded`` is true for the small model: clients can tell a fallback answer); 400 for a body that is not
  such JSON.
- ``GET /healthz`` answers 200 ``{"ok": true}`` once the model is loaded (the load balancer's health check).
- ``--delay`` seconds per request (the accelerator time a real model would take, without using the CPU).
- SIGTERM stops it (exit 0).
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import signal
import socketserver
import threading
import time
from http import HTTPStatus
from types import FrameType

import torch
from torch import nn

SIZES = {"large": 256, "small": 32}
Answer = tuple[int, dict[str, object]]  # an HTTP status and its JSON body
NOT_FOUND: Answer = (404, {"error": "not found"})


def build(model: str, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    hidden = SIZES[model]
    return nn.Sequential(nn.Linear(16, hidden), nn.ReLU(), nn.Linear(hidden, 4)).eval()


def features(prompt: str) -> torch.Tensor:
    """16 numbers from the prompt's hash: the same prompt always asks the same question."""
    digest = hashlib.sha256(prompt.encode()).digest()
    return torch.tensor([b / 255.0 for b in digest[:16]]).unsqueeze(0)


def main() -> None:
    parser = argparse.ArgumentParser(description="A small torch classifier behind a JSON HTTP API.")
    parser.add_argument("--port", type=int, required=True, help="port to listen on")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default %(default)s)")
    parser.add_argument("--model", choices=sorted(SIZES), default="large", help="model size (default %(default)s)")
    parser.add_argument("--delay", type=float, default=0.005, help="seconds of accelerator time a request")
    parser.add_argument("--seed", type=int, default=0, help="seed of the model's weights")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = build(args.model, args.seed)
    lock = threading.Lock()  # one forward at a time, as on one accelerator

    def predict(path: str, body: bytes) -> Answer:
        try:
            prompt = json.loads(body)["prompt"]
            if not isinstance(prompt, str):
                raise TypeError("prompt must be a string")
        except (ValueError, KeyError, TypeError) as exc:
            return 400, {"error": f"bad request: {exc}"}
        if path != "/v1/predict":
            return NOT_FOUND
        time.sleep(args.delay)
        with lock, torch.no_grad():
            label = int(model(features(prompt)).argmax())
        return 200, {"label": label, "model": args.model, "degraded": args.model == "small"}

    def route(method: str, path: str, body: bytes) -> Answer:
        if method == "POST":
            return predict(path, body)
        if method == "GET":
            return (200, {"ok": True, "model": args.model}) if path == "/healthz" else NOT_FOUND
        return 501, {"error": f"unsupported method {method}"}

    class Connection(socketserver.StreamRequestHandler):
        """One client connection: its requests answered in turn, while the client keeps it open."""

        def handle(self) -> None:
            try:
                while self.exchange():
                    pass
            except ConnectionError:
                pass  # a health check or client that hangs up early is not an error worth a traceback

        def exchange(self) -> bool:
            """Read one request and answer it; whether the connection stays open for another."""
            words = self.rfile.readline(65537).decode("latin-1").split()
            if not words:
                return False  # the client closed the connection
            if len(words) != 3:
                self.reply(400, {"error": "bad request line"})
                return False
            method, path, version = words
            headers = http.client.parse_headers(self.rfile)
            body = self.rfile.read(int(headers.get("Content-Length") or 0))
            self.reply(*route(method, path, body))
            connection = (headers.get("Connection") or "").lower()  # HTTP/1.1 keeps it open unless told
            return connection != "close" and (version == "HTTP/1.1" or connection == "keep-alive")

        def reply(self, status: int, answer: dict[str, object]) -> None:
            data = json.dumps(answer).encode()
            head = f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
            head += f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
            self.wfile.write(head.encode() + data)

    class Server(socketserver.ThreadingTCPServer):
        daemon_threads = True
        allow_reuse_address = True  # a restarted server binds its port again at once
        # socketserver's default listen backlog is 5: at 100 requests/s (one connection each, HTTP/1.0) on a
        # loaded machine the accept thread fell behind, a connect failed and HAProxy marked the live server
        # down (observe layer4). Servers users deploy (uvicorn, gunicorn) listen with a backlog of 2048.
        request_queue_size = 2048

    def stop(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(0)  # out of serve_forever; the with block closes the listening socket

    signal.signal(signal.SIGTERM, stop)
    with Server((args.host, args.port), Connection) as server:
        print(f"serving {args.model} on {args.host}:{args.port}", flush=True)
        server.serve_forever()


if __name__ == "__main__":
    main()
