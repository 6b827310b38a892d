"""Streamed load: the open-loop generator reading SSE and chunked answers token by token over real sockets.

Framing and outcomes against an in-process HTTP server that streams (fast); the reference gateway in-process in
front of fake streaming replicas: its cached rung and its first-token deadline (fast); the reference streaming
model server and the gateway's relay with real processes and real SIGKILLs (slow). Outcomes are asserted here;
the generator's speed and overhead are in benchmarks/stream_load.py.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from support import ROOT, wait_for

from chaos.cluster.local import LocalTransport
from chaos.cluster.ports import free_port
from chaos.history.timeline import Event
from chaos.load import LoadRun, LoadSpec
from chaos.plan.agent_plan import ENV_PLAN, InJobOp, write_plan
from chaos.reference.serving.answer_cache import DEGRADED_TEXT
from chaos.reference.serving.gateway import Gateway, _handler
from chaos.reference.serving.wire import make_server
from chaos.spec.serving import GatewayConfig, ReplicaEndpoint, ServingTarget
from chaos.targets.serving_stack import ServingJob

CHAT = '{"messages": [{"role": "user", "content": "question {i}"}], "stream": true}'


def _token(i: int, k: int, backend: str) -> bytes:
    return json.dumps({"backend": backend, "choices": [{"index": 0, "delta": {"content": f"t{i}.{k} "}}]}).encode()


class _Streamer(BaseHTTPRequestHandler):
    """``/s?n=N&gap=S&cut=K&framing=chunked|length|close&status=CODE&backend=B``: N tokens (SSE, or JSON lines
    when Accept asks for them), S seconds apart; ``cut``: the connection closes after K tokens."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        q = {k: v[0] for k, v in parse_qs(urlsplit(self.path).query).items()}
        status, backend = int(q.get("status", 200)), q.get("backend", "b0")
        n, gap, cut = int(q.get("n", 5)), float(q.get("gap", 0)), int(q.get("cut", -1))
        framing = q.get("framing", "chunked")
        i = json.loads(raw).get("i", 0) if raw.startswith(b"{") else 0
        ndjson = "x-ndjson" in (self.headers.get("Accept") or "")
        frames = [
            _token(i, k, backend) + b"\n" if ndjson else b"data: " + _token(i, k, backend) + b"\n\n" for k in range(n)
        ]
        if not ndjson:
            frames.append(b"data: [DONE]\n\n")
        self.send_response(status)
        self.send_header("Content-Type", "application/x-ndjson" if ndjson else "text/event-stream")
        self.send_header("X-Backend", "head-" + backend)
        if status != 200:
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"no")
            return
        if framing == "length":
            body = b"".join(frames)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        if framing == "close":
            self.send_header("Connection", "close")
            self.close_connection = True
        else:
            self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for k, frame in enumerate(frames):
            if k == cut:
                self.close_connection = True
                return  # the body stops here: the server closes the connection
            if gap and k:
                time.sleep(gap)
            self.wfile.write(frame if framing == "close" else b"%x\r\n%s\r\n" % (len(frame), frame))
        if framing != "close":
            self.wfile.write(b"0\r\n\r\n")


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client that timed out aborts: the broken pipe is expected


@pytest.fixture(scope="module")
def streamer() -> Iterator[str]:
    httpd = _Server(("127.0.0.1", 0), _Streamer)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def _load(url: str, *, rate: float = 10, duration: float = 0.5, **fields: Any) -> tuple[list[Event], dict[str, Any]]:
    spec = LoadSpec.model_validate(
        {"url": url, "method": "POST", "rate": rate, "duration": duration, "body": '{"i": {i}}', **fields}
    )
    run = LoadRun(spec, isolation="thread", buffer=True)
    run.start()
    assert run.wait(60)
    requests = sorted((e for e in run.poll_events() if e.kind == "load.request"), key=lambda e: e.data["i"])
    assert run.totals is not None and len(requests) == run.totals["scheduled"]
    return requests, dict(run.totals)


