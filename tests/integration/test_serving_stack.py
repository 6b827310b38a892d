"""The reference serving stack with real processes: model servers running torch, the gateway, the supervisor.

Faults are real: replicas are killed with SIGKILL, weights are corrupted by the in-job agent from a plan.
Timing bounds are generous on purpose (outcomes are asserted here; speed belongs in benchmarks).
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from support import FakeClock, live_processes, wait_for

from chaos.cluster.local import LocalTransport
from chaos.history.timeline import Event
from chaos.load import LoadRun, LoadSpec
from chaos.plan.agent_plan import ENV_PLAN, InJobOp, write_plan
from chaos.reference.serving.breaker import CircuitBreaker
from chaos.reference.serving.health import ReplicaHealth
from chaos.reference.serving.wire import (
    DEFAULT_OUTPUT,
    golden_path,
    prompt_features,
    read_golden,
    write_golden_once,
)
from chaos.spec.serving import BreakerSettings, ProbeSettings, ServingTarget
from chaos.targets.serving_stack import ServingJob

READY_WITHIN = 60.0  # torch import of two servers on a busy 2-core box; usually ~3 s

FAST: dict[str, Any] = {
    "type": "serving",
    "primary": {"model": "primary", "delay": 0.002, "restart_delay": 0.3},
    "fallback": {"model": "small", "restart_delay": 0.3},
    "request_timeout": 1.0,
    "probes": {"interval": 0.2, "timeout": 0.3, "failure_threshold": 2, "success_threshold": 2},
    "correctness": {"interval": 0.3},
    "breaker": {"failure_threshold": 3, "open_for": 0.5},
}


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


class Stack:
    """A started ServingJob plus every event it reported, and small HTTP helpers."""

    def __init__(self, job: ServingJob) -> None:
        self.job = job
        self.events: list[Event] = []
        parts = urlsplit(job.url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self._conn: http.client.HTTPConnection | None = None

    def poll(self) -> list[Event]:
        self.events += self.job.poll_events()
        return self.events

    def of(self, kind: str, **data: Any) -> list[Event]:
        self.poll()
        return [e for e in self.events if e.kind == kind and all(e.data.get(k) == v for k, v in data.items())]

    def wait_for(self, kind: str, timeout: float = 15.0, after: int = 0, **data: Any) -> Event:
        """The first event of ``kind`` (with ``data``) at or after index ``after`` of the event list."""
        deadline = time.monotonic() + timeout
        while True:
            self.poll()
            for e in self.events[after:]:
                if e.kind == kind and all(e.data.get(k) == v for k, v in data.items()):
                    return e
            if time.monotonic() > deadline:
                kinds = [(e.kind, e.data) for e in self.events[-30:]]
                raise AssertionError(f"no {kind} {data} within {timeout}s; last events: {kinds}")
            time.sleep(0.05)

    def post(
        self, body: dict[str, Any] | None = None, headers: dict[str, str] | None = None, fresh: bool = False
    ) -> tuple[int, http.client.HTTPResponse, dict[str, Any]]:
        """One predict through the gateway on a kept-alive connection (``fresh``: a connection of its own)."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30) if fresh else self._keepalive()
        payload = json.dumps(body if body is not None else {"prompt": "hello"}).encode()
        try:
            conn.request("POST", "/v1/predict", body=payload, headers=headers or {})
            response = conn.getresponse()
            data = json.loads(response.read())
        except Exception:
            conn.close()
            self._conn = None
            raise
        if fresh:
            conn.close()
        return response.status, response, data

    def gateway_view(self) -> dict[str, Any]:
        return _get_json(self.host, self.port, "/healthz")

    def _keepalive(self) -> http.client.HTTPConnection:
        if self._conn is None:
            self._conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        return self._conn


def _get_json(host: str, port: int, path: str) -> dict[str, Any]:
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        assert response.status == 200, response.status
        result: dict[str, Any] = json.loads(response.read())
        return result
    finally:
        conn.close()


def _serving_children() -> set[int]:
    """Live (not zombie) processes of this test whose command line runs a part of the serving stack."""
    me = os.getpid()
    return {p.pid for p in live_processes() if p.ppid == me and b"chaos.reference.serving" in p.cmdline}


