"""How many streams per second the load generator reads while recording every token, and what a token costs it.

Three measurements, each through :class:`chaos.load.LoadRun` in process mode (the harness's real path: the
generator in its own process, its events read back into an in-memory History):

1. Overhead per token: a fast streaming endpoint (asyncio, in a SEPARATE process, so the CPU measured is the
   generator's own) answers every request with N SSE token events one ``--token-ms`` apart, chunked, then
   ``data: [DONE]``. At a fixed rate, streams of 1 and of 33 tokens: the generator's CPU seconds (its loop
   plus the harness-side reader thread) over tokens received, and the marginal CPU of one more token.
2. Ceiling: 32-token streams at rates raised until a rate is not sustained: every stream ``complete``, the
   achieved rate >= 99 % of the offered one, the p99 send lag <= 10 ms (a rate that fails is retried once:
   the machine is shared). Streams/s and tokens/s of the best sustained rate.
3. The reference: 50 streams/s for ``--seconds`` against ``model_server --model lm --token-delay 0.02
   --max-tokens 16`` (a real torch token model, one forward per token): TTFT and gap percentiles as recorded.

Run: ``.venv/bin/python benchmarks/stream_load.py [--seconds 10] [--json]``; ``--json`` prints one JSON object
of the figures as the last line.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from shared import Requests, json_last, parser, process_cpu_seconds, serve  # noqa: E402

from chaos.cluster.ports import free_port  # noqa: E402
from chaos.history.timeline import History  # noqa: E402
from chaos.load import LoadRun, LoadSpec, percentile  # noqa: E402
from chaos.load.stream_stats import stream_stats  # noqa: E402

BODY = '{"messages": [{"role": "user", "content": "question {i}"}], "stream": true}'
RAMP = (100, 200, 400, 800, 1200, 1600, 2400, 3200)


# -- the endpoint (runs in its own process: `stream_load.py --serve TOKEN_MS`)
class _Streams(Requests):
    delay = 0.001

    def answer(self, head: bytes) -> None:
        target = head.split(b" ", 2)[1]
        n = int(target.rsplit(b"n=", 1)[1]) if b"n=" in target else 32
        write = self.transport.write
        write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        loop = asyncio.get_running_loop()
        for k in range(n):
            frame = b'data: {"backend":"b0","choices":[{"index":0,"delta":{"content":"t%d "}}]}\n\n' % k
            loop.call_later(k * self.delay, write, b"%x\r\n%s\r\n" % (len(frame), frame))
        done = b"data: [DONE]\n\n"
        loop.call_later(max(0, n - 1) * self.delay, write, b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))


def _num(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) else 0.0


def measure(
    url: str, rate: float, seconds: float, server_pid: int | None = None, timeout: float = 10.0
) -> dict[str, Any]:
    spec = LoadSpec.model_validate(
        {"url": url, "method": "POST", "rate": rate, "duration": seconds, "body": BODY, "stream": "sse"}
        | {"served_by": {"json": "backend"}, "timeout": timeout, "max_in_flight": 4096}
    )
    history = History()
    server0 = process_cpu_seconds(server_pid) if server_pid else 0.0
    run = LoadRun(spec, history=history, isolation="process")
    run.start()
    run.wait()
    server_cpu = process_cpu_seconds(server_pid) - server0 if server_pid else 0.0
    totals = run.totals or {}
    wall = _num(totals.get("wall_s")) or seconds
    cpu = run.cpu_seconds() or 0.0
    s = stream_stats(history)
    lags = [_num(e.data.get("send_lag_s")) for e in history if e.kind == "load.request"]
    lags = [lag for lag in lags if lag]
    scheduled = int(_num(totals.get("scheduled")))
    complete = s.ended.get("complete", 0)
    achieved = complete / seconds
    p99_lag = percentile(lags, 99) or 0.0
    return {
        "rate": rate,
        "streams": scheduled,
        "complete": complete,
        "achieved_streams_s": achieved,
        "tokens": s.tokens,
        "tokens_s": s.tokens / seconds,
        "cpu_s": cpu,
        "cpu_per_s": cpu / wall,
        "cpu_us_per_token": 1e6 * cpu / max(1, s.tokens),
        "server_cpu_per_s": server_cpu / wall,
        "p99_send_lag_ms": 1000 * p99_lag,
        "ttft_p50_ms": 1000 * (s.ttft_p50_s or 0.0),
        "ttft_p99_ms": 1000 * (s.ttft_p99_s or 0.0),
        "gap_p50_ms": 1000 * (s.gap_p50_s or 0.0),
        "gap_p99_ms": 1000 * (s.gap_p99_s or 0.0),
        "sustained": complete == scheduled and achieved >= 0.99 * rate and p99_lag <= 0.010,
    }


def _row(r: dict[str, Any]) -> str:
    return (
        f"{r['rate']:6.0f}/s  complete {r['complete']:6d}/{r['streams']:<6d} {r['achieved_streams_s']:7.1f} streams/s "
        f"{r['tokens_s']:8.0f} tokens/s  generator {r['cpu_per_s']:.3f} CPU s/s ({r['cpu_us_per_token']:.1f} us/token)  "
        f"endpoint {r['server_cpu_per_s']:.3f} CPU s/s  p99 send lag {r['p99_send_lag_ms']:.1f} ms  "
        f"ttft p50/p99 {r['ttft_p50_ms']:.1f}/{r['ttft_p99_ms']:.1f} ms  gap p50/p99 {r['gap_p50_ms']:.2f}/"
        f"{r['gap_p99_ms']:.2f} ms  {'sustained' if r['sustained'] else 'NOT sustained'}"
    )


def fast_endpoint(url: str, pid: int, seconds: float) -> dict[str, float]:
    print("-- overhead per token: 200 streams/s, 1 and 33 tokens a stream, 1 ms between tokens")
    one = measure(url + "/s?n=1", 200, seconds, pid)
    print(_row(one), flush=True)
    many = measure(url + "/s?n=33", 200, seconds, pid)
    print(_row(many), flush=True)
    marginal = 1e6 * (many["cpu_s"] - one["cpu_s"]) / max(1, many["tokens"] - one["tokens"])
    print(f"generator CPU per token: {many['cpu_us_per_token']:.1f} us (all in), {marginal:.1f} us marginal")
    print("-- ceiling: 32-token streams, 1 ms between tokens, rate raised until not sustained")
    best: dict[str, Any] | None = None
    for rate in RAMP:
        r = measure(url + "/s?n=32", rate, max(3.0, seconds / 2), pid)
        print(_row(r), flush=True)
        if not r["sustained"]:
            r = measure(url + "/s?n=32", rate, max(3.0, seconds / 2), pid)
            print(_row(r) + "  (retry)", flush=True)
        if not r["sustained"]:
            break
        best = r
    ceiling = best or {"achieved_streams_s": 0.0, "tokens_s": 0.0, "rate": 0}
    print(f"ceiling: {ceiling['rate']:.0f} streams/s sustained ({ceiling['tokens_s']:.0f} tokens/s)")
    return {
        "cpu_us_per_token": many["cpu_us_per_token"],
        "cpu_us_per_token_marginal": marginal,
        "ceiling_streams_s": float(ceiling["rate"]),
        "ceiling_tokens_s": float(ceiling["tokens_s"]),
    }


def reference(seconds: float) -> dict[str, float]:
    print("-- 50 streams/s against the reference streaming server (torch token model, 20 ms a token, 16 tokens)")
    with tempfile.TemporaryDirectory() as run_dir:
        port = free_port()
        argv = [sys.executable, "-m", "chaos.reference.serving.model_server", "--replica", "lm", "--model", "lm"]
        argv += ["--port", str(port), "--run-dir", run_dir, "--token-delay", "0.02", "--max-tokens", "16"]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        server = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)
        try:
            assert server.stdout is not None and "listening" in server.stdout.readline()
            r = measure(f"http://127.0.0.1:{port}/v1/chat/completions", 50, seconds, server.pid)
        finally:
            server.kill()
            server.wait()
    print(_row(r), flush=True)
    return {
        f"reference_{k}": float(r[k])
        for k in ("achieved_streams_s", "ttft_p50_ms", "ttft_p99_ms", "gap_p50_ms", "gap_p99_ms", "cpu_per_s")
    } | {"reference_complete_share": r["complete"] / max(1, r["streams"])}


def main(seconds: float = 10.0) -> dict[str, float]:
    server = subprocess.Popen([sys.executable, __file__, "--serve", "1"], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        url = f"http://127.0.0.1:{int(server.stdout.readline())}"
        figures = fast_endpoint(url, server.pid, min(seconds, 5.0))
    finally:
        server.kill()
        server.wait()
    return figures | reference(seconds)


if __name__ == "__main__":
    cli = parser(__doc__)
    cli.add_argument("--serve", type=float, metavar="TOKEN_MS", help=argparse.SUPPRESS)
    cli.add_argument("--seconds", type=float, default=10.0, help="length of the reference run (the others: up to 5 s)")
    cli.add_argument("--json", action="store_true", help="print one JSON object of the figures as the last line")
    args = cli.parse_args()
    if args.serve is not None:
        _Streams.delay = args.serve / 1000
        serve(_Streams, backlog=2048)
    else:
        json_last(main(args.seconds), args.json)
