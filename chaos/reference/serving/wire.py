"""What the model servers and the gateway agree on, with no torch: the request shape, the probe input, the
golden-answer files and a small JSON-over-HTTP/1.1 server base both processes use.

Contracts:

- A predict request is a JSON object with ``"input"`` (``INPUT_DIM`` numbers) or ``"prompt"`` (text, turned
  into ``INPUT_DIM`` numbers by :func:`prompt_features`, a pure function of the text); other keys are ignored.
- A predict answer is ``{"output": [OUTPUT_DIM numbers], "label": argmax, "backend": NAME}``. Non-finite
  outputs (a corrupted model can produce them) are sent as ``null`` so every answer is strict JSON.
- ``<run_dir>/golden-<model>.json`` holds ``{"input": PROBE_INPUT, "output": [...]}``: the clean model's
  answer to the probe input, written once by the first server of that model (never overwritten).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from typing import Any

INPUT_DIM = 32
OUTPUT_DIM = 8
PREDICT_PATH = "/v1/predict"
HEALTH_PATH = "/healthz"

# The correctness probe's fixed input: deterministic, spread over [-1, 1], not a prompt any load would send.
PROBE_INPUT: tuple[float, ...] = tuple(round(math.sin(1.7 * i + 0.3), 6) for i in range(INPUT_DIM))

# The cache rung's answer when no earlier answer to the same request is remembered.
DEFAULT_OUTPUT: tuple[float, ...] = (0.0,) * OUTPUT_DIM

MAX_BODY = 1 << 20  # requests are tiny; a larger body is refused rather than read into memory


class RequestError(ValueError):
    """A predict request that is not one (bad JSON, wrong shape): answered 400 with this message."""


def prompt_features(text: str) -> list[float]:
    """``INPUT_DIM`` numbers in [-1, 1] from a text: the bytes of its sha256, scaled (pure and stable)."""
    digest = hashlib.sha256(text.encode()).digest()
    return [b / 127.5 - 1.0 for b in digest[:INPUT_DIM]]


def parse_predict(body: bytes) -> list[float]:
    """The model input of a predict request body; raises :class:`RequestError` when it has none."""
    try:
        request = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(f"body is not JSON: {exc}") from exc
    if not isinstance(request, dict):
        raise RequestError("body must be a JSON object with 'input' or 'prompt'")
    if "input" in request:
        values = request["input"]
        if (
            not isinstance(values, list)
            or len(values) != INPUT_DIM
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
        ):
            raise RequestError(f"'input' must be a list of {INPUT_DIM} numbers")
        return [float(v) for v in values]
    prompt = request.get("prompt")
    if isinstance(prompt, str):
        return prompt_features(prompt)
    raise RequestError("body needs 'input' (a list of numbers) or 'prompt' (a string)")


def request_key(body: bytes) -> str | None:
    """What identifies a request for the gateway's answer cache: its canonical input or prompt (None when
    the body names neither; such a request is never cached)."""
    try:
        request = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(request, dict):
        return None
    for key in ("input", "prompt"):
        if key in request:
            return key + ":" + json.dumps(request[key], sort_keys=True, separators=(",", ":"))
    return None


def finite_or_none(values: list[float]) -> list[float | None]:
    """Outputs as strict-JSON values: NaN and infinities become null."""
    return [v if math.isfinite(v) else None for v in values]


def max_abs_error(output: object, expected: list[float]) -> float | None:
    """Largest absolute difference between an answer's ``output`` and the expected one; None when the answer
    is not comparable (wrong length, a null/non-finite or non-numeric value): that is a wrong answer too."""
    if not isinstance(output, list) or len(output) != len(expected):
        return None
    worst = 0.0
    for got, want in zip(output, expected, strict=True):
        if not isinstance(got, (int, float)) or isinstance(got, bool) or not math.isfinite(got):
            return None
        worst = max(worst, abs(float(got) - want))
    return worst


# -- golden answers --------------------------------------------------------------------------------------


def golden_path(run_dir: Path, model: str) -> Path:
    return run_dir / f"golden-{model}.json"


def write_golden_once(run_dir: Path, model: str, output: list[float]) -> bool:
    """Write the golden answer of ``model`` unless one exists; True when this call wrote it.

    Written to a private temp file, then hard-linked into place: the link fails if the file exists, so a
    restarted (possibly corrupted) server can never replace the answer the first clean one wrote, and a
    reader never sees a half-written file.
    """
    final = golden_path(run_dir, model)
    if final.exists():
        return False
    tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"input": list(PROBE_INPUT), "output": output}), encoding="utf-8")
    try:
        os.link(tmp, final)
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)


def read_golden(run_dir: Path, model: str) -> list[float] | None:
    """The golden output of ``model``, or None while its file does not exist yet."""
    try:
        data = json.loads(golden_path(run_dir, model).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    return [float(v) for v in data["output"]]


# -- the HTTP server base --------------------------------------------------------------------------------


class JsonHandler(BaseHTTPRequestHandler):
    """HTTP/1.1 keep-alive handler with JSON helpers; per-request access logging is off (it would cost more
    than the request at a few hundred requests per second, and the harness reads events, not access logs)."""

    protocol_version = "HTTP/1.1"
    # Headers and body leave in separate writes; without TCP_NODELAY the second waits for a delayed ACK.
    disable_nagle_algorithm = True

    def read_body(self) -> bytes | None:
        """The request body (by Content-Length); None after answering 411/413 itself."""
        length_text = self.headers.get("Content-Length")
        if length_text is None or not length_text.isdigit():
            self.send_json(411, {"error": "Content-Length required"})
            return None
        length = int(length_text)
        if length > MAX_BODY:
            self.send_json(413, {"error": f"body over {MAX_BODY} bytes"})
            self.close_connection = True  # the unread body would be parsed as the next request
            return None
        return self.rfile.read(length)

    def send_json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        self.send_raw(status, json.dumps(payload, separators=(",", ":"), allow_nan=False).encode(), headers)

    def send_raw(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's signature
        pass


class Server(ThreadingHTTPServer):
    """A thread per connection on 127.0.0.1; a deep accept backlog so a burst of new keep-alive connections
    from a load generator is queued, not refused."""

    request_queue_size = 512
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client (or gateway) hanging up mid-request is routine under faults and load; anything else is a
        # bug worth its traceback in the log.
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


def make_server(port: int, handler: type[BaseHTTPRequestHandler]) -> Server:
    return Server(("127.0.0.1", port), handler)


def serve_until_signalled(
    port: int, handler: type[BaseHTTPRequestHandler], name: str, on_serving: Callable[[int], None]
) -> None:
    """Serve ``handler`` on 127.0.0.1:``port`` (0: a free one) on a thread until SIGTERM or SIGINT, then shut the
    server down and close it. Once the server accepts requests, ``on_serving(port)`` runs with the port it got
    and ``<name> listening on <url>`` is printed. The calling (main) thread only waits: signal handlers run
    there, and ``shutdown()`` must not be called from the thread that runs ``serve_forever`` (it would wait for
    itself)."""
    server = make_server(port, handler)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()
    bound = server.server_address[1]
    on_serving(bound)
    print(f"{name} listening on http://127.0.0.1:{bound}", flush=True)
    while not stop.wait(1.0):
        pass
    server.shutdown()
    server.server_close()