@contextmanager
def running(tmp_path: Path, over: dict[str, Any] | None = None, env: dict[str, str] | None = None) -> Iterator[Stack]:
    """A started stack, ready; always stopped afterwards, with no process left behind."""
    spec = ServingTarget.model_validate(_merge(FAST, over or {}))
    job = ServingJob(spec, LocalTransport(), tmp_path / "run", seed=3, extra_env=env or {})
    started = time.monotonic()
    job.start()
    try:
        stack = Stack(job)
        stack.wait_for("serving.ready", timeout=READY_WITHIN)
        print(f"stack ready in {time.monotonic() - started:.2f}s")
        yield stack
    finally:
        job.stop(grace=5)
        assert _serving_children() == set(), "a serving process outlived stop()"


def _kill(stack: Stack, replica: str) -> int:
    pids = stack.job.pids_for_replica(replica)
    assert len(pids) == 1, pids
    os.kill(pids[0], signal.SIGKILL)
    return pids[0]


# -- pure logic (fake clock) -------------------------------------------------------------------------------


def test_breaker_opens_half_opens_and_closes() -> None:
    clock = FakeClock()
    states: list[str] = []
    breaker = CircuitBreaker(
        BreakerSettings(failure_threshold=2, open_for=5.0, half_open_trials=1), on_change=states.append, clock=clock
    )
    assert breaker.allow()
    breaker.failure()
    assert breaker.allow()
    breaker.success()  # a success resets the run of failures
    breaker.failure()
    breaker.failure()
    assert states == ["open"] and not breaker.allow()
    clock.now = 5.0
    assert breaker.peek() == "half_open"
    assert breaker.allow() and states[-1] == "half_open"
    assert not breaker.allow()  # one trial only
    breaker.failure()
    assert states[-1] == "open" and not breaker.allow()
    clock.now = 10.0
    assert breaker.allow()
    breaker.success()
    assert states == ["open", "half_open", "open", "half_open", "closed"] and breaker.allow()


def test_health_hysteresis_and_correctness_episodes() -> None:
    clock = FakeClock()
    log: list[tuple[str, object]] = []
    health = ReplicaHealth(
        ProbeSettings(interval=1, timeout=1, failure_threshold=2, success_threshold=2),
        failback_hold=3.0,
        on_down=lambda reason, n: log.append(("down", reason)),
        on_up=lambda n: log.append(("up", n)),
        clock=clock,
    )
    health.health_ok()
    assert health.up and log == [("up", 1)]  # startup: the first answer is enough
    health.health_failed()
    assert health.up  # one failure is not enough
    health.health_failed()
    assert not health.up and log[-1] == ("down", "health")
    health.health_ok()
    health.health_ok()
    assert not health.up  # eligible, but the failback hold has not passed
    clock.now = 2.0
    health.health_ok()
    assert not health.up
    clock.now = 3.5
    health.health_ok()
    assert health.up and log[-1] == ("up", 4)
    assert health.answer_wrong() and not health.up and log[-1] == ("down", "correctness")
    assert not health.answer_wrong()  # same episode: no second detection
    for _ in range(5):
        health.health_ok()  # liveness says nothing about correctness
    assert not health.up
    health.answer_correct()
    health.answer_missing()  # breaks the run
    health.answer_correct()
    clock.now = 10.0
    health.answer_correct()
    clock.now = 13.0
    health.answer_correct()
    assert health.up


# -- real processes ----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_killed_primary_fails_over_restarts_and_fails_back(tmp_path: Path) -> None:
    with running(tmp_path) as stack:
        status, response, answer = stack.post()
        assert status == 200 and response.getheader("X-Backend") == "primary"
        assert answer["backend"] == "primary" and answer["degraded"] is False and len(answer["output"]) == 8
        status, response, answer = stack.post({"input": [1.0, 2.0]})  # a client error is passed through
        assert status == 400 and response.getheader("X-Backend") == "primary" and "input" in answer["error"]
        mark = len(stack.poll())
        _kill(stack, "primary")
        killed_at = time.monotonic()
        seen: list[tuple[float, int, str]] = []

        def back_on_primary() -> bool:
            status, response, _ = stack.post()
            seen.append((time.monotonic() - killed_at, status, response.getheader("X-Backend") or ""))
            return seen[-1][2] == "primary" and bool(stack.of("serving.backend_up", backend="primary", after="health"))

        assert wait_for(back_on_primary, timeout=40, interval=0.02), seen[-5:]
        assert all(status == 200 for _, status, _ in seen), [s for s in seen if s[1] != 200]
        assert seen[0][2] == "fallback", seen[:3]  # the ladder: the very next request is served
        down = stack.wait_for("detect.backend_down", after=mark, backend="primary", reason="health")
        stack.wait_for("target.role_exit", after=mark, replica="primary")
        stack.wait_for("target.role_restart", after=mark, replica="primary", attempt=1)
        stack.wait_for("serving.route", after=mark, backend="fallback", previous="primary")
        stack.wait_for("serving.route", after=mark, backend="primary", previous="fallback")
        assert not stack.of("target.exit"), "a replica exit must not end the target"
        back = next(t for t, _, backend in seen if backend == "primary")
        exit_ns = stack.of("target.role_exit", replica="primary")[0].ts_ns
        print(
            f"failover: first answer by fallback {seen[0][0] * 1000:.0f} ms after the kill; "
            f"backend_down after {(down.ts_ns - exit_ns) / 1e9:.2f}s; primary serving again after {back:.2f}s"
        )
        assert len(stack.job.pids_for_replica("primary")) == 1


