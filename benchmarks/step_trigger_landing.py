"""Benchmark: where an ``at_step`` kill lands on a job with 5 ms steps, fired by the rank's agent and by the
harness's poll.

Run: ``.venv/bin/python benchmarks/step_trigger_landing.py [--faults 100] [--every 20] [--json]``. One real
torchrun launch (one rank) per variant, through the whole harness (``execute``), of a user-style loop (a small
model, Adam, a 5 ms sleep per step) with ``--faults`` kills of rank 0, each ``{signal: SIGUSR1}`` with
``trigger: {at_step: N}`` for N = every, 2*every, ...: the job handles SIGUSR1 and prints where its loop was
when it came (the step, and whether its forward had begun), so the landing is the job's own word.

- ``agent``: the script has the one ``attach(model, optimizer)`` line, so rank 0's agent claims each kill and
  signals its own process at the start of step N;
- ``poll``: the same script without it; the zero-line step reporter reports steps and the harness sends the
  signal once it has read step N's report (its 50 ms poll).

A kill LANDED at step N when the job saw it in step N before that step's forward pass (the point ``at_step: N``
names: the fault's step is N, none of N's work done). Also counted: how many steps later the others came, and
that the agent variant's history says step N. ``--json`` prints one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import platform
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import shared  # noqa: E402

from chaos.run.orchestrator import RunOptions, execute  # noqa: E402
from chaos.spec.scenario import load_scenario  # noqa: E402

STEP_S = 0.005

LOOP = """import signal, sys, time
import torch
{attach_import}
torch.manual_seed(0)
model = torch.nn.Linear(16, 1)
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
{attach_line}
x, y = torch.randn(32, 16), torch.randn(32, 1)
where = [0, "start"]
signal.signal(signal.SIGUSR1, lambda signum, frame: print(f"signal at step {{where[0]}} {{where[1]}}", flush=True))
for step in range(1, int(sys.argv[1]) + 1):
    where[:] = [step, "start"]
    loss = torch.nn.functional.mse_loss(model(x), y)
    where[1] = "after-forward"
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    where[1] = "end"
    time.sleep({step_s})
"""


def script(folder: Path, agent: bool) -> Path:
    path = folder / ("attached.py" if agent else "plain.py")
    path.write_text(
        LOOP.format(
            attach_import="import chaos.agent" if agent else "",
            attach_line="agent = chaos.agent.attach(model, optimizer)" if agent else "",
            step_s=STEP_S,
        )
    )
    return path


def run_variant(folder: Path, agent: bool, faults: int, every: int) -> dict[str, Any]:
    steps = faults * every + every
    at = [every * (i + 1) for i in range(faults)]
    scenario = {
        "name": f"landing-{'agent' if agent else 'poll'}",
        "seed": 1,
        "target": {
            "type": "torchrun",
            "script": str(script(folder, agent)),
            "nproc_per_node": 1,
            "max_restarts": 0,
            "args": [steps],
        },
        "faults": [
            {"name": f"usr1-{n}", "type": "kill", "params": {"rank": 0, "signal": "SIGUSR1"}, "trigger": {"at_step": n}}
            for n in at
        ],
        "checks": [{"type": "completes"}],
        "safety": {"max_duration": "300s", "no_progress_timeout": "60s"},
    }
    source = folder / f"{scenario['name']}.yaml"
    source.write_text(yaml.safe_dump(scenario, sort_keys=False))
    began = time.monotonic()
    result = execute(load_scenario(source), RunOptions(report_root=folder / "reports", golden=False))
    wall = time.monotonic() - began
    log = "\n".join(p.read_text(errors="replace") for p in result.run_dir.glob("target*.log"))
    seen = [(int(m.group(1)), m.group(2)) for m in re.finditer(r"signal at step (\d+) (\S+)", log)]
    landed = sum(1 for n in at if (n, "start") in seen)
    late = [s - n for (s, _), n in zip(seen, at, strict=False) if (s, "start") != (n, "start")]
    applied = result.history.of("fault.applied")
    by_agent = [e for e in applied if e.source == "target"]
    said_n = sum(1 for e in by_agent if e.get_int("step") == int(str(e.get_str("fault")).split("-")[1]))
    return {
        "variant": "agent" if agent else "poll",
        "faults": faults,
        "applied": len(applied),
        "signals_seen": len(seen),
        "fired_by_agent": len(by_agent),
        "history_says_named_step": said_n,
        "landed_at_named_step": landed,
        "others_late_by_steps": {str(k): late.count(k) for k in sorted(set(late))},
        "ended_by": result.ended_by,
        "wall_s": round(wall, 1),
    }


def main() -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--faults", type=int, default=100)
    parser.add_argument("--every", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    out: dict[str, Any] = {"machine": f"{platform.node()} {platform.machine()}", "step_s": STEP_S}
    with tempfile.TemporaryDirectory(prefix="mlchaos-landing-") as tmp:
        for agent in (True, False):
            folder = Path(tmp) / ("agent" if agent else "poll")
            folder.mkdir()
            figures = run_variant(folder, agent, args.faults, args.every)
            out[figures["variant"]] = figures
            print(
                f"{figures['variant']:>5}: {figures['landed_at_named_step']}/{args.faults} landed at the start of the "
                f"named step (others, steps late: {figures['others_late_by_steps']}; signals seen "
                f"{figures['signals_seen']}); fired by the agent: {figures['fired_by_agent']}, its history says the "
                f"named step: {figures['history_says_named_step']}; {figures['wall_s']} s, {figures['ended_by']}"
            )
    return shared.json_last(out, args.json, sort_keys=False)


if __name__ == "__main__":
    main()
