"""Benchmark: does the hang watch name the right rank, and how fast? (>= 100 injected hangs at random
ranks of a 4-rank job, three kinds mixed; goal >= 97.8% right culprit, the accuracy Aegis reports.)

Run: ``.venv/bin/python benchmarks/hang_culprit.py [--hangs 102] [--seed 0] [--hang-after 1.0] [--json]``
(``--overhead-only``: just the recorder's cost per collective, also part of the full run's summary: a 1-float
all-reduce on a 1-rank gloo group with and without the recorder).

The job is the user-style script ``tests/jobs/user_collectives.py`` (4 gloo ranks, the one-line agent: a
4096-float all-reduce on the world group and a 1-float all-reduce on a second group every step, a barrier every
10 steps), its ranks started the way a launcher starts them (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT), with
``CHAOS_FLIGHT_DIR`` set; the watcher is :class:`chaos.detect.hang_watch.HangWatch` polling every 0.1 s from this
process, as the harness does. The hangs, each at a rank drawn at random (seeded), kinds in a shuffled 1:1:1 mix:

- ``sigstop``: this process SIGSTOPs the rank's pid at whatever point it is (often inside a collective), and
  SIGCONTs it after ``--hold`` seconds (the ``freeze`` injector's mechanism);
- ``spin``: the rank's agent loops in Python for ``--hold`` seconds at a planned step (the ``spin`` injector);
- ``skip``: the rank's agent skips collective 0 or 1 (drawn) of a planned step (the ``skip_collective`` injector).

SIGSTOP and spin heal, so ONE long-running job takes all of them in turn (a hang every 30 steps); a skipped
collective leaves the ranks waiting in different collectives for good, so each skip gets a fresh job that is
killed once named (or after a timeout). A hang counts as named right when the first ``detect.hang`` after the
fault's start names exactly the hit rank; a hang with no ``detect.hang`` within ``--hold`` + 4 s counts as wrong.
Time to name: ``detect.hang`` time minus the fault's start (SIGSTOP sent / the spin's ``fault.applied`` / the
skip's ``fault.applied``); it includes ``--hang-after`` by construction. A ``detect.hang`` outside every fault
window is a false alarm. ``--json`` prints one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from chaos.detect.hang_watch import HangWatch  # noqa: E402
from chaos.history.timeline import Event  # noqa: E402
from chaos.injob.flight_recorder import ENV_FLIGHT_DIR  # noqa: E402
from chaos.plan.agent_plan import ENV_PLAN, InJobOp, write_plan  # noqa: E402

JOB = ROOT / "tests" / "jobs" / "user_collectives.py"
WORLD = 4
EVERY = 15  # steps between two hangs of the long job
FIRST = 20
KINDS = ("sigstop", "spin", "skip")


@dataclass
class Hang:
    kind: str
    rank: int
    step: int
    index: int = 0
    started_ns: int | None = None
    named: list[int] | None = None
    reason: str | None = None
    detected_ns: int | None = None

    @property
    def right(self) -> bool:
        return self.named == [self.rank]

    @property
    def latency_s(self) -> float | None:
        if self.started_ns is None or self.detected_ns is None:
            return None
        return (self.detected_ns - self.started_ns) / 1e9


class Job:
    """WORLD ranks of the user job with a plan, events and flight files in ``directory``."""

    def __init__(self, directory: Path, ops: list[InJobOp], steps: int) -> None:
        directory.mkdir(parents=True)
        self.directory = directory
        write_plan(directory / "plan.json", 0, ops)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        base = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "WORLD_SIZE": str(WORLD),
            ENV_FLIGHT_DIR: str(directory / "flight"),
            ENV_PLAN: str(directory / "plan.json"),
            "CHAOS_EVENTS": str(directory / "events.jsonl"),
            "CHAOS_RUN_DIR": str(directory),
            "STEPS": str(steps),
            "STEP_TIME": "0.02",
            "PYTHONPATH": str(ROOT),
            "OMP_NUM_THREADS": "1",
        }
        self.procs = [
            subprocess.Popen(
                [sys.executable, str(JOB)],
                env={**base, "RANK": str(r), "LOCAL_RANK": str(r)},
                stdout=subprocess.DEVNULL,
                stderr=open(directory / f"rank{r}.log", "wb"),  # noqa: SIM115
            )
            for r in range(WORLD)
        ]
        self.watch = HangWatch(directory / "flight", hang_after=HANG_AFTER, poll_s=0.1, listeners=[])

    def pid(self, rank: int) -> int:
        return self.procs[rank].pid

    def top_step(self) -> int:
        views = self.watch.views(time.time_ns())
        return min((v.state.step for v in views), default=0) if len(views) == WORLD else 0

    def applied_ns(self, op_id: str) -> int | None:
        try:
            lines = (self.directory / "events.jsonl").read_text().splitlines()
        except OSError:
            return None
        for line in lines:
            record = json.loads(line)
            if record["kind"] == "fault.applied" and record["data"].get("op") == op_id:
                return int(record["ts_ns"])
        return None

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                for signum in (signal.SIGCONT, signal.SIGKILL):
                    try:
                        proc.send_signal(signum)
                    except ProcessLookupError:
                        break
        for proc in self.procs:
            proc.wait(timeout=30)


HANG_AFTER = 1.0
BEGAN = time.monotonic()


def _note(hang: Hang, event: Event) -> None:
    listed = event.data.get("culprit_ranks")
    hang.named = sorted(r for r in listed if isinstance(r, int)) if isinstance(listed, list) else []
    hang.reason = event.get_str("reason")
    hang.detected_ns = event.ts_ns


def _wait_for(job: Job, until: float) -> list[Event]:
    """Poll the watch until the monotonic deadline or a detect.hang; the events seen."""
    seen: list[Event] = []
    while time.monotonic() < until:
        seen += job.watch.poll()
        if seen:
            return seen
        time.sleep(0.02)
    return seen


def run_long(workdir: Path, hangs: list[Hang], hold: float, log: bool) -> int:
    """SIGSTOP and spin hangs in turn in one job; returns the false alarms."""
    ops = [
        InJobOp(
            op_id=f"spin-{h.step}",
            fault="spin",
            injector="spin",
            params={"rank": h.rank},
            at_step=h.step,
            duration_s=hold,
        )
        for h in hangs
        if h.kind == "spin"
    ]
    last = max(h.step for h in hangs) + EVERY
    job = Job(workdir / "long", ops, last)
    false_alarms = 0
    try:
        for i, hang in enumerate(hangs):
            while job.top_step() < hang.step:  # healthy running between hangs: any detection is a false alarm
                false_alarms += len(job.watch.poll())
                if any(p.poll() is not None for p in job.procs):
                    raise RuntimeError(f"the long job exited early (see {job.directory})")
                time.sleep(0.01)
            if hang.kind == "sigstop":
                hang.started_ns = time.time_ns()
                os.kill(job.pid(hang.rank), signal.SIGSTOP)
            events = _wait_for(job, time.monotonic() + hold + 4.0)
            if hang.kind == "sigstop":
                os.kill(job.pid(hang.rank), signal.SIGCONT)
            else:
                hang.started_ns = job.applied_ns(f"spin-{hang.step}")
            if events:
                _note(hang, events[0])
                false_alarms += len(events) - 1
            if log:
                print(
                    f"{time.monotonic() - BEGAN:6.1f}s {i:3d} {hang.kind:7s} rank {hang.rank} step {hang.step}: named {hang.named} "
                    f"({hang.reason}) after {hang.latency_s}",
                    flush=True,
                )
    finally:
        job.stop()
    return false_alarms


def start_skip(workdir: Path, n: int, hang: Hang) -> Job:
    op = InJobOp(
        op_id="skip",
        fault="skip",
        injector="skip_collective",
        params={"rank": hang.rank, "index": hang.index},
        at_step=hang.step,
    )
    return Job(workdir / f"skip-{n}", [op], 10_000)


def run_skip(job: Job, hang: Hang, hold: float, log: bool, start_next: Callable[[], None]) -> None:
    """Judge one skip in its own job; the next job is started (``start_next``) once this one's skip has fired,
    so its start-up overlaps this job's hang (every rank of a hung job sleeps in a wait)."""
    try:
        deadline = time.monotonic() + 120.0
        while job.applied_ns("skip") is None and time.monotonic() < deadline:
            job.watch.poll()
            time.sleep(0.02)
        hang.started_ns = job.applied_ns("skip")
        start_next()
        events = _wait_for(job, time.monotonic() + hold + 4.0)
        if events:
            _note(hang, events[0])
    finally:
        job.stop()
    if log:
        print(
            f"{time.monotonic() - BEGAN:6.1f}s     skip    rank {hang.rank} index {hang.index}: named {hang.named} "
            f"({hang.reason}) after {hang.latency_s}",
            flush=True,
        )


