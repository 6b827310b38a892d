"""A torchft replica group as users write it (``tests/jobs/user_torchft.py``: torchft's Manager, DDP and
Optimizer wrapper, AdamW; it imports nothing from mlchaos), run as a ``roles`` target with a real lighthouse.

- Unmodified: its steps come from the zero-line reporter (torchft's own step after each commit vote), its
  detections from torchft's own output (a quorum without a group's process names that group), so a kill of
  group 1 and, later in the same run, a freeze of it get true ``detected_within`` (the freeze at the
  lighthouse's 5 s heartbeat timeout, the kill when the group's restarted process joins, if that is sooner), ``recovered_within``, ``survivors_progress``, ``rejoined_within``, ``restarts_at_most`` (the
  roles supervisor's restarts) and ``completes``.
- With the one ``attach`` line: ``replicas_agree {every: 5}`` compares both groups' digests (model and AdamW
  state) at every 5th committed step after group 1 healed from its peer; the mutant whose ``load_state_dict``
  forgets the optimizer's state heals parameters only, and fails it while ``rejoined_within`` passes.

Skipped, with the reason, without torchft.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support import ROOT, attached_script, detected_and_recovered, verdicts_by_name, write_and_run

from chaos.run.result import RunResult

pytest.importorskip("torchft", reason="torchft is not installed: pip install -e '.[torchft]' (scripts/setup.sh does)")

pytestmark = pytest.mark.slow

JOB = ROOT / "tests" / "jobs" / "user_torchft.py"
HEARTBEAT_S = 5.0  # the lighthouse's --heartbeat_timeout_ms: torchft's own detection of a lost group
KILL = {"name": "kill-group-1", "type": "kill", "params": {"replica": "group.1"}, "trigger": {"at_step": 15}}


def roles(script: Path, steps: int) -> dict[str, Any]:
    """A lighthouse and two replica groups of ``script``, restarted on failure: the roles target users write."""
    lighthouse = [
        "{bin}/torchft_lighthouse",
        "--min_replicas",
        "1",
        "--quorum_tick_ms",
        "100",
        "--join_timeout_ms",
        "2000",
        "--heartbeat_timeout_ms",
        str(int(HEARTBEAT_S * 1000)),
        "--bind",
        "[::]:{port:lighthouse}",
    ]
    group = {
        "torchrun": {"script": str(script), "args": ["--steps", str(steps), "--step-time", "0.2", "--timeout", "10"]},
        "replicas": 2,
        "after": ["lighthouse"],
        "env": {"REPLICA_GROUP_ID": "{index}", "TORCHFT_LIGHTHOUSE": "http://localhost:{port:lighthouse}"},
        "restart": {"policy": "on-failure", "delay": "1s"},
    }
    light = {"command": lighthouse, "port": "auto", "restart": {"policy": "always", "delay": "1s"}}
    return {"type": "roles", "roles": {"lighthouse": light, "group": group}, "until": ["group"]}


def run(
    root: Path,
    folder: Path,
    name: str,
    script: Path,
    steps: int,
    faults: list[dict[str, Any]],
    checks: list[dict[str, Any]],
) -> RunResult:
    safety = {"max_duration": "200s", "no_progress_timeout": "60s"}
    return write_and_run(root, folder, name, 5, roles(script, steps), faults=faults, checks=checks, safety=safety)


def one_line(tmp: Path, drop: str | None = None) -> Path:
    """``user_torchft.py`` with the one-line tier's two edits (and, for a mutant, without the line ``drop``)."""
    out = tmp / ("attached.py" if drop is None else "mutant.py")
    attach = "chaos.agent.attach(model, optimizer, manager=manager, ddp=ddp)"
    return attached_script(JOB, out, attach, drop, after="optimizer = Optimizer(manager, inner)")


