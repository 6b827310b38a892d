"""The ``crash`` fault: its params (the YAML schema) and the agent-side firing. Its way into the job's plan file,
as every in-job one-shot fault's, is pinned in test_in_job_one_shot_faults.py.

Pinned here: the params' defaults and refusals; in the agent, a crash fires once, at its (step, phase) only,
after its ``fault.applied`` and the fire-once marker, and never again after a restart finds the marker; an
``allreduce`` crash asks for the comm hook and needs ``ddp=``; and in a child process the three kinds end it as
promised: InjectedFault (exit 1), SIGSEGV (-11), SIGABRT (-6), with ``fault.applied`` already in the event file.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from support import ROOT, AgentRank

from chaos.injob.crash_faults import CRASHES, CrashFaults, InjectedFault
from chaos.injob.fault_specs import CrashSpec
from chaos.injob.loop_hooks import collective_failure
from chaos.plan.agent_plan import InJobOp
from injectors.crash import CrashParams


def _op(kind: str = "exception", phase: str = "backward", rank: int = 1, step: int = 4) -> InJobOp:
    params: dict[str, Any] = {"kind": kind, "phase": phase, "rank": rank}
    return InJobOp(op_id="boom#1", fault="boom", injector="crash", params=params, at_step=step, rank=rank)


class _Rank(AgentRank):
    def faults(self, *ops: InJobOp, has_ddp: bool = True) -> CrashFaults:
        return CrashFaults(ops, self.rules(has_ddp=has_ddp))


# -- the params and the plan -----------------------------------------------------------------------------------


def test_the_params_default_to_an_exception_at_forward_and_refuse_what_they_do_not_know() -> None:
    assert CrashParams().model_dump() == {"kind": "exception", "phase": "forward", "rank": None}
    assert CrashParams.model_validate({"kind": "segfault", "phase": "allreduce", "rank": 1}).phase == "allreduce"
    for bad in ({"kind": "oops"}, {"phase": "sideways"}, {"rank": -1}, {"signal": "SIGSEGV"}):
        with pytest.raises(ValidationError):
            CrashParams.model_validate(bad)
    assert tuple(CrashParams.model_fields["kind"].annotation.__args__) == CRASHES  # type: ignore[union-attr]
    validated = CrashParams.model_validate({"kind": "abort", "phase": "optimizer_step", "rank": 0})
    assert CrashSpec.from_params(validated.model_dump(mode="json")) == CrashSpec("abort", "optimizer_step", 0)


# -- the agent side ------------------------------------------------------------------------------------------------


def test_an_exception_crash_fires_once_at_its_step_and_phase_after_its_event_and_marker() -> None:
    rank = _Rank()
    faults = rank.faults(_op(), _op(rank=0))  # rank 0's crash is not this rank's
    assert faults.phases == {"backward"} and not faults.in_collective_wanted
    for step in (3, 4):
        rank.step = step
        faults.at("forward")  # not its phase
    assert rank.events == [] and rank.markers == set()
    rank.step = 4
    with pytest.raises(InjectedFault, match=r"crash fault 'boom' \(op boom#1\) on rank 1 at step 4, in phase backward"):
        faults.at("backward")
    [(kind, data)] = rank.events
    assert kind == "fault.applied" and rank.markers == {"boom#1"}
    assert {k: data[k] for k in ("fault", "op", "injector", "rank", "step", "phase", "crash_kind")} == {
        "fault": "boom",
        "op": "boom#1",
        "injector": "crash",
        "rank": 1,
        "step": 4,
        "phase": "backward",
        "crash_kind": "exception",
    }
    assert data["pid"] == os.getpid()
    faults.at("backward")  # a script that caught it and goes on: the op is spent
    # A restarted rank (new agent, same markers) recomputing step 4 does not crash again.
    restarted = _Rank(markers=rank.markers)
    restarted.step = 4
    restarted.faults(_op()).at("backward")
    assert restarted.events == []


def test_an_allreduce_crash_fires_in_the_collective_and_needs_ddp() -> None:
    rank = _Rank(rank=0)
    faults = rank.faults(_op(phase="allreduce"))  # rank 1's: rank 0 fires nothing, but reduces through the hook
    assert faults.in_collective_wanted and faults.phases == frozenset()
    rank.step = 4
    faults.in_collective(0)
    assert rank.events == []
    mine = _Rank()
    mine.step = 4
    with pytest.raises(InjectedFault, match="in the all-reduce of bucket 0"):
        mine.faults(_op(phase="allreduce")).in_collective(0)
    assert (mine.events[0][1]["site"], mine.events[0][1]["bucket"]) == ("in_flight", 0)
    with pytest.raises(ValueError, match=r"attach needs the DDP-wrapped model"):
        _Rank().faults(_op(phase="allreduce"), has_ddp=False)


def test_an_injected_fault_is_not_read_as_a_collective_failure() -> None:
    assert collective_failure(InjectedFault("crash fault 'x' at step 3, in the all-reduce of bucket 0")) is None
    assert collective_failure(RuntimeError("gloo allreduce: Connection closed by peer")) is not None


CHILD = """
import sys
from chaos.injob.crash_faults import CrashFaults
from chaos.injob.fault_events import FiringRules
from chaos.plan.agent_plan import InJobOp
from chaos import events
op = InJobOp(op_id="boom#1", fault="boom", injector="crash", params={"kind": sys.argv[1], "phase": "forward"},
             at_step=2)
faults = CrashFaults([op], FiringRules(mine=lambda op: True, rank=0, step=lambda: 2, emit=events.emit,
                     already_fired=lambda op: False, mark_fired=lambda op: None, has_ddp=False))
print("about to crash", flush=False)  # flushed by the agent before a native crash
faults.at("forward")
print("survived", flush=True)
"""


@pytest.mark.parametrize(
    ("kind", "code", "says"),
    [
        ("exception", 1, "chaos.injob.crash_faults.InjectedFault: crash fault 'boom' (op boom#1)"),
        ("segfault", -signal.SIGSEGV, ""),
        ("abort", -signal.SIGABRT, ""),
    ],
)
def test_each_kind_ends_the_process_as_promised_with_its_event_on_disk(
    tmp_path: Path, kind: str, code: int, says: str
) -> None:
    events_file = tmp_path / "events.jsonl"
    env = {**os.environ, "CHAOS_EVENTS": str(events_file), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, kind], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == code, done.stderr[-2000:]
    assert "about to crash" in done.stdout and "survived" not in done.stdout
    assert says in done.stderr
    [record] = [json.loads(line) for line in events_file.read_text().splitlines()]
    assert record["kind"] == "fault.applied" and record["data"]["crash_kind"] == kind