def overhead(calls: int = 10000) -> dict[str, float]:
    """Per-collective cost of the recorder: a 1-float all-reduce on a 1-rank gloo group with the recorder
    installed vs without (medians of 7 interleaved rounds of ``calls`` calls each), in microseconds."""
    import torch
    import torch.distributed as dist

    from chaos.injob import flight_recorder

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    tensor = torch.ones(1)

    def one_round() -> float:
        began = time.perf_counter()
        for _ in range(calls):
            dist.all_reduce(tensor)
        return (time.perf_counter() - began) / calls * 1e6

    bare_rounds: list[float] = []
    recorded_rounds: list[float] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for _ in range(7):  # interleaved, so a busy machine slows both alike
                bare_rounds.append(one_round())
                flight_recorder.install(0, 1, tmp)
                try:
                    recorded_rounds.append(one_round())
                finally:
                    flight_recorder.uninstall()
    finally:
        dist.destroy_process_group()
    bare, recorded = statistics.median(bare_rounds), statistics.median(recorded_rounds)
    return {"bare_us": round(bare, 2), "recorded_us": round(recorded, 2), "added_us": round(recorded - bare, 2)}


def main() -> int:
    global HANG_AFTER
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hangs", type=int, default=102, help="hangs in all (a third of each kind)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hang-after", type=float, default=1.0, help="the watch's bound, seconds")
    parser.add_argument("--hold", type=float, default=2.5, help="seconds a SIGSTOP or a spin lasts")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--overhead-only", action="store_true", help="only the recorder's per-collective cost")
    args = parser.parse_args()
    HANG_AFTER = args.hang_after
    if args.overhead_only:
        print(json.dumps({"recorder": overhead()}))
        return 0
    rng = random.Random(args.seed)
    kinds = [KINDS[i % 3] for i in range(args.hangs)]
    rng.shuffle(kinds)
    healable = [k for k in kinds if k != "skip"]
    long_hangs = [Hang(k, rng.randrange(WORLD), FIRST + EVERY * i) for i, k in enumerate(healable)]
    skips = [Hang("skip", rng.randrange(WORLD), 5, rng.randrange(2)) for k in kinds if k == "skip"]
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mlchaos-hang-bench-") as tmp:
        false_alarms = run_long(Path(tmp), long_hangs, args.hold, not args.json)
        jobs: list[Job] = [start_skip(Path(tmp), 0, skips[0])] if skips else []
        try:
            for n, hang in enumerate(skips):

                def start_next(n: int = n) -> None:
                    if n + 1 < len(skips):
                        jobs.append(start_skip(Path(tmp), n + 1, skips[n + 1]))

                run_skip(jobs[n], hang, args.hold, not args.json, start_next)
        finally:
            for job in jobs:
                job.stop()
    wall = time.monotonic() - began
    cost = overhead()
    every = long_hangs + skips
    right = sum(h.right for h in every)
    latencies = [x for h in every if h.right and (x := h.latency_s) is not None]
    by_kind = {}
    for kind in KINDS:
        mine = [h for h in every if h.kind == kind]
        lat = [x for h in mine if h.right and (x := h.latency_s) is not None]
        by_kind[kind] = {
            "hangs": len(mine),
            "right": sum(h.right for h in mine),
            "median_s": round(statistics.median(lat), 3) if lat else None,
            "max_s": round(max(lat), 3) if lat else None,
            "reasons": dict(
                sorted({str(h.reason): sum(1 for x in mine if x.reason == h.reason) for h in mine}.items())
            ),
        }
    wrong = [{"kind": h.kind, "rank": h.rank, "named": h.named, "reason": h.reason} for h in every if not h.right]
    summary = {
        "hangs": len(every),
        "right": right,
        "accuracy": round(right / len(every), 4) if every else None,
        "goal": 0.978,
        "time_to_name_s": {
            "median": round(statistics.median(latencies), 3) if latencies else None,
            "p95": round(sorted(latencies)[max(0, int(0.95 * len(latencies)) - 1)], 3) if latencies else None,
            "max": round(max(latencies), 3) if latencies else None,
        },
        "by_kind": by_kind,
        "wrong": wrong,
        "false_alarms": false_alarms,
        "hang_after_s": args.hang_after,
        "hold_s": args.hold,
        "world": WORLD,
        "seed": args.seed,
        "wall_s": round(wall, 1),
        "recorder": cost,
        "machine": f"{platform.system()} {platform.machine()}, {os.cpu_count()} cpu",
    }
    if args.json:
        print(json.dumps(summary))
    else:
        print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
