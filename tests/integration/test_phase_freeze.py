"""A ``freeze`` with ``trigger.phase``: the rank's own agent stops its process at that point of
the step, and a thaw it started in a session of its own continues it after the fault's duration, with no harness
involved (the thaw is the fault's dead-man switch: a harness that dies mid-freeze leaves no stopped rank).

- A process running :class:`~chaos.injob.phase_faults.PhaseFaults` alone: it is really stopped (``T`` in /proc)
  during the freeze, continues by itself after it, and reports ``fault.healed`` {frozen_s}.
- A real torchrun launch (2 gloo ranks, ``tests/jobs/user_ddp_adam.py`` under ``tests/jobs/collective_probe.py``)
  with rank 1 frozen inside step 3's gradient all-reduce for 4 s: the victim's last probe event before the freeze
  is an all-reduce it entered; its peer sat inside that collective (or, when gloo had already exchanged the
  victim's part, the next one) for the freeze; both finish every step with no restart, and the job exits 0.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from jobs.launch import launch
from support import ROOT, wait_for

from chaos.injob.phase_faults import THAW

JOB = ROOT / "tests" / "jobs" / "user_ddp_adam.py"
PROBE = ROOT / "tests" / "jobs" / "collective_probe.py"
FREEZE_S = 4.0

CHILD = """
import json, sys, time
from chaos.injob.phase_faults import PhaseFaults
from chaos.injob.fault_events import FiringRules
from chaos.plan.agent_plan import InJobOp
op = InJobOp(op_id="f#1", fault="f", injector="freeze", params={"rank": 0}, at_step=1, rank=0, phase="forward",
             duration_s=float(sys.argv[1]))
def emit(kind, **data):
    print(json.dumps({"kind": kind, "t": time.monotonic(), **data}), flush=True)
faults = PhaseFaults([op], FiringRules(mine=lambda op: True, rank=0, step=lambda: 1, emit=emit,
                     already_fired=lambda op: False, mark_fired=lambda op: None, has_ddp=False))
faults.at("forward")
print(json.dumps({"kind": "after", "t": time.monotonic()}), flush=True)
"""


def _state(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "gone"
    return stat[stat.rindex(")") + 2 :].split()[0]


def test_a_frozen_process_is_stopped_and_its_own_thaw_continues_it() -> None:
    child = subprocess.Popen([sys.executable, "-c", CHILD, "2.0"], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert child.stdout is not None
        applied = json.loads(child.stdout.readline())
        assert applied["kind"] == "fault.applied" and applied["duration_s"] == 2.0 and applied["phase"] == "forward"
        assert wait_for(lambda: _state(child.pid) == "T", timeout=5), _state(child.pid)  # really stopped
        time.sleep(0.5)
        assert _state(child.pid) == "T", "continued before the duration passed"
        healed = json.loads(child.stdout.readline())  # written by the process itself once continued
        after = json.loads(child.stdout.readline())
        assert healed["kind"] == "fault.healed" and 1.8 <= healed["frozen_s"] < 30, healed
        assert after["kind"] == "after" and child.wait(timeout=30) == 0
    finally:
        child.kill()
        child.wait()


def test_the_thaw_never_continues_a_process_that_reused_the_pid() -> None:
    # The thaw checks the kernel start time: a stopped stranger with the same pid number but another start time
    # (here: the right pid, a wrong recorded start) stays stopped.
    stranger = subprocess.Popen(["sleep", "60"])
    try:
        stranger.send_signal(19)  # SIGSTOP
        assert wait_for(lambda: _state(stranger.pid) == "T", timeout=5)
        subprocess.run([sys.executable, "-c", THAW, "0", str(stranger.pid), "1"], check=True, timeout=30)
        assert _state(stranger.pid) == "T"
    finally:
        stranger.kill()
        stranger.wait()


FREEZE_OP = {
    "op_id": "freeze-in-allreduce#1",
    "fault": "freeze-in-allreduce",
    "injector": "freeze",
    "at_step": 3,
    "rank": 1,
    "phase": "allreduce",
    "duration_s": FREEZE_S,
    "params": {"rank": 1},
}


@pytest.mark.slow
def test_a_rank_frozen_inside_the_all_reduce_holds_its_peer_in_the_collective_then_both_finish(tmp_path: Path) -> None:
    job = [str(PROBE), str(JOB), "--steps", "6"]
    rc, events, log = launch(tmp_path / "job", job, [FREEZE_OP], launcher=("--max-restarts", "0"), timeout_s=180)
    assert rc == 0, log[-3000:]
    [applied] = [e for e in events if e["kind"] == "fault.applied"]
    [healed] = [e for e in events if e["kind"] == "fault.healed"]
    assert (applied["rank"], applied["data"]["step"], applied["data"]["phase"]) == (1, 3, "allreduce")
    assert FREEZE_S - 0.2 <= healed["data"]["frozen_s"] < FREEZE_S + 30, healed
    victim = [e for e in events if e["rank"] == 1]
    before: list[dict[str, Any]] = victim[: victim.index(applied)]
    probes = [e for e in before if e["kind"] == "probe.collective"]
    assert probes[-1]["data"]["state"] == "enter", probes[-3:]  # frozen inside a collective it had entered
    n = probes[-1]["data"]["n"]
    # The peer sat inside a collective for the freeze: that one, or (when gloo's background thread had already
    # exchanged the victim's contribution before the stop landed) the next one, which the frozen rank never
    # entered until it was continued.
    peer = {
        (e["data"]["n"], e["data"]["state"]): e for e in events if e["rank"] == 0 and e["kind"] == "probe.collective"
    }
    held = {
        k: (peer[(k, "done")]["ts_ns"] - peer[(k, "enter")]["ts_ns"]) / 1e9
        for k, state in peer
        if state == "enter" and (k, "done") in peer
    }
    waited = [k for k, seconds in held.items() if seconds >= FREEZE_S - 0.5]
    assert waited and min(waited) in (n, n + 1), {k: round(v, 3) for k, v in sorted(held.items())}
    for rank in (0, 1):  # every step done, no restart
        steps = [e["data"]["step"] for e in events if e["rank"] == rank and e["kind"] == "target.step"]
        assert steps == list(range(1, 7)), (rank, steps)
