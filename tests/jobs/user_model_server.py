"""A model server written the way users write one: a small torch model behind Python's own HTTP server.

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
import json
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType

import torch
from torch import nn

SIZES = {"large": 256, "small": 32}


def build(model: str, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    hidden = SIZES[model]
    return nn.Sequential(nn.Linear(16, hidden), nn.ReLU(), nn.Linear(hidden, 4)).eval()


def features(prompt: str) -> torch.Tensor:
    """16 numbers from the prompt's hash: the same prompt always asks the same question."""
    digest = hashlib.sha256(prompt.encode()).digest()
    return torch.tensor([b / 255.0 for b in digest[:16]]).unsqueeze(0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--model", choices=sorted(SIZES), default="large")
    parser.add_argument("--delay", type=float, default=0.005)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = build(args.model, args.seed)
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

        def do_GET(self) -> None:  # noqa: N802 - the base class's name
            if self.path == "/healthz":
                self._answer(200, {"ok": True, "model": args.model})
            else:
                self._answer(404, {"error": "not found"})

        def do_POST(self) -> None:  # noqa: N802 - the base class's name
            length = int(self.headers.get("Content-Length") or 0)
            try:
                prompt = json.loads(self.rfile.read(length))["prompt"]
                if not isinstance(prompt, str):
                    raise TypeError("prompt must be a string")
            except (ValueError, KeyError, TypeError) as exc:
                self._answer(400, {"error": f"bad request: {exc}"})
                return
            if self.path != "/v1/predict":
                self._answer(404, {"error": "not found"})
                return
            time.sleep(args.delay)
            with lock, torch.no_grad():
                label = int(model(features(prompt)).argmax())
            self._answer(200, {"label": label, "model": args.model, "degraded": args.model == "small"})

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        # socketserver's default listen backlog is 5: at 100 requests/s (one connection each, HTTP/1.0) on a
        # loaded machine the accept thread fell behind, a connect failed and HAProxy marked the live server
        # down (observe layer4). Servers users deploy (uvicorn, gunicorn) listen with a backlog of 2048.
        request_queue_size = 2048

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
