"""Benchmark: how often ``kill`` with ``trigger: {at_step: N, rank: R, phase: allreduce}`` lands inside the
gradient all-reduce (goal: >= 95 of 100 runs).

Run: ``.venv/bin/python benchmarks/phase_kill.py [--runs 100] [--steps 5] [--kill-step 3] [--json]``. Each run is
one real torchrun launch (2 gloo ranks, ``--max-restarts 0``) of the user-style script
``tests/jobs/user_ddp_adam.py`` (DDP + Adam, the one-line agent), started with a plan file as the harness writes it
(the op a scenario's ``kill {rank: 1}`` with ``trigger: {at_step: 3, rank: 1, phase: allreduce}`` becomes), under
``tests/jobs/collective_probe.py``, which records every ``torch.distributed.all_reduce`` entry and completion
without the agent's help. A run counts as landed when BOTH hold:

- the history says so: exactly one ``fault.applied``, from rank 1, step 3, ``phase: allreduce``;
- independently, the victim was inside a collective when it died: its last probe event is an all-reduce it
  entered and never finished, its ``fault.applied`` came after that entry and nothing after it, and torchrun
  reports that pid's exit code -9 (SIGKILL).

Also counted: runs where the peer (rank 0) never finished that same collective, and of those the runs where it
had entered it (it was blocked in it, or entered it later and saw it break); a peer that had already exchanged
the data before the signal landed would finish it, and one torchrun stopped (SIGTERM, after the victim's death)
before it got there never enters it, so these counts may be lower without the kill landing anywhere else. The
peer runs DDP's gradient all-reduce through the agent's hook too (a planned allreduce-phase op installs it on
every rank), so the probe sees both ranks' collectives. ``--json`` prints one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "tests" / "jobs" / "user_ddp_adam.py"
PROBE = ROOT / "tests" / "jobs" / "collective_probe.py"
sys.path.insert(0, str(ROOT / "tests"))
import shared  # noqa: E402  (this folder: the script's own, first on sys.path)
from jobs.launch import launch  # noqa: E402  (tests/jobs is not a package of the project)

VICTIM = 1
TIMEOUT_S = 120


@dataclass
class Outcome:
    """One launch: what the history says and what the probe and torchrun saw."""

    history_allreduce: bool  # one fault.applied, rank 1, the planned step, phase allreduce
    victim_inside: bool  # victim's last probe event: a collective entered, not finished; the kill after it; -9
    peer_unfinished: bool  # the peer never finished the victim's last collective
    peer_inside: bool  # ... and had entered it (it was blocked in it, or entered it and saw it break)
    landed: bool  # history_allreduce and victim_inside
    seconds: float
    note: str = ""


def run_once(workdir: Path, steps: int, kill_step: int) -> tuple[int | None, list[dict[str, Any]], str]:
    """One torchrun launch with a plan that kills rank VICTIM inside the all-reduce of ``kill_step``."""
    op = {
        "op_id": "kill-in-allreduce#1",
        "fault": "kill-in-allreduce",
        "injector": "kill",
        "at_step": kill_step,
        "rank": VICTIM,
        "phase": "allreduce",
        "params": {"rank": VICTIM, "signal": "SIGKILL"},
    }
    launcher = ("--max-restarts", "0", "--monitor-interval", "0.1")
    return launch(workdir, [str(PROBE), str(JOB), "--steps", str(steps)], [op], launcher=launcher, timeout_s=TIMEOUT_S)


def judge(rc: int | None, events: list[dict[str, Any]], log: str, kill_step: int, seconds: float) -> Outcome:
    """Classify one launch (see the module docstring)."""
    applied = [e for e in events if e["kind"] == "fault.applied"]
    history_allreduce = (
        len(applied) == 1
        and applied[0]["rank"] == VICTIM
        and applied[0]["data"].get("step") == kill_step
        and applied[0]["data"].get("phase") == "allreduce"
    )
    victim = [e for e in events if e["rank"] == VICTIM]
    probes = [e for e in victim if e["kind"] == "probe.collective"]
    victim_inside = peer_unfinished = peer_inside = False
    note = "" if rc not in (0, None) else f"torchrun exit code {rc}"
    if applied and probes:
        fired, last = applied[0], probes[-1]
        pid = fired["data"].get("pid")
        died_of_sigkill = re.search(rf"exitcode\s*:\s*-9 \(pid: {pid}\)", log) is not None
        victim_inside = (
            last["data"]["state"] == "enter"
            and victim.index(fired) > victim.index(last)
            and victim[-1] is fired
            and died_of_sigkill
        )
        n = last["data"]["n"]
        peer = [
            e["data"]["state"]
            for e in events
            if e["rank"] != VICTIM and e["kind"] == "probe.collective" and e["data"]["n"] == n
        ]
        peer_unfinished = "done" not in peer
        peer_inside = peer_unfinished and "enter" in peer
        if not died_of_sigkill:
            note = note or "torchrun did not report the victim's pid with exit code -9"
    elif not applied:
        note = note or "no fault.applied"
    return Outcome(
        history_allreduce,
        victim_inside,
        peer_unfinished,
        peer_inside,
        history_allreduce and victim_inside,
        round(seconds, 2),
        note,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--kill-step", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    outcomes: list[Outcome] = []
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mlchaos-phase-kill-") as tmp:
        for index in range(args.runs):
            start = time.monotonic()
            rc, events, log = run_once(Path(tmp) / f"run-{index}", args.steps, args.kill_step)
            outcome = judge(rc, events, log, args.kill_step, time.monotonic() - start)
            outcomes.append(outcome)
            flags = "landed" if outcome.landed else "MISSED"
            print(
                f"run {index + 1:3d}/{args.runs}: {flags} history={outcome.history_allreduce} "
                f"victim_inside={outcome.victim_inside} peer_unfinished={outcome.peer_unfinished} peer_inside={outcome.peer_inside} "
                f"{outcome.seconds:.1f}s {outcome.note}",
                flush=True,
            )
    landed = sum(o.landed for o in outcomes)
    summary = {
        "benchmark": "phase_kill",
        "runs": len(outcomes),
        "landed_inside_collective": landed,
        "history_says_allreduce": sum(o.history_allreduce for o in outcomes),
        "victim_inside_collective": sum(o.victim_inside for o in outcomes),
        "peer_never_finished_collective": sum(o.peer_unfinished for o in outcomes),
        "peer_entered_and_never_finished": sum(o.peer_inside for o in outcomes),
        "median_run_s": round(statistics.median(o.seconds for o in outcomes), 2) if outcomes else None,
        "total_s": round(time.monotonic() - began, 1),
        "kill_step": args.kill_step,
        "steps": args.steps,
        "machine": f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "misses": [asdict(o) for o in outcomes if not o.landed][:10],
    }
    print(
        f"landed inside the all-reduce: {landed}/{len(outcomes)}; history says allreduce: "
        f"{summary['history_says_allreduce']}; victim inside (probe + SIGKILL): {summary['victim_inside_collective']}; "
        f"peer never finished that collective: {summary['peer_never_finished_collective']} "
        f"(had entered it: {summary['peer_entered_and_never_finished']})"
    )
    shared.json_last(summary, args.json, sort_keys=False)


if __name__ == "__main__":
    main()
