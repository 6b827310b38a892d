"""Run scenarios from a source tree and record each check's status, or compare two such records.

For refactors that must not change behaviour: run the single-host scenarios on the commit before and the
commit after, then compare check by check.

    git worktree add /tmp/before REV
    python scripts/scenario_verdicts.py run --root /tmp/before --out before.json scenarios/kill-rank.yaml ...
    python scripts/scenario_verdicts.py run --root . --out after.json scenarios/kill-rank.yaml ...
    python scripts/scenario_verdicts.py compare before.json after.json

`run` starts `python -m chaos.cli` with the tree at --root first on PYTHONPATH, one scenario at a time (the
tree's own copy of each scenario file, named relative to --root), and reads each run's run.json. `compare` prints every check whose status differs and exits 1 if any does.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run_one(root: Path, scenario: Path, report_dir: Path) -> dict[str, str]:
    """Run one scenario from `root`'s sources; return {check name: status} (empty if no run.json)."""
    env = dict(os.environ, PYTHONPATH=f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    before = set(report_dir.glob("*/run.json"))
    subprocess.run(
        [sys.executable, "-m", "chaos.cli", "run", "--quiet", "--report-dir", str(report_dir), str(scenario)],
        cwd=root,
        env=env,
        check=False,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    new = sorted(set(report_dir.glob("*/run.json")) - before)
    if not new:
        return {}
    result = json.loads(new[-1].read_text())
    statuses = {c["name"]: c["status"] for c in result.get("checks", [])}
    statuses["(verdict)"] = str(result.get("verdict"))
    return statuses


def cmd_run(args: argparse.Namespace) -> int:
    root = Path(args.root).resolve()
    report_dir = Path(args.report_dir or tempfile.mkdtemp(prefix="mlchaos-verdicts-"))
    report_dir.mkdir(parents=True, exist_ok=True)
    record: dict[str, dict[str, str]] = {}
    for i, name in enumerate(args.scenarios, 1):
        scenario = root / name  # each tree's own copy of the scenario file
        started = time.monotonic()
        record[scenario.name] = run_one(root, scenario, report_dir)
        took = time.monotonic() - started
        verdict = record[scenario.name].get("(verdict)", "no run.json")
        print(f"[{i}/{len(args.scenarios)}] {scenario.name}: {verdict} ({took:.0f} s)", flush=True)
        Path(args.out).write_text(json.dumps(record, indent=1, sort_keys=True))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    before = json.loads(Path(args.before).read_text())
    after = json.loads(Path(args.after).read_text())
    differ = 0
    checks = 0
    for scenario in sorted(set(before) | set(after)):
        b, a = before.get(scenario, {}), after.get(scenario, {})
        for check in sorted(set(b) | set(a)):
            checks += 1
            if b.get(check) != a.get(check):
                differ += 1
                print(f"{scenario}: {check}: {b.get(check, '-')} -> {a.get(check, '-')}")
    print(f"{checks} checks over {len(set(before) | set(after))} scenarios, {differ} differ")
    return 1 if differ else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run scenarios from a tree, record check statuses")
    run.add_argument("--root", default=".", help="the source tree whose chaos/ and injectors/ run")
    run.add_argument("--out", required=True, help="JSON record to write")
    run.add_argument("--report-dir", help="where run folders go (default: a new temporary folder)")
    run.add_argument("scenarios", nargs="+")
    run.set_defaults(func=cmd_run)
    compare = sub.add_parser("compare", help="compare two records check by check")
    compare.add_argument("before")
    compare.add_argument("after")
    compare.set_defaults(func=cmd_compare)
    args = parser.parse_args()
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
