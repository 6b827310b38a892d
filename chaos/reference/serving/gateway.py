"""The gateway of the reference serving stack: health and correctness probes, a fallback ladder, circuit
breakers, failback hysteresis and priority load shedding in front of the model servers.

``python -m chaos.reference.serving.gateway --config JSON`` (or ``--config-file PATH``), a
:class:`~chaos.spec.serving.GatewayConfig`.

Contracts:

- ``POST /v1/predict``: admission first (shedding, below), then the ladder: the primary if it is up and its
  breaker allows, then the fallback replica likewise, then (``cache_fallback``) the cache rung, else 502
  ``{"error": ...}``. An attempt that is refused, times out (``request_timeout``), answers 5xx or answers
  something that is not JSON moves to the next rung and counts as a breaker failure; a 4xx is the client's
  fault and is passed through as is. A 200 is the replica's answer with ``"backend"`` (who served it) and
  ``"degraded": false``; header ``X-Backend``. The cache rung answers 200 with the last good answer to the
  same input or prompt (an LRU of 1024), else :data:`~chaos.reference.serving.wire.DEFAULT_OUTPUT`, with
  ``"backend": "cache", "degraded": true, "cached": bool``.
- Shedding (if enabled): with ``capacity`` requests in flight at the gateway every request gets 503; with
  ``capacity * (1 - reserve)`` only the first of ``shedding.priorities`` is admitted. The priority comes from
  the ``shedding.header`` request header; a missing or unknown one counts as the lowest. A shed answer is
  503 ``{"error": "shed", "priority": P}`` with headers ``X-Shed: 1`` and ``X-Backend: gateway``.
- ``POST /v1/chat/completions`` (replicas of ``model: lm``): admitted like a predict; ``stream: true`` is
  relayed token by token down the ladder by :func:`~chaos.reference.serving.stream_proxy.relay`, which
  gives up a replica without a first token after ``first_token_timeout``, resumes a stream cut mid-way on
  the next rung when ``resume_streams`` is on and otherwise cuts the client's stream too, and (with
  ``cache_fallback``) answers from the cached rung when no replica can: the last complete answer to the
  same prompt (an LRU of 1024, :mod:`~chaos.reference.serving.answer_cache`), else a fixed degraded text,
  each event ``"backend": "cache", "degraded": true``; ``stream: false`` walks the ladder like a predict
  (no cache rung).
- ``GET /healthz``: 200 with the gateway's view: ready, route, requests in flight, and per replica up,
  reason (why down) and breaker state.
- Health: see :mod:`~chaos.reference.serving.health`; breakers: see :mod:`~chaos.reference.serving.breaker`.
  The correctness probe POSTs ``PROBE_INPUT`` every ``correctness.interval`` to each replica that is up or
  down for correctness and compares with ``<run_dir>/golden-<model>.json`` (skipped until that exists).

Events (rank null), never one per request:
``serving.ready`` {url, replicas} once, when listening, every replica has come up and the primary is up;
``detect.backend_down`` {backend, reason: "health" | "correctness", failures};
``serving.backend_up`` {backend, successes, after: "startup" | "health" | "correctness"};
``serving.breaker`` {backend, state: "open" | "half_open" | "closed"};
``serving.route`` {backend, previous}: the first rung a new request would try changed (a replica name,
"cache" or "none"); tracked from ``serving.ready`` on, when the route is the primary;
``detect.wrong_answer`` {backend, max_abs_err (null when an output is missing or not finite), tolerance},
once per episode (until the replica is back up);
``serving.stats`` {in_flight, requests, shed, served_by: {name: count}, route} once per second with traffic.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from chaos import events
from chaos.event_kinds import DETECT_BACKEND_DOWN as BACKEND_DOWN
from chaos.event_kinds import DETECT_WRONG_ANSWER as WRONG_ANSWER
from chaos.event_kinds import SERVING_BACKEND_UP as BACKEND_UP
from chaos.event_kinds import SERVING_BREAKER as BREAKER
from chaos.event_kinds import SERVING_READY as READY
from chaos.event_kinds import SERVING_ROUTE as ROUTE
from chaos.event_kinds import SERVING_STATS as STATS
from chaos.reference.serving.answer_cache import AnswerCache
from chaos.reference.serving.breaker import CircuitBreaker, State
from chaos.reference.serving.chat import CHAT_PATH, ClientGone, StreamWriter, stream_format
from chaos.reference.serving.health import Reason, ReplicaHealth
from chaos.reference.serving.pool import Pool, fetch_once
from chaos.reference.serving.stream_proxy import relay
from chaos.reference.serving.wire import (
    DEFAULT_OUTPUT,
    HEALTH_PATH,
    PREDICT_PATH,
    PROBE_INPUT,
    JsonHandler,
    max_abs_error,
    read_golden,
    request_key,
    serve_until_signalled,
)
from chaos.spec.serving import CACHE, FALLBACK, PRIMARY, GatewayConfig, ReplicaEndpoint

GATEWAY = "gateway"  # the X-Backend of answers the gateway gives itself (shed, 502)
NO_ROUTE = "none"
_CACHE_SIZE = 1024
_STARTUP_PROBE = 0.1  # probe cadence until a replica first comes up: readiness should not wait an interval

Emit = Callable[..., None]


class Backend:
    """One rung of the ladder backed by a replica: its connections, health and breaker."""

    def __init__(self, name: str, endpoint: ReplicaEndpoint, gateway: Gateway) -> None:
        spec = gateway.spec
        self.name = name
        self.endpoint = endpoint
        self.pool = Pool(endpoint.host, endpoint.port)
        self.health = ReplicaHealth(
            spec.probes,
            failback_hold=spec.failback_hold,
            on_down=lambda reason, failures: gateway.backend_down(self, reason, failures),
            on_up=lambda successes: gateway.backend_up(self, successes),
        )
        self.breaker = CircuitBreaker(spec.breaker, on_change=lambda state: gateway.breaker_changed(self, state))
        self.came_up_from: Reason = "startup"
        self.ever_up = False

    def usable(self) -> bool:
        """Would a new request try this rung? (The breaker's half-open trials count as trying.)"""
        return self.health.up and (not self.breaker.settings.enabled or self.breaker.peek() != "open")


class Gateway:
    """The gateway's state and logic, apart from HTTP serving (so it can run inside any server)."""

    def __init__(self, config: GatewayConfig, *, emit: Emit = events.emit) -> None:
        self.config = config
        self.spec = config.target
        self.emit = emit
        self.url = ""
        ladder = [PRIMARY] + ([FALLBACK] if self.spec.fallback is not None and FALLBACK in config.replicas else [])
        self.backends = [Backend(name, config.replicas[name], self) for name in ladder]
        self._lock = threading.Lock()
        self._in_flight = 0
        self._served: dict[str, int] = {}
        self._requests = 0
        self._shed = 0
        self._cache: OrderedDict[str, tuple[list[Any], Any]] = OrderedDict()
        self.answers = AnswerCache(_CACHE_SIZE) if self.spec.cache_fallback else None  # streamed answers
        self._route: str | None = None  # None until ready
        self._route_lock = threading.Lock()
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        shedding = self.spec.shedding
        self._top_priority = shedding.priorities[0]
        self._reserve_at = shedding.capacity * (1.0 - shedding.reserve)

    # -- lifecycle
    def start(self, url: str) -> None:
        """Start the probes (call once the HTTP server is listening at ``url``)."""
        self.url = url
        loops: list[tuple[str, Callable[[], None]]] = [("stats", self._stats_loop)]
        for b in self.backends:
            loops.append((f"health:{b.name}", functools.partial(self._health_loop, b)))
            if self.spec.correctness.enabled:
                loops.append((f"correctness:{b.name}", functools.partial(self._correctness_loop, b)))
        for name, loop in loops:
            thread = threading.Thread(target=loop, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        # Probe threads are daemons: a probe stuck on a frozen replica must not hold up the exit past a
        # moment, or SIGTERM would turn into SIGKILL.
        deadline = time.monotonic() + 1.0
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        for b in self.backends:
            b.pool.clear()

    # -- state transitions (called from probe threads and request threads)
    def backend_down(self, b: Backend, reason: Reason, failures: int) -> None:
        self.emit(BACKEND_DOWN, rank=None, backend=b.name, reason=reason, failures=failures)
        b.came_up_from = reason
        b.pool.clear()
        self._update_route()

    def backend_up(self, b: Backend, successes: int) -> None:
        self.emit(BACKEND_UP, rank=None, backend=b.name, successes=successes, after=b.came_up_from)
        b.ever_up = True
        with self._route_lock:
            # Ready once every replica has come up (the primary up now): a fault that lands right after
            # readiness must find the whole ladder in place, or the run measures startup, not failover.
            ready_now = (
                not self._ready.is_set() and self.backends[0].health.up and all(x.ever_up for x in self.backends)
            )
            if ready_now:
                self._route = PRIMARY
                self._ready.set()
        if ready_now:
            self.emit(READY, rank=None, url=self.url, replicas=[x.name for x in self.backends])
        self._update_route()

    def breaker_changed(self, b: Backend, state: State) -> None:
        self.emit(BREAKER, rank=None, backend=b.name, state=state)
        self._update_route()

    def _update_route(self) -> None:
        if not self._ready.is_set():
            return
        first = next((b.name for b in self.backends if b.usable()), CACHE if self.spec.cache_fallback else NO_ROUTE)
        with self._route_lock:
            previous = self._route
            if first == previous:
                return
            self._route = first
        self.emit(ROUTE, rank=None, backend=first, previous=previous)

    # -- requests
    def admit(self, priority: str) -> bool:
        """Count the request in flight, or refuse it (shed); an admitted request must call :meth:`done`."""
        shedding = self.spec.shedding
        with self._lock:
            self._requests += 1
            if shedding.enabled and (
                self._in_flight >= shedding.capacity
                or (self._in_flight >= self._reserve_at and priority != self._top_priority)
            ):
                self._shed += 1
                return False
            self._in_flight += 1
            return True

    def done(self, served_by: str) -> None:
        with self._lock:
            self._in_flight -= 1
            self._served[served_by] = self._served.get(served_by, 0) + 1

    def priority_of(self, header_value: str | None) -> str:
        names = self.spec.shedding.priorities
        return header_value if header_value in names else names[-1]

    def predict(self, body: bytes, path: str = PREDICT_PATH) -> tuple[int, dict[str, Any] | bytes, str]:
        """Walk the ladder for one admitted request: (status, answer, backend that gave it); the cache rung
        answers predictions only."""
        self._update_route()
        timeout = self.spec.request_timeout
        for b in self.backends:
            if not b.health.up or not b.breaker.allow():
                continue
            try:
                status, data = b.pool.request("POST", path, body, timeout)
                answer = json.loads(data) if status == 200 else None
                if status == 200 and not isinstance(answer, dict):
                    raise ValueError("answer is not a JSON object")
            except Exception:  # noqa: BLE001 - refused, reset, timed out, not JSON: the next rung
                b.breaker.failure()
                continue
            if status >= 500:
                b.breaker.failure()
                continue
            b.breaker.success()  # it answered: a 4xx is the request's fault, not the replica's
            if answer is None:
                return status, data, b.name
            answer["backend"] = b.name
            answer["degraded"] = False
            if path == PREDICT_PATH:
                self._remember(body, answer)
            return 200, answer, b.name
        if self.spec.cache_fallback and path == PREDICT_PATH:
            return 200, self._cached(body), CACHE
        return 502, {"error": "no backend could answer", "backends": [b.name for b in self.backends]}, GATEWAY

    def stream(self, out: StreamWriter, request: dict[str, Any]) -> str:
        """Relay one admitted streamed chat request down the ladder (the cached rung last); returns the backend
        that gave the client its first token."""
        self._update_route()
        spec = self.spec
        return relay(
            self.backends,
            out,
            request,
            spec.request_timeout,
            spec.resume_streams,
            first_token_timeout=spec.first_token_timeout,
            cache=self.answers,
        )

    def _remember(self, body: bytes, answer: dict[str, Any]) -> None:
        key = request_key(body)
        if key is None or "output" not in answer:
            return
        with self._lock:
            self._cache[key] = (answer["output"], answer.get("label"))
            self._cache.move_to_end(key)
            if len(self._cache) > _CACHE_SIZE:
                self._cache.popitem(last=False)

    def _cached(self, body: bytes) -> dict[str, Any]:
        key = request_key(body)
        with self._lock:
            hit = self._cache.get(key) if key is not None else None
        output, label = hit if hit is not None else (list(DEFAULT_OUTPUT), 0)
        return {"output": output, "label": label, "backend": CACHE, "degraded": True, "cached": hit is not None}

    def view(self) -> dict[str, Any]:
        """The gateway's own /healthz answer."""
        return {
            "ok": True,
            "ready": self._ready.is_set(),
            "route": self._route,
            "in_flight": self._in_flight,
            "backends": {
                b.name: {
                    "up": b.health.up,
                    "reason": None if b.health.up else b.health.reason,
                    "breaker": b.breaker.peek(),
                }
                for b in self.backends
            },
        }

    # -- probes
    def _health_loop(self, b: Backend) -> None:
        probes = self.spec.probes
        ever_up = False
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                status, _ = fetch_once(b.endpoint.host, b.endpoint.port, "GET", HEALTH_PATH, None, probes.timeout)
                ok = status == 200
            except Exception:  # noqa: BLE001 - refused, reset, timed out: all mean "not alive"
                ok = False
            if ok:
                b.health.health_ok()
            else:
                b.health.health_failed()
            ever_up = ever_up or b.health.up
            interval = probes.interval if ever_up else min(probes.interval, _STARTUP_PROBE)
            self._stop.wait(max(0.0, interval - (time.monotonic() - started)))

    def _correctness_loop(self, b: Backend) -> None:
        settings = self.spec.correctness
        timeout = max(self.spec.request_timeout, self.spec.probes.timeout)
        body = json.dumps({"input": list(PROBE_INPUT)}).encode()
        golden: list[float] | None = None
        while not self._stop.wait(settings.interval):
            if not b.health.wants_correctness_probe():
                continue
            if golden is None:
                golden = read_golden(self.config.run_dir, b.endpoint.model)
                if golden is None:
                    continue  # the server writes it before it listens; not there yet
            try:
                status, data = fetch_once(b.endpoint.host, b.endpoint.port, "POST", PREDICT_PATH, body, timeout)
                answer = json.loads(data) if status == 200 else None
            except Exception:  # noqa: BLE001 - no answer is not a wrong answer
                answer = None
            if not isinstance(answer, dict):
                b.health.answer_missing()
                continue
            err = max_abs_error(answer.get("output"), golden)
            if err is not None and err <= settings.tolerance:
                b.health.answer_correct()
                continue
            if not (not b.health.up and b.health.reason == "correctness"):
                # A new episode: report the detection before the down it causes.
                self.emit(WRONG_ANSWER, rank=None, backend=b.name, max_abs_err=err, tolerance=settings.tolerance)
            b.health.answer_wrong()

    def _stats_loop(self) -> None:
        while not self._stop.wait(1.0):
            with self._lock:
                requests, shed, served = self._requests, self._shed, self._served
                in_flight = self._in_flight
                self._requests, self._shed, self._served = 0, 0, {}
            if requests:
                self.emit(
                    STATS,
                    rank=None,
                    in_flight=in_flight,
                    requests=requests,
                    shed=shed,
                    served_by=served,
                    route=self._route,
                )


def _handler(gateway: Gateway) -> type[JsonHandler]:
    header = gateway.spec.shedding.header

    class Handler(JsonHandler):
        def do_GET(self) -> None:
            if self.path == HEALTH_PATH:
                self.send_json(200, gateway.view(), {"X-Backend": GATEWAY})
            else:
                self.send_json(404, {"error": f"no such path: {self.path}"}, {"X-Backend": GATEWAY})

        def do_POST(self) -> None:
            body = self.read_body()
            if body is None:
                return
            if self.path not in (PREDICT_PATH, CHAT_PATH):
                self.send_json(404, {"error": f"no such path: {self.path}"}, {"X-Backend": GATEWAY})
                return
            priority = gateway.priority_of(self.headers.get(header))
            if not gateway.admit(priority):
                self.send_json(503, {"error": "shed", "priority": priority}, {"X-Shed": "1", "X-Backend": GATEWAY})
                return
            served_by = GATEWAY
            try:
                request = _stream_request(body) if self.path == CHAT_PATH else None
                if request is not None:
                    out = StreamWriter(self, stream_format(self.headers.get("Accept")))
                    try:
                        served_by = gateway.stream(out, request)
                    except ClientGone:
                        self.close_connection = True
                    return
                status, answer, served_by = gateway.predict(body, self.path)
            finally:
                gateway.done(served_by)
            if isinstance(answer, bytes):
                self.send_raw(status, answer, {"X-Backend": served_by})
            else:
                self.send_json(status, answer, {"X-Backend": served_by})

    return Handler


def _stream_request(body: bytes) -> dict[str, Any] | None:
    """A chat request body that asks for a stream, parsed; None for any other body."""
    try:
        request = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    return request if isinstance(request, dict) and request.get("stream") is True else None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="chaos.reference.serving.gateway", description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", help="GatewayConfig as JSON")
    source.add_argument("--config-file", type=Path, help="a file holding GatewayConfig JSON")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    text = args.config if args.config is not None else args.config_file.read_text(encoding="utf-8")
    config = GatewayConfig.model_validate_json(text)
    # Gateway events carry no rank; events.emit would otherwise take one from an inherited RANK.
    os.environ.pop("RANK", None)
    gateway = Gateway(config)
    serve_until_signalled(
        config.port, _handler(gateway), "gateway", lambda port: gateway.start(f"http://127.0.0.1:{port}")
    )
    gateway.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
