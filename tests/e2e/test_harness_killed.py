"""Kill the harness mid-fault: the dead-man switch heals on time and `mlchaos cleanup` finds nothing left."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from support import ROOT, mlchaos, pids_mentioning, read_jsonl, scenario_yaml, spawn_harness, ticker, wait_for

from chaos.cluster.local import process_state

FREEZE_S, GRACE_S = 4.0, 2.0


def _scenario(marker: str, victim: int) -> str:
    """Ticks for a minute (its command line carries ``marker``) while ``victim`` is frozen for FREEZE_S."""
    freeze = {"name": "freeze-victim", "type": "freeze", "params": {"pid": victim}, "trigger": {"after": "1s"}}
    return scenario_yaml(
        "harness-killed",
        1,
        ticker(600, say=f"print('tick', i, '{marker}', flush=True)"),
        faults=[{**freeze, "duration": f"{FREEZE_S}s"}],
        safety={"heal_grace": f"{GRACE_S}s", "max_duration": "120s"},
    )


def _journal_records(state: Path) -> list[dict[str, object]]:
    journals = list((state / "journal").rglob("*.jsonl"))
    return [json.loads(line) for j in journals for line in j.read_text().splitlines() if line.strip()]


def _healed_by_deadman(state: Path) -> bool:
    """The journal says the dead-man healed the op. It writes that record just AFTER its revert lands, so a
    process can be running again a moment before the record exists: callers wait for it, never read once."""
    return any(r.get("by") == "deadman" for r in _journal_records(state))


def _reap(harnesses: list[subprocess.Popen[bytes]], victims: list[subprocess.Popen[bytes]], marker: str) -> None:
    """Kill what a test started: harnesses still running, the victims (continued first), the targets (``marker``)."""
    for harness in harnesses:
        if harness.poll() is None:
            harness.kill()
    for victim in victims:
        victim.send_signal(signal.SIGCONT)
        victim.kill()
        victim.wait(timeout=10)
    for pid in pids_mentioning(marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.slow
def test_sigkilled_harness_is_healed_by_dead_man_then_cleanup_has_nothing(tmp_path: Path) -> None:
    env = {**os.environ, "MLCHAOS_STATE_DIR": str(tmp_path / "state")}
    marker = f"chaos-victim-{uuid.uuid4().hex[:8]}"
    victim = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.05)", marker])
    harness = None
    try:
        scenario = tmp_path / "s.yaml"
        scenario.write_text(_scenario(marker, victim.pid))
        harness = spawn_harness("run", scenario, "--report-dir", tmp_path / "reports", env=env)
        assert wait_for(lambda: process_state(victim.pid) == "T", 60), "the freeze never stopped the victim"
        frozen_seen = time.monotonic()
        harness.send_signal(signal.SIGKILL)
        harness.wait(timeout=10)
        # The harness is gone; only the dead-man can resume the victim, at duration + grace after the apply.
        assert wait_for(lambda: process_state(victim.pid) not in ("T", None), FREEZE_S + GRACE_S + 10)
        resumed_after = time.monotonic() - frozen_seen
        assert resumed_after <= FREEZE_S + GRACE_S + 10
        assert resumed_after >= FREEZE_S * 0.5, "resumed too early: something other than the dead-man healed"
        assert wait_for(lambda: _healed_by_deadman(tmp_path / "state"), 10), _journal_records(tmp_path / "state")
        # The harness's own target must not outlive it (it gets SIGTERM through PR_SET_PDEATHSIG).
        assert wait_for(lambda: [p for p in pids_mentioning(marker) if p != victim.pid] == [], 10), "target orphaned"
        cleanup = mlchaos("cleanup", env=env, timeout=60)
        assert cleanup.returncode == 0, cleanup.stderr
        assert "nothing to heal" in cleanup.stdout
    finally:
        _reap([harness] if harness is not None else [], [victim], marker)


@pytest.mark.slow
def test_sigkilled_harness_frozen_torchrun_rank_is_resumed_by_dead_man(tmp_path: Path) -> None:
    """The acceptance case literally: a frozen rank of a real torchrun job, the harness SIGKILLed mid-freeze.

    torchrun (SIGTERMed through PR_SET_PDEATHSIG when the harness dies) would only SIGKILL the stopped rank
    after its fixed 30 s grace; the dead-man must continue it well before that, at duration + grace.
    """
    env = {**os.environ, "MLCHAOS_STATE_DIR": str(tmp_path / "state")}
    text = (ROOT / "scenarios" / "freeze-rank.yaml").read_text()
    # On rank 1's first checkpoint (step 10): an event trigger, so the HARNESS freezes it (an at_step freeze of
    # one rank is fired by that rank's own agent, which thaws itself) and its dead-man is what this test judges.
    text = text.replace("trigger: {at_step: 20, rank: 1}", "trigger: {on_event: {kind: target.checkpoint, rank: 1}}")
    text = text.replace("duration: 20s", f"duration: {FREEZE_S}s").replace("heal_grace: 5s", f"heal_grace: {GRACE_S}s")
    assert f"duration: {FREEZE_S}s" in text and f"heal_grace: {GRACE_S}s" in text
    scenario = tmp_path / "freeze.yaml"
    scenario.write_text(text.replace("--steps, 60", "--steps, 400"))
    reports = tmp_path / "reports"
    harness = spawn_harness("run", scenario, "--report-dir", reports, "--no-golden", env=env)
    pids: list[int] = []
    try:

        def rank1_pid() -> int | None:
            for events in reports.glob("freeze-rank-*/events.jsonl"):
                for line in events.read_text().splitlines():
                    record = json.loads(line)
                    if record["kind"] == "target.start" and record["rank"] == 1:
                        return int(record["data"]["pid"])
            return None

        assert wait_for(lambda: rank1_pid() is not None, 90)
        rank1 = rank1_pid()
        assert rank1 is not None
        pids.append(rank1)
        assert wait_for(lambda: process_state(rank1) == "T", 60), "rank 1 was never frozen"
        frozen_seen = time.monotonic()
        harness.send_signal(signal.SIGKILL)
        harness.wait(timeout=10)
        assert wait_for(lambda: process_state(rank1) != "T", FREEZE_S + GRACE_S + 10)
        assert time.monotonic() - frozen_seen < 25, "only torchrun's 30 s SIGKILL ended the freeze"
        assert wait_for(lambda: _healed_by_deadman(tmp_path / "state"), 10), _journal_records(tmp_path / "state")
        # Nothing of the job outlives the harness: torchrun and both ranks end.
        assert wait_for(lambda: not pids_mentioning(str(reports)), 40), "job processes outlived the harness"
        cleanup = mlchaos("cleanup", env=env, timeout=60)
        assert "nothing to heal" in cleanup.stdout, cleanup.stdout + cleanup.stderr
    finally:
        if harness.poll() is None:
            harness.kill()
        for pid in pids + pids_mentioning(str(reports)):
            for signum in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(pid, signum)
                except ProcessLookupError:
                    pass


@pytest.mark.slow
def test_cleanup_heals_a_killed_run_and_leaves_a_live_runs_faults_to_it(tmp_path: Path) -> None:
    """Two runs on one machine, one state dir: the SIGKILLed one's freeze is healed by `mlchaos cleanup` at once
    (long before its dead-man), the live one's freeze stays until that run heals it itself."""
    env = {**os.environ, "MLCHAOS_STATE_DIR": str(tmp_path / "state")}
    marker = f"chaos-victim-{uuid.uuid4().hex[:8]}"
    victims = [
        subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.05)", marker]) for _ in "ab"
    ]
    harnesses: list[subprocess.Popen[bytes]] = []
    try:
        for name, victim in zip("ab", victims, strict=True):
            text = _scenario(marker, victim.pid).replace(f'"duration": "{FREEZE_S}s"', '"duration": "90s"')
            scenario = tmp_path / f"{name}.yaml"
            scenario.write_text(text.replace("harness-killed", f"run-{name}"))
            harnesses.append(spawn_harness("run", scenario, "--report-dir", tmp_path / name, env=env))
        for victim in victims:
            assert wait_for(lambda v=victim: process_state(v.pid) == "T", 60), "a freeze never stopped its victim"
        killed, live = harnesses
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=10)
        cleanup = mlchaos("cleanup", env=env, timeout=60)
        assert cleanup.returncode == 0, cleanup.stderr
        assert "run run-b-" in cleanup.stdout and "still running, its faults are left to it" in cleanup.stdout
        assert "run run-a-" in cleanup.stdout and "healed" in cleanup.stdout, cleanup.stdout
        assert wait_for(lambda: process_state(victims[0].pid) not in ("T", None), 10), "the killed run's victim"
        assert process_state(victims[1].pid) == "T", "cleanup healed the live run's fault"
        live.send_signal(signal.SIGTERM)  # the live run heals its own fault and ends (exit 3: interrupted)
        assert live.wait(timeout=60) == 3
        assert process_state(victims[1].pid) not in ("T", None)
        [history] = (tmp_path / "b").glob("run-b-*/history.jsonl")
        faults = [r for r in read_jsonl(history) if str(r["kind"]).startswith("fault.")]
        assert [r["kind"] for r in faults] == ["fault.applied", "fault.healed"], faults
        assert f"SIGSTOP pid {victims[1].pid} " in str(faults[0]["data"]["description"])  # its own victim only
    finally:
        _reap(harnesses, victims, marker)
