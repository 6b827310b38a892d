"""The reference serving stack under load: what it sustains, what it costs, and how fast it fails over.

Starts the stack with its default settings except shortened probes (interval 0.5 s, timeout 0.3 s, 3 failures
to mark down, 2 successes to mark up), drives a constant open-loop load through the gateway at each rate for
a few seconds, and reports the ok share, p50/p99 latency and the CPU seconds per second of the gateway and the
primary model server (from /proc). Then, at 200 req/s, SIGKILLs the primary and reports, from the history:
the time to the first request served by the fallback, to ``detect.backend_down``, and back to the primary.

Ratios within one run are what we track (p99 at the highest rate over p99 at the lowest; failover time over
the probe-derived bound), because the absolute numbers move with this shared 2-core machine's load.

Run: ``make bench`` (section "serving stack") or ``.venv/bin/python benchmarks/serving_stack.py [--seconds 5]
[--json]``; ``--json`` prints one JSON object of the figures as the last line.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from chaos.cluster.local import LocalTransport  # noqa: E402
from chaos.history.timeline import Event, History  # noqa: E402
from chaos.load import LoadRun, LoadSpec, summarize  # noqa: E402
from chaos.spec.serving import ServingTarget  # noqa: E402
from chaos.targets.serving_stack import ServingJob  # noqa: E402

RATES = (100, 300, 600)
_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime + stime


def _spec(url: str, rate: float, seconds: float) -> LoadSpec:
    return LoadSpec.model_validate(
        {
            "url": url + "/v1/predict",
            "method": "POST",
            "rate": rate,
            "duration": seconds,
            "timeout": 2.0,
            "body": '{"prompt": "request {i}"}',
            "served_by": {"header": "X-Backend"},
        }
    )


def _wait_ready(job: ServingJob, history: History) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for event in job.poll_events():
            history.append(event)
            if event.kind == job.ready_event:
                return
        time.sleep(0.05)
    raise TimeoutError("the serving stack did not become ready within 60 s")


def _first(events: list[Event], kind: str, after_ns: int, **data: object) -> Event | None:
    for event in events:
        if event.kind == kind and event.ts_ns >= after_ns and all(event.data.get(k) == v for k, v in data.items()):
            return event
    return None


def main(seconds: float = 5.0) -> dict[str, float | None]:
    """Run the load ladder and the failover; return the figures ``--json`` prints (seconds; None: never)."""
    figures: dict[str, float | None] = {}
    spec = ServingTarget.model_validate(
        {
            "type": "serving",
            "request_timeout": "500ms",
            "probes": {"interval": "500ms", "timeout": "300ms", "failure_threshold": 3, "success_threshold": 2},
            "primary": {"model": "primary", "restart_delay": "1s"},
        }
    )
    with tempfile.TemporaryDirectory(prefix="mlchaos-bench-serving-") as tmp:
        job = ServingJob(spec, LocalTransport(), Path(tmp), seed=1, extra_env={})
        history = History()
        t0 = time.monotonic()
        job.start()
        try:
            _wait_ready(job, history)
            print(f"stack ready in {time.monotonic() - t0:.1f} s")
            gateway_pid = next(iter(job.pids_for_replica("gateway")), None)
            [primary_pid] = job.pids_for_replica("primary")
            print(f"{'rate':>6} {'ok %':>7} {'p50 ms':>8} {'p99 ms':>8} {'gateway cpu/s':>14} {'primary cpu/s':>14}")
            p99s: dict[int, float] = {}
            for rate in RATES:
                g0 = _cpu_s(gateway_pid) if gateway_pid else 0.0
                p0 = _cpu_s(primary_pid)
                run_history = History()
                LoadRun(_spec(job.url, rate, seconds), history=run_history).start().wait(seconds + 15)
                g1 = _cpu_s(gateway_pid) if gateway_pid else 0.0
                p1 = _cpu_s(primary_pid)
                stats = summarize(run_history.events)
                p99s[rate] = stats.p99_s or 0.0
                ok = 100.0 * (1 - (stats.error_rate or 0.0))
                print(
                    f"{rate:>6} {ok:>7.2f} {1000 * (stats.p50_s or 0):>8.1f} {1000 * (stats.p99_s or 0):>8.1f}"
                    f" {(g1 - g0) / seconds:>14.2f} {(p1 - p0) / seconds:>14.2f}"
                )
            low, high = RATES[0], RATES[-1]
            if p99s[low] > 0:
                print(f"p99 at {high} req/s / p99 at {low} req/s: {p99s[high] / p99s[low]:.1f}x")
                figures["p99_ratio_high_over_low"] = p99s[high] / p99s[low]
            figures.update({f"p99_ms_{rate}": 1000 * p99 for rate, p99 in p99s.items()})

            # Failover: SIGKILL the primary under 200 req/s; read the times off the history.
            failover_history = History()
            load = LoadRun(_spec(job.url, 200, 12.0), history=failover_history).start()
            time.sleep(3.0)
            kill_ns = time.time_ns()
            os.kill(primary_pid, signal.SIGKILL)
            while load.running:
                for event in job.poll_events():
                    failover_history.append(event)
                time.sleep(0.05)
            for event in job.poll_events():
                failover_history.append(event)
            events = failover_history.events
            reqs = sorted(
                (e for e in events if e.kind == "load.request" and (e.get_int("scheduled_ns") or 0) >= kill_ns),
                key=lambda e: e.get_int("scheduled_ns") or 0,
            )
            first_fallback = next((e for e in reqs if e.data.get("backend") == "fallback"), None)
            down = _first(events, "detect.backend_down", kill_ns, backend="primary")
            up = _first(events, "serving.backend_up", kill_ns, backend="primary")
            errors = sum(1 for e in reqs if e.data.get("status") != 200)
            bound = spec.failover_bound()

            def since(ns: int | None) -> str:
                return "never" if ns is None else f"{(ns - kill_ns) / 1e9:.3f} s"

            def seconds_after(ns: int | None) -> float | None:
                return None if ns is None else (ns - kill_ns) / 1e9

            fallback_ns = first_fallback.get_int("scheduled_ns") if first_fallback is not None else None
            print(
                f"kill primary at 200 req/s: first fallback answer {since(fallback_ns)} (bound {bound:g} s),"
                f" backend_down {since(down.ts_ns if down else None)},"
                f" primary back {since(up.ts_ns if up else None)}, errors {errors}/{len(reqs)}"
            )
            figures.update(
                first_fallback_s=seconds_after(fallback_ns),
                failover_bound_s=bound,
                backend_down_s=seconds_after(down.ts_ns if down else None),
                primary_back_s=seconds_after(up.ts_ns if up else None),
                failover_errors=float(errors),
                failover_requests=float(len(reqs)),
            )
        finally:
            job.stop(grace=5)
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds of load per rate")
    parser.add_argument("--json", action="store_true", help="print one JSON object of the figures as the last line")
    args = parser.parse_args()
    figures = main(args.seconds)
    if args.json:
        print(json.dumps(figures, sort_keys=True))