@pytest.mark.slow
def test_no_fallback_no_cache_gives_502(tmp_path: Path) -> None:
    over = {"fallback": None, "cache_fallback": False, "primary": {"restart": False}}
    with running(tmp_path, over) as stack:
        assert stack.post()[0] == 200
        _kill(stack, "primary")
        stack.wait_for("target.role_exit", replica="primary")
        status, response, answer = stack.post()
        assert status == 502 and response.getheader("X-Backend") == "gateway" and "error" in answer
        stack.wait_for("detect.backend_down", backend="primary", reason="health")
        stack.wait_for("serving.route", backend="none")
        assert stack.post()[0] == 502
        assert not stack.of("target.role_restart")


@pytest.mark.slow
def test_cache_rung_answers_degraded_when_both_models_are_dead(tmp_path: Path) -> None:
    over = {"primary": {"restart": False}, "fallback": {"model": "small", "restart": False}}
    with running(tmp_path, over) as stack:
        status, _, warm = stack.post({"prompt": "alpha"})
        assert status == 200 and warm["backend"] == "primary"
        _kill(stack, "primary")
        _kill(stack, "fallback")
        status, response, answer = stack.post({"prompt": "alpha"})
        assert status == 200 and response.getheader("X-Backend") == "cache"
        assert answer["degraded"] is True and answer["cached"] is True and answer["output"] == warm["output"]
        status, _, unseen = stack.post({"prompt": "never asked before"})
        assert status == 200 and unseen["backend"] == "cache" and unseen["cached"] is False
        assert unseen["output"] == list(DEFAULT_OUTPUT)
        stack.wait_for("serving.route", backend="cache")


