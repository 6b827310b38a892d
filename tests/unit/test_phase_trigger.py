"""Phase triggers: ``trigger: {at_step: N, rank: R, phase: P}`` on a ``kill`` makes the rank's
own agent fire it at that point of the step.

Pinned here: the trigger model (phase only with at_step), the plan (the op carries its phase and the rank that
fires it, and goes into the job's plan file instead of the harness's queue), the preflight (a phase only on a
kill of a torchrun rank selected by rank; freeze/slow and in-job faults refused with the fix), and the agent-side
firing logic with a real signal to this process (SIGUSR1 caught by a handler): once, at the planned step and
phase only, its ``fault.applied`` written before the signal, never again after a restart's marker.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from pydantic import ValidationError
from support import COMMAND, TORCHRUN

from chaos.injob.fault_events import FiringRules
from chaos.injob.phase_faults import PHASES as AGENT_PHASES
from chaos.injob.phase_faults import PROCESS_FAULTS, PhaseFaults
from chaos.plan.agent_plan import InJobOp, load_plan
from chaos.plan.build import make_plan
from chaos.run.in_job import claimable, digest_interval, in_job_plan
from chaos.spec.preflight import PHASE_FAULTS, preflight
from chaos.spec.scenario import PHASES, Trigger, parse_scenario


def _phased(
    kind: str = "kill", params: str = "{rank: 1}", trigger: str = "{at_step: 3, rank: 1, phase: allreduce}", **more: str
) -> str:
    """A fault as FAULTS lists it (by default a kill of rank 1 in the allreduce of rank 1's step 3), then the keys
    ``more`` (``duration``)."""
    lines = [f"  - type: {kind}", f"    params: {params}", f"    trigger: {trigger}"]
    return "\n".join(lines + [f"    {key}: {value}" for key, value in more.items()])


KILL = _phased()
UNRANKED = "{at_step: 3, phase: allreduce}"  # fired by the rank (or replica) the fault selects
ROLES = TORCHRUN.replace(
    "  type: torchrun\n  module: chaos.reference.trainer\n  nproc_per_node: 2\n",
    "  type: roles\n  roles:\n    lighthouse: {command: [sleep, '30']}\n"
    "    group: {replicas: 2, torchrun: {script: train.py, nproc_per_node: 1}}\n",
)
REPLICA_KILL = _phased(params="{replica: group.1}", trigger=UNRANKED)


def _problems(text: str) -> list[str]:
    return [str(problem) for problem in preflight(parse_scenario(text, "s.yaml"))]


# -- the trigger and the plan ---------------------------------------------------------------------------------


def test_phase_needs_at_step() -> None:
    with pytest.raises(ValidationError, match="phase belongs with at_step"):
        Trigger.model_validate({"after": 3, "phase": "allreduce"})
    with pytest.raises(ValidationError):
        Trigger.model_validate({"at_step": 3, "phase": "sideways"})
    assert Trigger.model_validate({"at_step": 3, "phase": "allreduce"}).phase == "allreduce"


def test_the_spec_and_the_agent_name_the_same_phases_and_faults() -> None:
    assert tuple(PHASES) == AGENT_PHASES
    assert PHASE_FAULTS == PROCESS_FAULTS


def test_a_phase_kill_goes_into_the_jobs_plan_file_with_its_phase_and_rank(tmp_path: Path) -> None:
    text = TORCHRUN.replace(
        "FAULTS",
        "  - {type: kill, params: {rank: 1}, trigger: {at_step: 3, phase: allreduce}}\n"
        "  - {type: kill, name: outside, params: {rank: 0}, trigger: {at_step: 5, rank: 0}}",
    )
    plan = make_plan(parse_scenario(text))
    phased, outside = plan.ops
    # The rank that fires a phase op is the rank it kills (no trigger rank given): the params' selector.
    assert (phased.at_step, phased.rank, phased.phase) == (3, 1, "allreduce")
    assert "in phase allreduce" in phased.describe()
    assert outside.phase is None
    in_job, path = in_job_plan(plan, tmp_path, claims=False)
    assert in_job == [phased]  # the other kill stays with the harness (fired when rank 0 reports step 5)
    [op] = load_plan(str(path)).ops
    assert (op.injector, op.at_step, op.rank, op.phase, op.params["signal"]) == ("kill", 3, 1, "allreduce", "SIGKILL")
    assert not op.claimable
    # On a torchrun target the other kill is offered to rank 0's agent too: at the start of step 5, claimable.
    in_job, path = in_job_plan(plan, tmp_path, claims=True)
    assert in_job == [phased]  # still the harness's until an agent claims it
    _, offered = load_plan(str(path)).ops
    assert (offered.op_id, offered.at_step, offered.phase, offered.claimable) == (outside.op_id, 5, "forward", True)


def test_replicas_agree_every_k_asks_the_agents_for_a_digest_every_k_steps(tmp_path: Path) -> None:
    plain = TORCHRUN.replace("FAULTS", "  - {type: kill, params: {rank: 1}, trigger: {at_step: 3}}")
    checks = "checks: [{type: replicas_agree, params: {every: 10}}, {type: replicas_agree, params: {every: 4}}]"
    scenario = parse_scenario(plain.replace("checks: [{type: completes}]", checks))
    assert digest_interval(scenario) == 4  # the smallest k: every check gets its steps
    in_job_plan(make_plan(scenario), tmp_path, claims=False, digest_every=digest_interval(scenario))
    assert load_plan(str(tmp_path / "chaos-plan.json")).digest_every == 4
    assert digest_interval(parse_scenario(plain)) == 0


CLAIMABLE = [
    ("{type: kill, params: {rank: 1}, trigger: {at_step: 3}}", True),
    ("{type: kill, params: {rank: 1, signal: SIGTERM}, trigger: {at_step: 3, rank: 1}}", True),
    ("{type: freeze, params: {rank: 1}, trigger: {at_step: 3}, duration: 2s}", False),  # its heal is the harness's
    ("{type: kill, params: {rank: 1}, trigger: {at_step: 3, rank: 0}}", False),  # rank 0's steps, rank 1's death
    ("{type: kill, params: {name: trainer}, trigger: {at_step: 3}}", False),  # not one rank's own process
    ("{type: kill, params: {rank: 1}, trigger: {after: 3s}}", False),
    ("{type: slow, params: {rank: 1}, trigger: {at_step: 3}, duration: 2s}", False),
]


@pytest.mark.parametrize(("fault", "offered"), CLAIMABLE)
def test_only_a_kill_of_the_rank_whose_step_triggers_it_is_claimable(fault: str, offered: bool) -> None:
    [op] = make_plan(parse_scenario(TORCHRUN.replace("FAULTS", f"  - {fault}"))).ops
    assert claimable(op) is offered


# -- the preflight ---------------------------------------------------------------------------------------------


def test_a_phase_kill_of_a_torchrun_rank_is_accepted() -> None:
    assert _problems(TORCHRUN.replace("FAULTS", KILL)) == []
    for phase in PHASES:
        assert _problems(TORCHRUN.replace("FAULTS", KILL.replace("allreduce", phase))) == []


def test_a_phase_kill_of_a_torchrun_replica_of_a_roles_target_is_accepted() -> None:
    assert _problems(ROLES.replace("FAULTS", REPLICA_KILL)) == []


# (id, the target, its fault, words the refusal says)
REFUSED = [
    (
        "a roles target's replica that runs a command",
        ROLES,
        _phased(params="{replica: lighthouse}", trigger=UNRANKED),
        "its role runs a command, not a torchrun job",
    ),
    (
        "a roles target's process selected by name",
        ROLES,
        _phased(params="{name: train}", trigger=UNRANKED),
        "must select that replica",
    ),
    (
        "freeze with a phase but no duration",
        TORCHRUN,
        _phased("freeze"),
        "a thaw continues it when the duration has passed, so it needs one",
    ),
    ("slow with a phase", TORCHRUN, _phased("slow", duration="5s"), "a duty cycle of stops spans many steps"),
    (
        "an in-job bitflip with a trigger phase",
        TORCHRUN,
        _phased("bitflip", "{where: weights, rank: 1}"),
        "set the point with the fault's own params",
    ),
    (
        "a kill selected by name",
        TORCHRUN,
        _phased(params="{name: trainer}", trigger=UNRANKED),
        "must select the process by rank",
    ),
    (
        "a trigger rank other than the killed rank",
        TORCHRUN,
        _phased(params="{rank: 0}"),
        "the trigger's rank must be 0 too (got 1)",
    ),
    (
        "a command target",
        COMMAND,
        _phased(trigger=UNRANKED),
        "a command target runs no training loop with the agent attached",
    ),
]


@pytest.mark.parametrize(
    ("target", "fault", "words"), [case[1:] for case in REFUSED], ids=[case[0] for case in REFUSED]
)
def test_the_preflight_refuses_a_phase_it_cannot_fire(target: str, fault: str, words: str) -> None:
    problems = _problems(target.replace("FAULTS", fault))
    assert any(words in problem and "phase" in problem for problem in problems), problems
    assert all(problem.startswith("s.yaml:") for problem in problems)


# -- the agent's firing logic (a real signal to this process) ---------------------------------------------------


@pytest.fixture
def usr1() -> Iterator[list[int]]:
    """SIGUSR1 recorded instead of killing the test process; the previous handler restored after."""
    received: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        received.append(signum)

    previous = signal.signal(signal.SIGUSR1, handler)
    try:
        yield received
    finally:
        signal.signal(signal.SIGUSR1, previous)


def _op(phase: str, *, step: int = 3, signal_name: str = "SIGUSR1", injector: str = "kill") -> InJobOp:
    params: dict[str, Any] = {"rank": 1, "signal": signal_name}
    return InJobOp(op_id="k#1", fault="k", injector=injector, params=params, at_step=step, rank=1, phase=phase)


class _Job:
    """The agent's side of PhaseFaults: its step, its events, its cross-restart markers."""

    def __init__(self, received: list[int], fired: set[str] | None = None) -> None:
        self.step = 0
        self.events: list[tuple[str, dict[str, Any], int]] = []
        self.received = received
        self.fired = fired if fired is not None else set()

    def emit(self, kind: str, **data: Any) -> None:
        # What had arrived when the event was written: the signal must come after it.
        self.events.append((kind, json.loads(json.dumps(data)), len(self.received)))

    def faults(self, ops: list[InJobOp], has_ddp: bool = True) -> PhaseFaults:
        return PhaseFaults(
            ops,
            FiringRules(
                mine=lambda op: op.rank == 1,
                rank=1,
                step=lambda: self.step,
                emit=self.emit,
                already_fired=lambda op: op.op_id in self.fired,
                mark_fired=lambda op: self.fired.add(op.op_id),
                has_ddp=has_ddp,
            ),
        )


def test_fires_once_at_its_step_and_phase_with_the_event_before_the_signal(usr1: list[int]) -> None:
    job = _Job(usr1)
    faults = job.faults([_op("allreduce")])
    assert faults.in_collective_wanted
    for step in (1, 2, 3, 4):
        job.step = step
        faults.at("forward")
        faults.in_collective(0)
        faults.in_collective(1)  # a second bucket of the same step: the op already fired
        faults.at("backward")
        faults.at("optimizer_step")
    assert usr1 == [signal.SIGUSR1]
    [(kind, data, signals_before)] = job.events
    assert kind == "fault.applied" and signals_before == 0
    assert (data["step"], data["phase"], data["site"], data["bucket"], data["pid"]) == (
        3,
        "allreduce",
        "in_flight",
        0,
        os.getpid(),
    )
    assert data["signal"] == "SIGUSR1" and data["fault"] == "k" and data["op"] == "k#1"
    assert job.fired == {"k#1"}


@pytest.mark.parametrize("phase", ["forward", "backward", "optimizer_step"])
def test_each_loop_phase_fires_only_at_its_own_point(usr1: list[int], phase: str) -> None:
    job = _Job(usr1)
    faults = job.faults([_op(phase)])
    job.step = 3
    for point in ("forward", "backward", "optimizer_step"):
        faults.in_collective(0)
        faults.at(point)
        fired_here = [data["phase"] for kind, data, _ in job.events]
        assert fired_here == ([phase] if AGENT_PHASES.index(point) >= AGENT_PHASES.index(phase) else [])
    assert usr1 == [signal.SIGUSR1]


def test_every_rank_installs_the_hook_but_only_the_planned_rank_fires(usr1: list[int]) -> None:
    job = _Job(usr1)
    other = dataclasses.replace(_op("allreduce"), rank=0, params={"rank": 0, "signal": "SIGUSR1"})
    faults = job.faults([other])  # this process is rank 1: the op is rank 0's
    assert faults.in_collective_wanted  # same all-reduce code path on every rank
    job.step = 3
    faults.in_collective(0)
    assert usr1 == [] and job.events == []


def test_a_restarted_worker_does_not_fire_again(usr1: list[int]) -> None:
    job = _Job(usr1, fired={"k#1"})  # the marker a killed predecessor left in CHAOS_RUN_DIR
    faults = job.faults([_op("allreduce")])
    job.step = 3
    faults.in_collective(0)
    assert usr1 == [] and job.events == []


def test_a_claimable_op_is_claimed_at_attach_and_fired_at_its_steps_start(usr1: list[int]) -> None:
    job = _Job(usr1)
    mine = dataclasses.replace(_op("forward", signal_name="USR1"), claimable=True)
    theirs = dataclasses.replace(mine, op_id="k#2", rank=0, params={"rank": 0})
    faults = job.faults([mine, theirs])
    assert [(kind, data["op"]) for kind, data, _ in job.events] == [("fault.claimed", "k#1")]  # rank 1's only
    for step in (1, 2, 3):
        job.step = step
        faults.at("forward")
    assert usr1 == [signal.SIGUSR1]  # a name without SIG, as a scenario may write it
    (_, applied, before) = job.events[-1]
    assert (applied["step"], applied["phase"], before) == (3, "forward", 0)
    again = _Job(usr1, fired={"k#1"})  # a restarted worker: the op already fired in this run, no new claim
    again.faults([mine])
    assert again.events == []


def test_misuse_is_refused_at_attach() -> None:
    job = _Job([])
    with pytest.raises(ValueError, match="attach needs the DDP-wrapped model"):
        job.faults([_op("allreduce")], has_ddp=False)
    job.faults([_op("forward")], has_ddp=False)  # a loop phase needs no comm hook
    with pytest.raises(ValueError, match="fires only kill, freeze"):
        job.faults([_op("forward", injector="slow")])
    with pytest.raises(ValueError, match="needs a duration"):
        job.faults([_op("forward", injector="freeze")])
    with pytest.raises(ValueError, match="unknown phase"):
        job.faults([_op("checkpoint")])


def test_an_op_for_another_replica_is_not_this_processs(usr1: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    op = dataclasses.replace(_op("forward"), params={"replica": "group.1", "signal": "SIGUSR1"})
    monkeypatch.setenv("CHAOS_REPLICA", "group.0")
    job = _Job(usr1)
    faults = job.faults([op])
    job.step = 3
    faults.at("forward")
    assert usr1 == [] and job.events == []
    monkeypatch.setenv("CHAOS_REPLICA", "group.1")
    faults = job.faults([op])
    faults.at("forward")
    assert usr1 == [signal.SIGUSR1] and [kind for kind, _, _ in job.events] == ["fault.applied"]
