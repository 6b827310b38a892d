"""The open-loop load generator against a real local HTTP server, and its summary functions offline."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import islice
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml
from pydantic import ValidationError
from support import ROOT, wait_for

from chaos.cluster.local import process_state
from chaos.history.timeline import Event, History
from chaos.load import (
    LOAD_END,
    LOAD_REQUEST,
    LOAD_START,
    LoadRun,
    LoadSpec,
    achieved_rate,
    backend_shares,
    error_rate,
    latency_quantile,
    offered,
    percentile,
    priority_sequence,
    run_bounds,
    schedule,
    summarize,
    windows,
)


class _Handler(BaseHTTPRequestHandler):
    """``/echo``: answers for request ``i`` (from a JSON body ``{"i": ...}``) with X-Backend ``b{i%3}``,
    X-Degraded ``yes`` when i%5==0 else ``no``, and a JSON body naming backend ``j{i%2}`` and
    ``flags[0].degraded`` = i%4==0; i%3==1 answers chunked, i%3==2 close-delimited (no length).
    ``/flaky``: 503 for every i%3==0. ``/slow?s=SECONDS``: sleeps first. Every request is logged."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # head and body go out in two writes; Nagle would hold the body 40 ms
    received: list[dict[str, object]] = []

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass

    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def _handle(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
        url = urlsplit(self.path)
        try:
            i = int(json.loads(raw)["i"])
        except (ValueError, KeyError, TypeError):
            i = len(self.received)
        self.received.append({"i": i, "body": raw, "priority": self.headers.get("X-Priority"), "path": url.path})
        if url.path == "/slow":
            time.sleep(float(parse_qs(url.query).get("s", ["1"])[0]))
        status = 503 if url.path == "/flaky" and i % 3 == 0 else 200
        body = json.dumps({"meta": {"backend": f"j{i % 2}"}, "flags": [{"degraded": i % 4 == 0}]}).encode()
        self.send_response(status)
        self.send_header("X-Backend", f"b{i % 3}")
        self.send_header("X-Degraded", "yes" if i % 5 == 0 else "no")
        self.send_header("Content-Type", "application/json")
        mode = i % 3 if url.path == "/echo" else 0
        if mode == 1:
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            half = len(body) // 2
            for part in (body[:half], body[half:]):
                self.wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
        elif mode == 2:
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)
            self.close_connection = True
        else:
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # clients that timed out abort their connection; the broken pipe is expected


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = _Server(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def received() -> list[dict[str, object]]:
    _Handler.received = []
    return _Handler.received


def _run(spec: LoadSpec, isolation: str = "thread") -> tuple[list[Event], History]:
    history = History()
    run = LoadRun(spec, history=history, isolation=isolation).start()  # type: ignore[arg-type]
    assert run.wait(timeout=30)
    return [e for e in history if e.kind == LOAD_REQUEST], history


def _by_i(events: list[Event]) -> list[Event]:
    return sorted(events, key=lambda e: e.get_int("i") or 0)


def _spec(url: str, **fields: object) -> LoadSpec:
    return LoadSpec.model_validate({"url": url, **fields})


def _echo(server: str, rate: int, duration: str, **reading: object) -> LoadSpec:
    """POSTs of ``{"i": i}`` to the test server's echo endpoint, read as ``reading`` says (served_by, degraded)."""
    return _spec(f"{server}/echo", method="POST", rate=rate, duration=duration, body='{"i": {i}}', **reading)


# -- schedule (pure)


def _counts(times: list[float], edges: list[float]) -> list[int]:
    return [sum(1 for t in times if a <= t < b) for a, b in zip(edges, edges[1:], strict=False)]


def test_schedule_constant_step_burst_counts_per_window() -> None:
    constant = _spec("http://x/", rate=200, duration="2s")
    times = list(schedule(constant))
    assert len(times) == 400 and times[0] == 0.0 and times == sorted(times) and times[-1] < 2.0
    assert _counts(times, [0, 0.5, 1.0, 1.5, 2.0]) == [100, 100, 100, 100]

    step = _spec(
        "http://x/", rate=100, duration="3s", pattern={"step": [{"at": "1s", "rate": 400}, {"at": "2s", "rate": 0}]}
    )
    assert _counts(list(schedule(step)), [0, 1, 2, 3]) == [100, 400, 0]
    assert offered(step) == pytest.approx(500)

    burst = _spec(
        "http://x/", rate=100, duration="3s", pattern={"burst": {"every": "1s", "duration": "200ms", "rate": 1000}}
    )
    counts = _counts(list(schedule(burst)), [0, 1, 1.2, 2, 2.2, 3])
    assert all(abs(c - e) <= 1 for c, e in zip(counts, [100, 200, 80, 200, 80], strict=True)), counts

    poisson = _spec("http://x/", rate=1000, duration="2s", arrivals="poisson", seed=3)
    first, again = list(schedule(poisson)), list(schedule(poisson))
    assert first == again and 1800 < len(first) < 2200  # seeded, and the rate holds on average


def test_spec_embeds_in_yaml_and_rejects_mistakes(tmp_path: Path) -> None:
    text = """
    url: http://127.0.0.1:8000/v1/generate
    method: post
    rate: 500
    pattern: {burst: {every: 10s, duration: 1s, rate: 2000}}
    duration: 1m
    body: '{"prompt": "request {i}", "tier": "{priority}"}'
    priorities: {premium: 0.2, free: 0.8}
    served_by: {json: meta.backend}
    degraded: {header: X-Degraded, value: "1"}
    """
    spec = LoadSpec.model_validate(yaml.safe_load(text))
    assert spec.method == "POST" and spec.duration == 60 and spec.served_by is not None
    assert LoadSpec.model_validate_json(spec.model_dump_json(by_alias=True)) == spec
    for bad, message in [
        ({"pattern": {"stepp": []}}, "pattern must be constant"),
        ({"served_by": {"hdr": "X"}}, "served_by must be"),
        ({"rate": 0}, "greater than 0"),
        ({"url": "ftp://x/"}, "http:// or https://"),
        ({"headers": {"X-A": "1\r\nX-B: 2"}}, "line break"),
        ({"pattern": {"burst": {"every": "1s", "duration": "2s", "rate": 5}}}, "shorter than its period"),
        ({"timeout_s": 3}, "Extra inputs"),
    ]:
        with pytest.raises(ValidationError, match=message):
            LoadSpec.model_validate({"url": "http://x/", "rate": 10, "duration": "1s", **bad})


# -- against a live server


def test_step_and_burst_patterns_live(server: str) -> None:
    spec = _spec(f"{server}/plain", rate=100, duration="1s", pattern={"step": [{"at": "0.5s", "rate": 300}]})
    events, history = _run(spec)
    start = history.of(LOAD_START)[0].get_int("start_ns")
    assert start is not None and len(events) == 200
    assert [w.scheduled for w in windows(events, 0.5, start_ns=start, end_ns=start + 10**9)] == [50, 150]
    assert all(e.data["status"] == 200 for e in events)

    spec = _spec(
        f"{server}/plain",
        rate=40,
        duration="1s",
        pattern={"burst": {"every": "0.5s", "duration": "0.25s", "rate": 200}},
    )
    events, history = _run(spec)
    start = history.of(LOAD_START)[0].get_int("start_ns")
    assert start is not None
    counts = [w.scheduled for w in windows(events, 0.25, start_ns=start, end_ns=start + 10**9)]
    assert all(abs(c - e) <= 1 for c, e in zip(counts, [10, 10, 50, 10], strict=True)), counts


def test_served_by_and_degraded_from_headers(server: str, received: list[dict[str, object]]) -> None:
    spec = _echo(server, 100, "0.6s", served_by={"header": "x-backend"}, degraded={"header": "X-Degraded"})
    events, history = _run(spec, isolation="process")
    assert len(events) == 60 and len(received) == 60
    for e in _by_i(events):
        i = e.get_int("i")
        assert i is not None
        assert (e.data["status"], e.data["backend"], e.data["degraded"]) == (200, f"b{i % 3}", i % 5 == 0), e
        assert e.ts_ns >= (e.get_int("scheduled_ns") or 0)
    assert backend_shares(events) == pytest.approx({"b0": 1 / 3, "b1": 1 / 3, "b2": 1 / 3})
    end = history.of(LOAD_END)[0].data
    assert end["scheduled"] == end["responded"] == 60 and isinstance(end["cpu_s"], float)


def test_served_by_and_degraded_from_json_paths(server: str) -> None:
    # i%3 picks the framing: content-length, chunked, or close-delimited; the reading must not care.
    spec = _echo(server, 100, "0.6s", served_by={"json": "meta.backend"}, degraded={"json": "flags.0.degraded"})
    events, _ = _run(spec)
    assert len(events) == 60
    for e in _by_i(events):
        i = e.get_int("i")
        assert i is not None
        assert (e.data["status"], e.data["backend"], e.data["degraded"]) == (200, f"j{i % 2}", i % 4 == 0), e
    with_value = _echo(server, 50, "0.2s", degraded={"json": "meta.backend", "value": "j1"})
    for e in _run(with_value)[0]:
        assert e.data["degraded"] == ((e.get_int("i") or 0) % 2 == 1)


def test_priorities_follow_seeded_weights_and_reach_the_server(server: str, received: list[dict[str, object]]) -> None:
    spec = _spec(
        f"{server}/echo",
        method="POST",
        rate=400,
        duration="0.5s",
        seed=7,
        priorities={"premium": 0.2, "free": 0.8},
        body='{"i": {i}, "tier": "{priority}"}',
    )
    events, _ = _run(spec)
    expected = list(islice(priority_sequence(spec), 200))
    assert [e.data["priority"] for e in _by_i(events)] == expected  # exact, request by request
    counts = Counter(expected)
    assert counts == Counter(e.data["priority"] for e in events)
    assert 0.12 < counts["premium"] / 200 < 0.28
    assert summarize(events).priorities == dict(sorted(counts.items()))
    for got in received:  # the header and the body template both carried it
        assert json.loads(str(got["body"]))["tier"] == got["priority"] == expected[int(str(got["i"]))]
    assert list(islice(priority_sequence(spec.model_copy(update={"seed": 8})), 200)) != expected


def test_errors_are_counted_per_status(server: str) -> None:
    spec = _spec(f"{server}/flaky", method="POST", rate=100, duration="0.6s", body='{"i": {i}}')
    events, _ = _run(spec)
    assert sorted(e.get_int("i") or 0 for e in events if e.data["status"] == 503) == list(range(0, 60, 3))
    assert error_rate(events) == pytest.approx(20 / 60)
    assert summarize(events).statuses == {"200": 40, "503": 20}


def test_timeout_is_recorded_with_latency_from_the_scheduled_time(server: str) -> None:
    spec = _spec(f"{server}/slow?s=1.5", rate=10, duration="0.3s", timeout="0.2s")
    events, history = _run(spec)
    assert len(events) == 3
    for e in events:
        latency = e.data["latency_s"]
        assert e.data["status"] == "timeout" and e.data["backend"] is None
        assert isinstance(latency, float) and 0.2 <= latency < 1.0
        assert e.ts_ns - (e.get_int("scheduled_ns") or 0) == pytest.approx(latency * 1e9, abs=1e6)
    assert history.of(LOAD_END)[0].data["timeouts"] == 3


def test_requests_beyond_max_in_flight_are_dropped_not_delayed(server: str) -> None:
    spec = _spec(f"{server}/slow?s=1", rate=50, duration="0.4s", timeout="5s", max_in_flight=2)
    events = _by_i(_run(spec)[0])
    assert len(events) == 20  # the schedule did not wait for the slow server
    assert [e.data["status"] for e in events[:2]] == [200, 200]
    assert {e.data["status"] for e in events[2:]} == {"dropped_client"}
    assert all(e.data["latency_s"] is None and e.data["send_lag_s"] is None for e in events[2:])
    first, last = (e.get_int("scheduled_ns") or 0 for e in (events[0], events[-1]))
    assert (last - first) / 1e9 == pytest.approx(19 / 50, abs=1e-6)  # send times are the schedule's, exactly


def test_connection_refused_is_an_error_event() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    events, _ = _run(_spec(f"http://127.0.0.1:{port}/", rate=20, duration="0.2s"))
    assert len(events) == 4 and {e.data["status"] for e in events} == {"error"}
    assert all("Connect" in str(e.data["error"]) or "refused" in str(e.data["error"]) for e in events)


def test_body_file_is_cycled_and_connections_are_reused(
    server: str, tmp_path: Path, received: list[dict[str, object]]
) -> None:
    bodies = tmp_path / "bodies.txt"
    bodies.write_text('{"i": {i}, "n": "a"}\n\n{"i": {i}, "n": "b"}\n{"i": {i}, "n": "c"}\n')
    spec = _spec(f"{server}/plain", method="POST", rate=50, duration="0.2s", body={"file": str(bodies)})
    _, history = _run(spec)
    assert [json.loads(str(r["body"]))["n"] for r in sorted(received, key=lambda r: int(str(r["i"])))] == list(
        "abca" + "bcab" + "ca"
    )
    connections = history.of(LOAD_END)[0].data["connections"]
    assert isinstance(connections, int) and 1 <= connections <= 5  # keep-alive: ten requests, reused (1 when idle)


def test_stop_drains_or_cancels_and_process_mode_streams_events(server: str) -> None:
    run = LoadRun(_spec(f"{server}/plain", rate=50, duration="30s"), isolation="process").start()
    time.sleep(0.5)
    totals = run.stop()
    events = run.poll_events()
    requests = [e for e in events if e.kind == LOAD_REQUEST]
    assert totals is not None and totals["stopped_early"] is True
    assert 5 <= len(requests) == totals["scheduled"] < 200 and {e.data["status"] for e in requests} == {200}
    assert [e.kind for e in events][0] == LOAD_START and events[-1].kind == LOAD_END
    assert run.cpu_seconds() is not None and run.poll_events() == []

    for isolation in ("thread", "process"):
        slow = _spec(f"{server}/slow?s=2", rate=20, duration="30s", timeout="10s")
        run = LoadRun(slow, isolation=isolation).start()  # type: ignore[arg-type]
        time.sleep(0.3)
        run.stop(drain=False)
        statuses = [e.data["status"] for e in run.poll_events() if e.kind == LOAD_REQUEST]
        assert statuses and set(statuses) == {"cancelled"}, isolation


def test_cli_prints_a_summary(server: str) -> None:
    argv = [sys.executable, "-m", "chaos.load", "--url", f"{server}/plain", "--rate", "50", "--duration", "0.4s"]
    out = subprocess.run(
        [*argv, "--json", "--served-by-header", "X-Backend"], capture_output=True, text=True, cwd=ROOT, timeout=30
    )
    assert out.returncode == 0, out.stderr
    stats = json.loads(out.stdout)["stats"]
    assert stats["scheduled"] == stats["ok"] == 20 and set(stats["backends"]) <= {"b0", "b1", "b2"}
    assert sum(stats["backends"].values()) == pytest.approx(1.0)
    text = subprocess.run([*argv, "--window", "0.2s"], capture_output=True, text=True, cwd=ROOT, timeout=30)
    assert "achieved" in text.stdout and "CPU s/s" in text.stdout
    bad = subprocess.run([*argv, "--burst", "1s:2s:5"], capture_output=True, text=True, cwd=ROOT, timeout=30)
    assert bad.returncode == 2 and "shorter than its period" in bad.stderr


# -- summaries over hand-made events (pure)


def _req(
    t_ms: int, latency_ms: float | None, status: int | str, backend: str | None = None, degraded: bool | None = None
) -> Event:
    scheduled = 10**12 + t_ms * 10**6
    return Event(
        ts_ns=scheduled + int((latency_ms or 0) * 1e6),
        kind=LOAD_REQUEST,
        source="load",
        data={
            "i": t_ms,
            "scheduled_ns": scheduled,
            "latency_s": None if latency_ms is None else latency_ms / 1000,
            "status": status,
            "backend": backend,
            "degraded": degraded,
            "priority": "free",
            "send_lag_s": 0.0,
        },
    )


def test_summary_functions_on_hand_made_events() -> None:
    # 0-1 s: 10 requests all ok on a/b; 1-2 s: 10 requests, 4 failing in four different ways.
    first = [_req(t, 10 + t / 100, 200, "a" if t < 600 else "b", t == 0) for t in range(0, 1000, 100)]
    second = [_req(1000 + t, 20.0, 200, "b", False) for t in range(0, 600, 100)]
    second += [
        _req(1600, 100.0, 503, "b"),
        _req(1700, 500.0, "timeout"),
        _req(1800, 3.0, "error"),
        _req(1900, None, "dropped_client"),
    ]
    events = [Event(ts_ns=1, kind="runner.start"), *reversed(first + second)]  # any order, other kinds ignored

    assert (
        percentile([3.0, 1.0, 2.0, 4.0], 50) == 2.0 and percentile([1.0, 2.0], 99) == 2.0 and percentile([], 50) is None
    )
    assert error_rate(events) == pytest.approx(4 / 20)
    assert achieved_rate(events) == pytest.approx(17 / 2.0)  # answered (incl. the 503) over 20 sends 100 ms apart
    assert latency_quantile(events, 99) == pytest.approx(0.5)  # the timeout counts, as a lower bound
    assert latency_quantile(events, 99, include_timeouts=False) == pytest.approx(0.1)
    assert backend_shares(events) == pytest.approx({"b": 11 / 17, "a": 6 / 17})

    w1, w2 = windows(events, 1.0)
    assert (w1.scheduled, w1.ok, w1.error_rate, w1.achieved_rate) == (10, 10, 0.0, pytest.approx(10.0))
    assert (
        w1.p50_s == pytest.approx(0.014)
        and w1.p99_s == pytest.approx(0.019)
        and w1.degraded_share == pytest.approx(0.1)
    )
    assert (w2.scheduled, w2.ok, w2.responded, w2.error_rate) == (10, 6, 7, pytest.approx(0.4))
    assert (w2.timeouts, w2.errors, w2.dropped_client) == (1, 1, 1) and w2.statuses["503"] == 1
    assert w2.backends == {"b": 1.0} and w2.p99_s == pytest.approx(0.5)
    total = summarize(events)
    assert (total.scheduled, total.ok, total.offered_rate) == (20, 16, pytest.approx(10.0))
    assert summarize(events, start_ns=10**12 + 10**9, end_ns=10**12 + 2 * 10**9) == w2
    assert windows([], 1.0) == [] and summarize([]).scheduled == 0

    # With its load.start the run's own bounds apply: 3 s from start_ns, so the rates are per 3 s.
    start = Event(ts_ns=10**12, kind=LOAD_START, source="load", data={"start_ns": 10**12, "duration_s": 3.0})
    assert run_bounds([start, *events]) == (10**12, 10**12 + 3 * 10**9)
    assert [w.scheduled for w in windows([start, *events], 1.0)] == [10, 10, 0]
    assert summarize([start, *events]).offered_rate == pytest.approx(20 / 3)
    assert achieved_rate([start, *events]) == pytest.approx(17 / 3)
    stopped = Event(ts_ns=2 * 10**12, kind=LOAD_END, source="load", data={"stopped_early": True})
    assert run_bounds([start, stopped]) is None and run_bounds([start, start]) is None
    assert run_bounds([start], source="other") is None


def test_codec_paths_truthiness_and_start_failures(tmp_path: Path) -> None:
    from chaos.load.codec import MISSING, lookup, truthy

    doc = {"choices": [{"id": "x"}, {"id": "y"}], "meta": {"backend": None}}
    assert lookup(doc, "choices.-1.id") == "y" and lookup(doc, "$.choices.0.id") == "x"
    assert (
        lookup(doc, "meta.backend") is None
        and lookup(doc, "meta.nope") is MISSING
        and lookup(doc, "choices.5") is MISSING
    )
    assert [truthy(v) for v in ("yes", "No", " 0 ", "", 1, 0, [], True)] == [
        True,
        False,
        False,
        False,
        True,
        False,
        False,
        True,
    ]
    missing = _spec("http://127.0.0.1:9/", rate=10, duration="1s", body={"file": str(tmp_path / "absent.txt")})
    with pytest.raises(FileNotFoundError):
        LoadRun(missing, isolation="thread").start()
    with pytest.raises(RuntimeError, match="exited with 1"):
        LoadRun(missing, isolation="process").start()


@pytest.mark.parametrize("server", ["refusing", "never answering"])
def test_the_load_generator_dies_with_a_sigkilled_harness(server: str) -> None:
    """A harness stand-in starts a process-isolated load (a minute of requests) and is SIGKILLed: its load
    generator must stop too (it used to go on sending for its whole duration, into the next run's fleet). Behind
    a server that never answers (a frozen one), requests are in flight when the harness dies: a drain would wait
    for them (it did, with SIGTERM as the parent-death signal: found by scripts/kill_trials.py)."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)  # accepts connections (the kernel's backlog), never reads or answers
    port = silent.getsockname()[1] if server == "never answering" else 9
    harness = (
        "import sys, time\n"
        "from chaos.load.run import LoadRun\n"
        "from chaos.spec.load import LoadSpec\n"
        f"run = LoadRun(LoadSpec(url='http://127.0.0.1:{port}/', rate=20, duration=60, timeout=50)).start()\n"
        "print(run._proc.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", harness], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        if server == "never answering":
            time.sleep(1.0)  # requests in flight
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert process_state(child) not in (None, "Z"), "the load generator never ran"
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        assert wait_for(lambda: process_state(child) in (None, "Z"), 10), "the load generator outlived its harness"
    finally:
        parent.kill()
        parent.wait(timeout=10)
        silent.close()