@pytest.mark.parametrize(
    ("stream", "framing"), [("sse", "chunked"), ("sse", "length"), ("sse", "close"), ("chunked", "chunked")]
)
def test_every_framing_streams_complete(streamer: str, stream: str, framing: str) -> None:
    requests, totals = _load(
        f"{streamer}/s?n=4&gap=0.01&framing={framing}", stream=stream, served_by={"json": "backend"}, sessions=2
    )
    for e in requests:
        d = e.data
        assert d["stream"] is True and d["ended"] == "complete" and d["status"] == 200, d
        assert d["tokens"] == 4 and len(d["gaps_s"]) == 3 and all(g >= 0 for g in d["gaps_s"])
        assert d["ttft_s"] is not None and 0 < d["ttft_s"] <= d["latency_s"]
        assert d["backends"] == ["b0"] and d["backend"] == "b0" and d["resumed"] is False
        assert d["session"] == f"s{d['i'] % 2}"
    assert totals["complete"] == len(requests) == 5 and totals["tokens"] == 20 and totals["cut"] == 0
    if framing != "close":  # after an SSE [DONE] the connection is still reused once its body ends
        assert totals["connections"] < len(requests)


def test_cut_error_and_timeout_outcomes(streamer: str) -> None:
    cut, totals = _load(f"{streamer}/s?n=6&cut=2", stream="sse", served_by={"header": "X-Backend"})
    for e in cut:
        assert e.data["ended"] == "cut" and e.data["tokens"] == 2 and e.data["status"] == "error", e.data
        assert e.data["backends"] == ["head-b0"] and "stream cut after 2 tokens" in e.data["error"]
    assert totals["cut"] == len(cut) and totals["errors"] == len(cut) and totals["complete"] == 0

    refused, _ = _load(f"http://127.0.0.1:{free_port()}/s", stream="sse")
    unavailable, _ = _load(f"{streamer}/s?status=503", stream="chunked")
    for e in refused + unavailable:
        assert e.data["ended"] == "error" and e.data["tokens"] == 0 and e.data["ttft_s"] is None, e.data
        assert e.data["backends"] == [] and e.data["gaps_s"] == []
    assert {e.data["status"] for e in unavailable} == {503} and {e.data["status"] for e in refused} == {"error"}

    slow, totals = _load(f"{streamer}/s?n=50&gap=0.2", stream="sse", rate=4, timeout=0.5)
    for e in slow:
        assert e.data["ended"] == "timeout" and e.data["status"] == "timeout" and 1 <= e.data["tokens"] <= 4, e.data
    assert totals["tokens"] == sum(e.data["tokens"] for e in slow)


def test_a_stream_that_ends_without_done_is_cut_and_plain_load_is_unchanged(streamer: str) -> None:
    no_done, _ = _load(f"{streamer}/s?n=3&cut=3", stream="sse")  # the 3 tokens came, [DONE] did not
    assert {(e.data["ended"], e.data["tokens"]) for e in no_done} == {("cut", 3)}
    plain, totals = _load(f"{streamer}/s?n=3", served_by={"header": "X-Backend"})
    assert all("stream" not in e.data and "session" not in e.data and e.data["status"] == 200 for e in plain)
    assert "tokens" not in totals and totals["ok"] == len(plain)
    with_sessions, _ = _load(f"{streamer}/s?n=3", sessions=3)
    assert [e.data["session"] for e in with_sessions] == ["s0", "s1", "s2", "s0", "s1"]


def test_cli_prints_stream_percentiles(streamer: str) -> None:
    argv = [sys.executable, "-m", "chaos.load", "--url", f"{streamer}/s?n=3&gap=0.01", "--method", "POST"]
    argv += ["--body", '{"i": {i}}', "--rate", "10", "--duration", "0.5s", "--stream", "sse", "--sessions", "2"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stdout.splitlines() if x.startswith("streams:"))
    assert "complete 5" in line and "tokens 15" in line and "ttft p50" in line and "gap p50" in line


# -- the reference gateway in-process, in front of fake streaming replicas ----------------------------------------


class _FakeLm(ThreadingHTTPServer):
    """A streaming replica without a model: ``tokens`` tokens ``"{prompt}.{k} "``; ``first_wait`` seconds before
    the first; ``cut_after``: the connection closes after that many tokens of a stream (None: never)."""

    daemon_threads = True

    def __init__(self, name: str, tokens: int = 5, first_wait: float = 0.0) -> None:
        super().__init__(("127.0.0.1", 0), _FakeLmHandler)
        self.name, self.tokens, self.first_wait = name, tokens, first_wait
        self.cut_after: int | None = None
        threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # the gateway gave up on a stream: the broken pipe is expected

    def kill(self) -> None:
        """Stop listening: new connections are refused."""
        self.shutdown()
        self.server_close()


