"""``python -m chaos.load``: run one open-loop load against any HTTP endpoint and print a summary.

Examples::

    python -m chaos.load --url http://127.0.0.1:8000/ --rate 500 --duration 10s
    python -m chaos.load --url http://gw:8000/v1/generate --method POST --rate 200 --duration 1m \\
        --body '{"prompt": "hello {i}"}' --priority premium=0.2 --priority free=0.8 \\
        --served-by-json meta.backend --degraded-header X-Degraded --step 30s:800 --window 5s
    python -m chaos.load --spec load.yaml --rate 1000      # a YAML LoadSpec, flags override its keys

``--events FILE`` also writes every event as a JSONL history. ``--emit`` (used by ``LoadRun`` in process
mode) streams the events as JSON lines on stdout instead of printing a summary. SIGTERM stops sending and
drains in-flight requests; SIGINT (Ctrl-C) stops at once. Exit status: 0; 1 when the load could not
start (unreadable body file, unknown host); 2 for a bad spec.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import signal
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import yaml
from pydantic import JsonValue, ValidationError

from chaos.history.timeline import Event, History
from chaos.load.engine import LOAD_REQUEST, LoadEngine
from chaos.load.stream_stats import stream_stats
from chaos.load.summary import LoadStats, summarize, windows
from chaos.spec.load import LoadSpec
from chaos.spec.units import format_duration, parse_duration


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m chaos.load", description="Open-loop HTTP load generator.")
    p.add_argument("--spec", type=Path, help="YAML file holding a LoadSpec (flags override its keys)")
    p.add_argument("--spec-json", help=argparse.SUPPRESS)
    p.add_argument("--url")
    p.add_argument("--method")
    p.add_argument("--rate", type=float, help="requests per second")
    p.add_argument("--duration", help="e.g. 10s, 2m")
    p.add_argument("--step", action="append", metavar="AT:RATE", help="from AT on send RATE/s (repeatable)")
    p.add_argument("--burst", metavar="EVERY:DURATION:RATE", help="e.g. 10s:1s:2000")
    p.add_argument("--arrivals", choices=["uniform", "poisson"])
    p.add_argument("--body", help="body template; {i} and {priority} are replaced")
    p.add_argument("--body-file", type=Path, help="bodies, one a line, cycled")
    p.add_argument("-H", "--header", action="append", metavar="'NAME: VALUE'", help="request header (repeatable)")
    p.add_argument("--priority", action="append", metavar="NAME=WEIGHT", help="priority weight (repeatable)")
    p.add_argument("--priority-header", help="request header carrying the priority ('' for none)")
    p.add_argument("--seed", type=int)
    p.add_argument("--timeout", help="per request, from its scheduled send time (default 10s)")
    p.add_argument("--served-by-header", metavar="NAME", help="response header naming the backend")
    p.add_argument("--served-by-json", metavar="PATH", help="dotted JSON path naming the backend")
    p.add_argument("--degraded-header", metavar="NAME[=VALUE]", help="response header marking degraded")
    p.add_argument("--degraded-json", metavar="PATH[=VALUE]", help="JSON field marking degraded")
    p.add_argument("--max-in-flight", type=int)
    p.add_argument("--insecure", action="store_true", help="do not verify https certificates")
    p.add_argument("--stream", choices=["sse", "chunked"], help="answers are streams: record tokens, TTFT, gaps")
    p.add_argument("--sessions", type=int, help="request i sends session id s{i %% N} (header X-Session)")
    p.add_argument("--events", type=Path, help="also write every event to this JSONL file")
    p.add_argument("--window", help="also print stats per window of this length (e.g. 1s)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--source", default="load", help="event source name (default: load)")
    p.add_argument("--emit", action="store_true", help=argparse.SUPPRESS)
    return p


def _json_or_text(text: str) -> JsonValue:
    try:
        value: JsonValue = json.loads(text)
        return value
    except ValueError:
        return text


def spec_from_args(args: argparse.Namespace) -> LoadSpec:
    """The LoadSpec the flags describe (on top of --spec / --spec-json when given)."""
    raw: dict[str, object] = {}
    if args.spec_json:
        raw = json.loads(args.spec_json)
    elif args.spec:
        loaded = yaml.safe_load(args.spec.read_text(encoding="utf-8"))
        if not isinstance(loaded, dict):
            raise ValueError(f"{args.spec} does not hold a mapping")
        raw = loaded
    simple = {
        "url": args.url,
        "method": args.method,
        "rate": args.rate,
        "duration": args.duration,
        "arrivals": args.arrivals,
        "body": args.body,
        "seed": args.seed,
        "timeout": args.timeout,
        "max_in_flight": args.max_in_flight,
        "stream": args.stream,
        "sessions": args.sessions,
    }
    raw.update({k: v for k, v in simple.items() if v is not None})
    if args.body_file is not None:
        raw["body"] = {"file": str(args.body_file)}
    if args.step:
        steps = [s.split(":", 1) for s in args.step]
        raw["pattern"] = {"step": [{"at": at, "rate": float(rate)} for at, rate in steps]}
    if args.burst:
        every, duration, rate = args.burst.split(":")
        raw["pattern"] = {"burst": {"every": every, "duration": duration, "rate": float(rate)}}
    if args.header:
        headers = dict(raw.get("headers") or {})  # type: ignore[call-overload]
        for item in args.header:
            name, sep, value = item.partition(":")
            if not sep:
                raise ValueError(f"--header {item!r}: write 'Name: value'")
            headers[name.strip()] = value.strip()
        raw["headers"] = headers
    if args.priority:
        raw["priorities"] = {n.strip(): float(w) for n, _, w in (p.partition("=") for p in args.priority)}
    if args.priority_header is not None:
        raw["priority_header"] = args.priority_header or None
    if args.served_by_header:
        raw["served_by"] = {"header": args.served_by_header}
    if args.served_by_json:
        raw["served_by"] = {"json": args.served_by_json}
    if args.degraded_header:
        name, sep, value = args.degraded_header.partition("=")
        raw["degraded"] = {"header": name, **({"value": value} if sep else {})}
    if args.degraded_json:
        path, sep, value = args.degraded_json.partition("=")
        raw["degraded"] = {"json": path, **({"value": _json_or_text(value)} if sep else {})}
    if args.insecure:
        raw["verify_tls"] = False
    return LoadSpec.model_validate(raw)


async def run_load(
    spec: LoadSpec, emit: Callable[[Event], None], *, source: str = "load", flush: Callable[[], None] | None = None
) -> dict[str, JsonValue]:
    """Run ``spec`` on this loop; SIGTERM drains, SIGINT stops at once. ``flush`` is called every 50 ms."""
    engine = LoadEngine(spec, emit, source=source)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, engine.stop, True)
    loop.add_signal_handler(signal.SIGINT, engine.stop, False)
    ticker: asyncio.TimerHandle | None = None
    if flush is not None:
        flusher = flush

        def tick() -> None:
            nonlocal ticker
            flusher()
            ticker = loop.call_later(0.05, tick)

        ticker = loop.call_later(0.05, tick)
    try:
        return await engine.run()
    finally:
        if ticker is not None:
            ticker.cancel()
        loop.remove_signal_handler(signal.SIGTERM)
        loop.remove_signal_handler(signal.SIGINT)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}ms"


def format_stats(spec: LoadSpec, stats: LoadStats, totals: dict[str, JsonValue]) -> str:
    """A human summary of one run."""
    pattern = spec.pattern if isinstance(spec.pattern, str) else next(iter(spec.pattern.model_dump()))
    wall = totals.get("wall_s")
    cpu = totals.get("cpu_s")
    lines = [
        f"load: {spec.method} {spec.url} at {spec.rate:g}/s ({pattern}, {spec.arrivals}) for {format_duration(spec.duration)}",
        f"scheduled {stats.scheduled}  responded {stats.responded}  ok {stats.ok}  timeouts {stats.timeouts}  "
        f"errors {stats.errors}  dropped_client {stats.dropped_client}  cancelled {stats.cancelled}",
        f"rate: offered {stats.offered_rate or 0:.1f}/s  achieved {stats.achieved_rate or 0:.1f}/s  "
        f"error rate {100 * (stats.error_rate or 0):.2f}%",
        f"latency from scheduled send: p50 {_ms(stats.p50_s)}  p90 {_ms(stats.p90_s)}  p99 {_ms(stats.p99_s)}  "
        f"max {_ms(stats.max_s)}",
        "status: " + ", ".join(f"{k} {v}" for k, v in stats.statuses.items()),
    ]
    if stats.backends:
        lines.append("backends: " + ", ".join(f"{k} {100 * v:.1f}%" for k, v in stats.backends.items()))
    if stats.degraded_share is not None:
        lines.append(f"degraded: {100 * stats.degraded_share:.2f}% of answers")
    if stats.priorities:
        lines.append("priorities: " + ", ".join(f"{k} {v}" for k, v in stats.priorities.items()))
    if isinstance(wall, (int, float)) and isinstance(cpu, (int, float)) and wall > 0:
        lines.append(
            f"generator: {cpu:.2f} CPU s over {wall:.2f} s ({cpu / wall:.2f} CPU s/s), "
            f"max send lag {_ms(stats.max_send_lag_s)}, {totals.get('connections')} connections"
        )
    return "\n".join(lines)


def _window_table(history: History, width: str) -> str:
    rows = ["window     sched  ok     err%    p50       p99       backends"]
    found = windows(history, parse_duration(width))
    for w in found:
        offset = (w.start_ns - found[0].start_ns) / 1e9
        shares = " ".join(f"{k}:{100 * v:.0f}%" for k, v in w.backends.items())
        rows.append(
            f"{offset:7.2f}s  {w.scheduled:5d}  {w.ok:5d}  {100 * (w.error_rate or 0):5.1f}%  "
            f"{_ms(w.p50_s):>8}  {_ms(w.p99_s):>8}  {shares}"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        spec = spec_from_args(args)
    except (ValidationError, ValueError, OSError) as exc:
        print(f"bad load spec: {exc}", file=sys.stderr)
        return 2
    # This process is ours: move everything imported so far out of the collector's reach, so a full
    # collection scans only what the run creates (imports alone make such pauses tens of ms, which would
    # read as request latency).
    gc.freeze()
    if args.emit:  # for LoadRun(isolation="process"): events as JSON lines on stdout, nothing else
        out = sys.stdout.buffer

        def emit(event: Event) -> None:
            out.write(event.model_dump_json().encode() + b"\n")

        try:
            totals = asyncio.run(run_load(spec, emit, source=args.source, flush=out.flush))
        except OSError as exc:  # a body file or the host name: nothing was sent
            print(f"load failed: {exc}", file=sys.stderr)
            return 1
        out.flush()
        return 0
    history = History(args.events)

    def record(event: Event) -> None:
        history.append(event)

    try:
        totals = asyncio.run(run_load(spec, record, source=args.source))
    except OSError as exc:  # a body file or the host name: nothing was sent
        print(f"load failed: {exc}", file=sys.stderr)
        return 1
    finally:
        history.close()
    stats = summarize(history)
    problems = Counter(str(e.data["error"]) for e in history if e.kind == LOAD_REQUEST and "error" in e.data)
    if args.json:
        print(json.dumps({"stats": stats.model_dump(mode="json"), "totals": totals}, indent=2))
    else:
        print(format_stats(spec, stats, totals))
        if spec.stream is not None:
            s = stream_stats(history)
            print(
                f"streams: {', '.join(f'{k} {v}' for k, v in sorted(s.ended.items()))}  resumed {s.resumed}  "
                f"tokens {s.tokens}  ttft p50 {_ms(s.ttft_p50_s)} p99 {_ms(s.ttft_p99_s)}  "
                f"gap p50 {_ms(s.gap_p50_s)} p99 {_ms(s.gap_p99_s)} max {_ms(s.gap_max_s)}"
            )
        for message, count in problems.most_common(3):
            print(f"error x{count}: {message}")
        if args.window:
            print(_window_table(history, args.window))
    return 0


if __name__ == "__main__":
    sys.exit(main())