def test_an_unmodified_torchft_job_gets_its_kill_and_freeze_detected_and_recovered(
    e2e_report_root: Path, tmp_path: Path
) -> None:
    freeze = {
        "name": "freeze-group-1",
        "type": "freeze",
        "params": {"replica": "group.1"},
        "trigger": {"at_step": 45},
        "duration": "12s",
    }
    within = f"{HEARTBEAT_S + 2:g}s"  # a killed group that restarts sooner is seen sooner: its replacement joins
    checks: list[dict[str, Any]] = []
    for fault in ("kill-group-1", "freeze-group-1"):
        checks += [
            *detected_and_recovered(fault, within, "60s"),
            {"type": "rejoined_within", "params": {"fault": fault, "within": "60s"}},
        ]
    checks += [
        {"type": "survivors_progress", "params": {"fault": "kill-group-1", "max_stall": "20s"}},
        {"type": "restarts_at_most", "params": {"restarts": 1}},
        {"type": "completes"},
    ]
    result = run(e2e_report_root, tmp_path, "user-torchft-unmodified", JOB, 70, [KILL, freeze], checks)
    got = verdicts_by_name(result)
    assert all(status == "pass" for status, _ in got.values()), got
    history = result.history
    steps = history.of("target.step")
    assert steps and all(e.data.get("source") == "torchft" for e in steps), steps[:3]
    assert {e.get_str("replica") for e in steps} == {"group.0", "group.1"}
    # Each detection is torchft's: group 0's first quorum without group 1's process, naming group 1.
    applied = history.of("fault.applied")
    for op in applied:
        first = next(e for e in history.of("detect.*") if e.ts_ns > op.ts_ns)
        assert first.data.get("signature") == "torchft_quorum_lost", first
        assert (first.get_str("replica"), first.get_str("reporter")) == ("group.1", "group.0"), first.data
        assert (first.ts_ns - op.ts_ns) / 1e9 <= HEARTBEAT_S + 2, (first.ts_ns - op.ts_ns) / 1e9
    # The restart counted is the roles supervisor's (group 1 after the kill); the freeze healed without one.
    assert [e.get_str("replica") for e in history.of("target.role_restart")] == ["group.1"]


def test_one_line_compares_the_replicas_every_5th_step_after_the_rejoin(e2e_report_root: Path, tmp_path: Path) -> None:
    checks = [
        {"type": "detected_within", "params": {"fault": "kill-group-1", "within": f"{HEARTBEAT_S + 2:g}s"}},
        {"type": "survivors_progress", "params": {"fault": "kill-group-1", "max_stall": "20s"}},
        {"type": "rejoined_within", "params": {"fault": "kill-group-1", "within": "60s"}},
        {"type": "replicas_agree", "params": {"fault": "kill-group-1", "every": 5}},
        {"type": "completes"},
    ]
    result = run(e2e_report_root, tmp_path, "user-torchft-one-line", one_line(tmp_path), 50, [KILL], checks)
    got = verdicts_by_name(result)
    assert all(status == "pass" for status, _ in got.values()), got
    history = result.history
    assert all(e.data.get("committed") is not None for e in history.of("target.step"))  # the agent's, torchft's vote
    [applied] = history.of("fault.applied")
    rejoined = [e for e in history.of("target.digest") if e.get_str("replica") == "group.1" and e.ts_ns > applied.ts_ns]
    steps = sorted({e.get_int("step") or 0 for e in rejoined})
    assert len(steps) >= 3 and all(step % 5 == 0 for step in steps[:-1]), steps  # every 5th, and the one at exit
    compared = next(r for r in result.results if r.check == "replicas_agree")  # steps compared
    assert compared.measured is not None and compared.measured >= 3, compared

    mutant = one_line(tmp_path, drop='inner.load_state_dict(state["optim"])  # type: ignore[arg-type]')
    result = run(e2e_report_root, tmp_path, "user-torchft-forgets-optimizer", mutant, 50, [KILL], checks)
    got = verdicts_by_name(result)
    assert got["rejoined_within[kill-group-1]"][0] == "pass", got  # it healed its parameters, at the peer's step
    agree = got["replicas_agree[kill-group-1]"]
    assert agree[0] == "fail" and "group.1" in agree[1], got