class _FakeLmHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: _FakeLm

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def _event(self, doc: dict[str, Any] | bytes) -> None:
        data = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
        frame = b"data: " + data + b"\n\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(frame), frame))

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        prompt, start, me = request["messages"][0]["content"], request.get("resume_from", 0), self.server
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if not start:
            self._event({"backend": me.name, "choices": [{"index": 0, "delta": {"role": "assistant"}}]})
        time.sleep(me.first_wait)
        for k in range(start, me.tokens):
            if me.cut_after is not None and k - start == me.cut_after:
                self.close_connection = True
                return
            self._event(
                {"backend": me.name, "token": k, "choices": [{"index": 0, "delta": {"content": f"{prompt}.{k} "}}]}
            )
        self._event({"backend": me.name, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
        self._event(b"[DONE]")
        self.wfile.write(b"0\r\n\r\n")


@contextmanager
def _gateway(tmp_path: Path, primary: _FakeLm, fallback: _FakeLm, **over: Any) -> Iterator[tuple[Gateway, str]]:
    """The reference gateway (in this process) in front of two fake replicas; probes every 50 ms, one failed
    probe marks a replica down, no correctness probe."""
    settings = {
        "type": "serving",
        "primary": {"model": "lm"},
        "fallback": {"model": "lm"},
        "request_timeout": 2.0,
        "probes": {"interval": 0.05, "timeout": 0.5, "failure_threshold": 1, "success_threshold": 1},
        "correctness": {"enabled": False},
        "resume_streams": True,
    } | over
    config = GatewayConfig(
        target=ServingTarget.model_validate(settings),
        port=0,
        run_dir=tmp_path,
        replicas={
            "primary": ReplicaEndpoint(model="lm", port=primary.server_address[1]),
            "fallback": ReplicaEndpoint(model="lm", port=fallback.server_address[1]),
        },
    )
    gateway = Gateway(config, emit=lambda *args, **kwargs: None)
    server = make_server(0, _handler(gateway))
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    gateway.start(url)
    try:
        assert wait_for(lambda: gateway.view()["ready"], 10)
        yield gateway, url
    finally:
        gateway.stop()
        server.shutdown()
        server.server_close()
        for replica in (primary, fallback):
            if replica.socket.fileno() >= 0:
                replica.kill()


def _chat(url: str, prompt: str) -> tuple[str | None, list[dict[str, Any]], bool]:
    """One streamed chat request: the head's X-Backend, the chunk objects, and whether the stream completed."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)
    body = json.dumps({"messages": [{"role": "user", "content": prompt}], "stream": True})
    conn.request("POST", "/v1/chat/completions", body=body, headers={"Accept": "text/event-stream"})
    response = conn.getresponse()
    try:
        raw, whole = response.read(), True
    except http.client.IncompleteRead as exc:
        raw, whole = exc.partial, False
    conn.close()
    chunks = [json.loads(line[6:]) for line in raw.split(b"\n") if line.startswith(b"data: {")]
    return response.getheader("X-Backend"), chunks, whole and b"data: [DONE]" in raw


def _text(chunks: list[dict[str, Any]]) -> list[str]:
    return [c["choices"][0]["delta"]["content"] for c in chunks if c["choices"][0]["delta"].get("content")]


def test_the_cached_rung_replays_complete_answers_once_no_replica_can_answer(tmp_path: Path) -> None:
    primary, fallback = _FakeLm("primary"), _FakeLm("fallback")
    with _gateway(tmp_path, primary, fallback) as (gateway, url):
        head, fresh, done = _chat(url, "q1")
        assert head == "primary" and done and _text(fresh) == [f"q1.{k} " for k in range(5)]
        primary.kill()
        fallback.kill()
        assert wait_for(lambda: gateway.view()["route"] == "cache", 10)
        head, cached, done = _chat(url, "q1")
        assert head == "cache" and done and _text(cached) == _text(fresh)
        assert all(c["backend"] == "cache" and c["degraded"] is True and c["cached"] is True for c in cached)
        assert [c["token"] for c in cached if "token" in c] == list(range(5))
        head, missed, done = _chat(url, "never asked")
        assert head == "cache" and done and tuple(_text(missed)) == DEGRADED_TEXT
        assert all(c["degraded"] is True and c["cached"] is False for c in missed)


def test_a_stream_cut_on_the_last_replica_resumes_from_the_cache_only_when_it_holds_that_answer(tmp_path: Path) -> None:
    primary, fallback = _FakeLm("primary"), _FakeLm("fallback")
    with _gateway(tmp_path, primary, fallback, breaker={"enabled": False}) as (_, url):
        _, whole, _ = _chat(url, "q1")
        fallback.kill()
        primary.cut_after = 2
        head, resumed, done = _chat(url, "q1")
        assert head == "primary" and done and _text(resumed) == _text(whole)
        assert [c["backend"] for c in resumed if "token" in c] == ["primary"] * 2 + ["cache"] * 3
        head, cut, done = _chat(url, "q2")  # never answered whole: the cache cannot go on with it
        assert head == "primary" and not done and _text(cut) == ["q2.0 ", "q2.1 "]


def test_a_first_token_deadline_gives_up_a_slow_replica_before_the_client_sees_anything(tmp_path: Path) -> None:
    slow, quick = _FakeLm("primary", first_wait=0.8), _FakeLm("fallback")
    with _gateway(tmp_path, slow, quick, first_token_timeout=0.2, breaker={"enabled": False}) as (_, url):
        started = time.monotonic()
        head, chunks, done = _chat(url, "q1")
        took = time.monotonic() - started
    assert head == "fallback" and done and {c["backend"] for c in chunks} == {"fallback"}
    assert sum("role" in c["choices"][0]["delta"] for c in chunks) == 1  # the slow replica's role chunk never went out
    assert took < 0.8  # it did not wait for the slow replica's first token
    slow, quick = _FakeLm("primary", first_wait=0.8), _FakeLm("fallback")
    with _gateway(tmp_path, slow, quick) as (_, url):  # no deadline: the client waits it out
        started = time.monotonic()
        head, chunks, done = _chat(url, "q1")
        assert head == "primary" and done and time.monotonic() - started >= 0.8


# -- the reference streaming server and gateway (real processes) ----------------------------------------------


@contextmanager
def _model_server(tmp_path: Path, name: str, *args: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    port = free_port()
    argv = [sys.executable, "-m", "chaos.reference.serving.model_server", "--replica", name, "--model", "lm"]
    argv += ["--port", str(port), "--run-dir", str(tmp_path), *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None and "listening" in proc.stdout.readline()
        yield proc, f"http://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait()


def _whole_answer(url: str, question: str) -> dict[str, Any]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port or 80, timeout=30)
    body = json.dumps({"messages": [{"role": "user", "content": question}]})
    conn.request("POST", "/v1/chat/completions", body=body)
    answer: dict[str, Any] = json.loads(conn.getresponse().read())
    conn.close()
    return answer


@pytest.mark.slow
def test_generator_against_the_streaming_model_server(tmp_path: Path) -> None:
    with _model_server(tmp_path, "a", "--token-delay", "0.01", "--max-tokens", "6") as (_, url):
        whole = _whole_answer(url, "question 0")
        assert whole["usage"]["completion_tokens"] == 6 and whole["backend"] == "a"
        for stream in ("sse", "chunked"):
            requests, totals = _load(
                url + "/v1/chat/completions", body=CHAT, stream=stream, served_by={"json": "backend"}, rate=8
            )
            for e in requests:
                d = e.data
                assert d["ended"] == "complete" and d["tokens"] == 6 and d["backends"] == ["a"], d
                assert d["ttft_s"] > 0 and len(d["gaps_s"]) == 5 and min(d["gaps_s"]) > 0
            assert totals["tokens"] == 6 * len(requests)


@pytest.mark.slow
def test_a_server_killed_mid_stream_cuts_every_open_stream(tmp_path: Path) -> None:
    with _model_server(tmp_path, "a", "--token-delay", "0.1", "--max-tokens", "100") as (proc, url):
        spec = LoadSpec.model_validate(
            {"url": url + "/v1/chat/completions", "method": "POST", "rate": 4, "duration": 1, "body": CHAT}
            | {"stream": "sse", "served_by": {"json": "backend"}, "timeout": 30}
        )
        run = LoadRun(spec, isolation="thread", buffer=True).start()
        time.sleep(1.5)  # every stream open, the last one 0.75 s in (a token every 0.1 s)
        os.kill(proc.pid, signal.SIGKILL)
        assert run.wait(30)
    requests = [e for e in run.poll_events() if e.kind == "load.request"]
    assert len(requests) == 4
    for e in requests:
        d = e.data
        assert d["ended"] == "cut" and 0 < d["tokens"] < 100 and d["backends"] == ["a"] and d["backend"] == "a", d


def _stack(tmp_path: Path, resume: bool, env: dict[str, str] | None = None) -> ServingJob:
    lm = {"model": "lm", "token_delay": 0.05, "max_tokens": 40, "restart": False}
    spec = ServingTarget.model_validate(
        {
            "type": "serving",
            "primary": lm,
            "fallback": lm,
            "cache_fallback": False,
            "request_timeout": 1.0,
            "probes": {"interval": 0.2, "timeout": 0.3, "failure_threshold": 2, "success_threshold": 2},
            "correctness": {"interval": 0.3},
            "resume_streams": resume,
        }
    )
    return ServingJob(spec, LocalTransport(), tmp_path / "run", seed=3, extra_env=env or {})


@pytest.mark.slow
@pytest.mark.parametrize(
    ("resume", "fault"),
    [(True, signal.SIGKILL), (False, signal.SIGKILL), (True, signal.SIGSTOP)],
    ids=["killed-resumed", "killed-cut", "frozen-resumed"],
)
def test_gateway_resumes_or_cuts_a_stream_whose_replica_dies(tmp_path: Path, resume: bool, fault: int) -> None:
    """SIGKILL: the upstream's connection ends mid-body; SIGSTOP (a freeze): it goes silent, and the gateway
    gives up on it after request_timeout (1 s)."""
    job = _stack(tmp_path, resume)
    job.start()
    pid = 0
    try:
        assert wait_for(lambda: any(e.kind == "serving.ready" for e in job.poll_events()), 60)
        spec = LoadSpec.model_validate(
            {"url": job.url + "/v1/chat/completions", "method": "POST", "rate": 4, "duration": 1, "body": CHAT}
            | {"stream": "sse", "served_by": {"json": "backend"}, "timeout": 30}
        )
        run = LoadRun(spec, isolation="thread", buffer=True).start()
        time.sleep(1.2)  # every stream open on the primary, none finished (40 tokens at 0.05 s)
        [pid] = job.pids_for_replica("primary")
        os.kill(pid, fault)
        assert run.wait(60)
        requests = [e for e in run.poll_events() if e.kind == "load.request"]
    finally:
        if fault == signal.SIGSTOP and pid:
            os.kill(pid, signal.SIGCONT)
        job.stop(grace=5)
    assert len(requests) == 4
    for e in requests:
        d = e.data
        if resume:
            assert d["ended"] == "complete" and d["resumed"] is True and d["tokens"] == 40, d
            assert d["backends"] == ["primary", "fallback"] and d["status"] == 200
        else:
            assert d["ended"] == "cut" and d["backends"] == ["primary"] and 0 < d["tokens"] < 40, d
            assert d["status"] == "error"


@pytest.mark.slow
def test_corrupted_token_model_weights_are_caught_and_streams_move_to_the_fallback(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    plan = tmp_path / "run" / "plan.json"
    # The top exponent bit of the head's biases, stuck, at the primary's 5th forward (probes count too).
    flip = {"where": "weights", "layer": "head.bias", "bit": 30, "count": 4, "persistence": "stuck"}
    write_plan(
        plan, seed=11, ops=[InJobOp(op_id="op-1", fault="flip", injector="bitflip", params=flip, at_step=5, rank=0)]
    )
    job = _stack(tmp_path, resume=False, env={ENV_PLAN: str(plan)})
    job.start()
    events: list[Event] = []

    def seen(kind: str, **data: Any) -> bool:
        events.extend(job.poll_events())
        return any(e.kind == kind and all(e.data.get(k) == v for k, v in data.items()) for e in events)

    try:
        assert wait_for(lambda: seen("serving.ready"), 60)
        assert wait_for(lambda: seen("fault.applied", op="op-1"), 30)
        assert wait_for(lambda: seen("detect.backend_down", backend="primary", reason="correctness"), 30)
        requests, _ = _load(
            job.url + "/v1/chat/completions", body=CHAT, stream="sse", served_by={"json": "backend"}, rate=4, duration=1
        )
    finally:
        job.stop(grace=5)
    assert any(e.kind == "detect.wrong_answer" and e.data.get("backend") == "primary" for e in events)
    assert {(e.data["ended"], tuple(e.data["backends"])) for e in requests} == {("complete", ("fallback",))}
