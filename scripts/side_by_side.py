"""Run one scenario several times AT ONCE on this machine and say whether the runs kept to themselves.

    .venv/bin/python scripts/side_by_side.py scenarios/kill-rank.yaml                 # two runs
    .venv/bin/python scripts/side_by_side.py scenarios/partition-node.yaml \\
        --inventory /tmp/tb-a/inventory.yaml --inventory /tmp/tb-b/inventory.yaml    # one testbed each

Each copy is a real ``mlchaos run`` with its own report folder under ``--report-dir``. A copy is judged on its
own ``run.json``: it passed, and every fault it applied was healed and hit its own job (every pid a fault
description names is a pid its own job reported; every host a fault landed on is one of its inventory's).
The ports each run chose (``target.ports``) are printed. Exit 0 when every copy passed and kept to itself.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
_PIDS = re.compile(r"\bpids? ([0-9][0-9, ]*)")


def _own_pids(events: list[dict[str, Any]]) -> set[int]:
    """Every pid the run's own job reported (its ranks, workers, launchers, replicas)."""
    found: set[int] = set()
    for event in events:
        if str(event["kind"]).startswith(("target.", "serving.")) and isinstance(event["data"].get("pid"), int):
            found.add(event["data"]["pid"])
    return found


def judge(run_json: Path, hosts: set[str]) -> list[str]:
    """What is wrong with one run (empty: it passed and kept to itself)."""
    record = json.loads(run_json.read_text())
    events = record["events"]
    problems = [] if record["verdict"] == "pass" else [f"verdict {record['verdict']} ({record['ended_by']})"]
    applied = [e for e in events if e["kind"] == "fault.applied"]
    healed = {e["data"].get("op") for e in events if e["kind"] == "fault.healed"}
    own = _own_pids(events)
    for event in applied:
        data = event["data"]
        if data.get("duration_s") is not None and data.get("op") not in healed:
            problems.append(f"{data.get('op')} applied, never healed")
        for match in _PIDS.finditer(str(data.get("description", ""))):
            pids = {int(p) for p in re.findall(r"[0-9]+", match.group(1))}
            if pids - own:
                problems.append(f"{data.get('op')} hit pid(s) {sorted(pids - own)} that its job never reported")
        if data.get("host") not in hosts:
            problems.append(f"{data.get('op')} landed on host {data.get('host')!r}, not one of this run's")
    if not applied and record["scenario"]["faults"]:
        problems.append("no fault was applied")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenario", type=Path)
    parser.add_argument("--copies", type=int, default=2)
    parser.add_argument("--inventory", type=Path, action="append", default=[], help="one per copy (or none)")
    parser.add_argument("--report-dir", type=Path, default=None, help="default: a new temporary folder")
    args = parser.parse_args()
    if args.inventory and len(args.inventory) != args.copies:
        parser.error(f"give one --inventory per copy ({args.copies}), or none")
    reports = args.report_dir or Path(tempfile.mkdtemp(prefix="side-by-side-"))
    started = time.monotonic()
    runs = []
    for index in range(args.copies):
        folder = reports / f"copy-{index}"
        argv = [
            sys.executable,
            "-m",
            "chaos.cli.commands",
            "run",
            str(args.scenario),
            "--report-dir",
            str(folder),
            "-q",
        ]
        if args.inventory:
            argv += ["--inventory", str(args.inventory[index])]
        reports.mkdir(parents=True, exist_ok=True)
        log = (reports / f"copy-{index}.log").open("w")
        runs.append((index, folder, subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)))
        print(f"copy {index}: started (pid {runs[-1][2].pid}), reports in {folder}", flush=True)
    failed = False
    for index, folder, proc in runs:
        code = proc.wait()
        found = sorted(folder.glob("*/run.json"))
        if not found:
            print(f"copy {index}: exit {code}, no run.json (see {reports / f'copy-{index}.log'})")
            failed = True
            continue
        hosts = {"local"}
        if args.inventory:
            hosts |= {h["name"] for h in yaml.safe_load(args.inventory[index].read_text())["hosts"]}
        record = json.loads(found[-1].read_text())
        ports = [e["data"]["ports"] for e in record["events"] if e["kind"] == "target.ports"]
        ops = [e["data"].get("description") for e in record["events"] if e["kind"] == "fault.applied"]
        problems = judge(found[-1], hosts)
        failed |= bool(problems) or code != 0
        print(f"copy {index}: exit {code}, verdict {record['verdict']}, ports {ports or '-'}, faults {ops}")
        for problem in problems:
            print(f"  PROBLEM: {problem}")
    print(
        f"{args.copies} copies in {time.monotonic() - started:.0f} s: {'FAILED' if failed else 'all passed, each on its own'}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