@pytest.mark.slow
def test_corrupted_weights_are_caught_by_the_correctness_probe(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    plan = run_dir / "plan.json"
    # The top exponent bit of one bias of the primary's output layer: that output grows ~1e37, for every
    # input, so the damage cannot hide behind a ReLU. Fired at the primary's 5th inference (rank 0), stuck:
    # the agent heals a transient weight flip after one step, i.e. after one inference.
    op = InJobOp(
        op_id="op-1",
        fault="flip",
        injector="bitflip",
        params={"where": "weights", "layer": "4.bias", "bit": 30, "persistence": "stuck"},
        at_step=5,
        rank=0,
    )
    write_plan(plan, seed=11, ops=[op])
    with running(tmp_path, env={ENV_PLAN: str(plan)}) as stack:
        golden = golden_path(run_dir, "primary").read_bytes()
        for i in range(8):  # inferences: the fault fires at the 5th (probes count as inferences too)
            assert stack.post({"prompt": f"p{i}"})[0] == 200
        applied = stack.wait_for("fault.applied", op="op-1")
        assert applied.rank == 0
        wrong = stack.wait_for("detect.wrong_answer", backend="primary")
        assert wrong.data["max_abs_err"] is None or float(wrong.data["max_abs_err"]) > 1.0  # type: ignore[arg-type]
        stack.wait_for("detect.backend_down", backend="primary", reason="correctness")
        start = stack.wait_for("serving.replica_start", replica="primary")
        port = start.data["port"]
        assert isinstance(port, int)
        assert _get_json("127.0.0.1", port, "/healthz")["ok"] is True  # liveness still passes
        assert stack.post({"prompt": "after"})[1].getheader("X-Backend") == "fallback"
        time.sleep(1.5)  # several correctness probes: the replica is still corrupted and must stay down
        assert not stack.of("serving.backend_up", backend="primary", after="correctness")
        assert stack.gateway_view()["backends"]["primary"] == {
            "up": False,
            "reason": "correctness",
            "breaker": "closed",
        }
        assert len(stack.of("detect.wrong_answer")) == 1  # one episode, one detection
        assert golden_path(run_dir, "primary").read_bytes() == golden


@pytest.mark.slow
def test_priority_shedding_keeps_premium_traffic(tmp_path: Path) -> None:
    over = {
        "fallback": None,
        "correctness": {"enabled": False},
        "request_timeout": 10.0,
        "primary": {"delay": 0.5, "workers": 1},
        "shedding": {"capacity": 4, "reserve": 0.5},  # from 2 in flight only premium, from 4 nobody
    }
    with running(tmp_path, over) as stack:
        results: list[tuple[str, int]] = []

        def send(priority: str) -> None:
            status = stack.post({"prompt": priority}, {"X-Priority": priority}, fresh=True)[0]
            results.append((priority, status))

        def in_flight(n: int) -> Callable[[], bool]:
            return lambda: bool(stack.gateway_view()["in_flight"] >= n)

        threads = [threading.Thread(target=send, args=("free",)) for _ in range(2)]
        for thread in threads:
            thread.start()
        assert wait_for(in_flight(2), timeout=10)
        status, response, answer = stack.post({"prompt": "x"}, {"X-Priority": "free"}, fresh=True)
        assert status == 503 and response.getheader("X-Shed") == "1" and answer == {"error": "shed", "priority": "free"}
        assert stack.post({"prompt": "x"}, fresh=True)[0] == 503  # no priority header: the lowest
        for _ in range(2):  # premium is admitted into the reserve, up to the capacity
            threads.append(threading.Thread(target=send, args=("premium",)))
            threads[-1].start()
        assert wait_for(in_flight(4), timeout=10)
        status, response, answer = stack.post({"prompt": "x"}, {"X-Priority": "premium"}, fresh=True)
        assert status == 503 and answer["priority"] == "premium"  # at capacity nobody gets in
        for thread in threads:
            thread.join(timeout=30)
        assert sorted(results) == [("free", 200), ("free", 200), ("premium", 200), ("premium", 200)]


@pytest.mark.slow
def test_gateway_sustains_load_on_the_primary(tmp_path: Path) -> None:
    with running(tmp_path) as stack:
        spec = LoadSpec.model_validate(
            {
                "url": f"{stack.job.url}/v1/predict",
                "method": "POST",
                "rate": 300,
                "duration": 4,
                "body": '{"prompt": "request {i}", "tier": "{priority}"}',
                "priorities": {"premium": 0.2, "free": 0.8},
                "served_by": {"header": "X-Backend"},
                "degraded": {"json": "degraded"},
                "timeout": 5,
            }
        )
        load = LoadRun(spec).start()
        load.wait(timeout=60)
        requests = [e for e in load.poll_events() if e.kind == "load.request"]
        ok = [e for e in requests if e.data["status"] == 200 and e.data["backend"] == "primary"]
        latencies = sorted(float(e.data["latency_s"]) for e in ok)  # type: ignore[arg-type]
        p99 = latencies[int(0.99 * (len(latencies) - 1))] if latencies else None
        print(f"load: {len(ok)}/{len(requests)} served by primary at 300 req/s offered, p99 {p99}")
        assert len(requests) == 1200
        assert len(ok) >= 0.98 * len(requests)
        assert not any(e.data["degraded"] for e in ok)


def test_golden_answer_is_written_once(tmp_path: Path) -> None:
    assert write_golden_once(tmp_path, "primary", [1.0] * 8)
    assert not write_golden_once(tmp_path, "primary", [2.0] * 8)  # a restarted server never overwrites it
    assert read_golden(tmp_path, "primary") == [1.0] * 8
    assert read_golden(tmp_path, "small") is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["golden-primary.json"]  # no temp file left


def test_prompt_features_are_stable() -> None:
    features = prompt_features("hello")
    assert features == prompt_features("hello") != prompt_features("hello!")
    assert len(features) == 32 and all(-1.0 <= v <= 1.0 for v in features)
