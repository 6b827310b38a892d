"""The harness's triggers: which ops an event or a second makes due, and an op that never fired says why, with the
fix a step trigger on a job without steps needs; the checks about that fault cite it."""

from __future__ import annotations

from pathlib import Path

from support import scenario_yaml

from chaos.checks._evidence import missing_fault_reason
from chaos.cli.preflight import step_source_notes
from chaos.history.timeline import Event, History
from chaos.plan.build import PlannedOp
from chaos.run.triggers import STEP_SOURCES, Triggers, not_fired, placed, polled
from chaos.spec.scenario import Scenario, load_scenario

KILL = PlannedOp(op_id="kill#1", fault="kill", injector="kill", trigger="at_step", at_step=25, rank=1)
LATER = PlannedOp(op_id="late#1", fault="late", injector="kill", trigger="after", at_s=30.0)
ON_CKPT = PlannedOp(
    op_id="ck#1", fault="ck", injector="kill", trigger="on_event", event_kind="target.checkpoint", event_nth=2
)


def step(n: int, rank: int) -> Event:
    return Event(ts_ns=n, kind="target.step", rank=rank, data={"step": n})


def test_a_step_fires_its_ranks_op_at_or_past_its_step_and_the_nth_event_fires_an_event_op() -> None:
    triggers = Triggers()
    pending = [KILL, LATER, ON_CKPT]
    assert triggers.due_on(pending, step(25, 0)) == []  # another rank's step 25
    assert triggers.due_on(pending, step(24, 1)) == []
    assert triggers.due_on(pending, step(27, 1)) == [KILL]  # a coarse step source: at or past
    checkpoint = Event(ts_ns=1, kind="target.checkpoint", rank=0, data={})
    assert triggers.due_on(pending, checkpoint) == []
    assert triggers.due_on(pending, checkpoint) == [ON_CKPT]
    assert triggers.due_at(pending, 29.9) == [] and triggers.due_at(pending, 30.0) == [LATER]


def claim(op: PlannedOp, rank: int) -> Event:
    return Event(ts_ns=1, kind="fault.claimed", source="target", rank=rank, data={"fault": op.fault, "op": op.op_id})


def test_a_claimed_step_op_is_the_agents_and_the_poll_takes_it_back_only_past_its_step() -> None:
    triggers = Triggers()
    anyone = KILL.model_copy(update={"rank": None, "op_id": "any#1"})
    pending = [KILL, anyone]
    forged = claim(KILL, 1).model_copy(update={"source": "runner"})
    assert triggers.due_on(pending, forged) == [] and not triggers.claimed(KILL)  # only the job's agent claims
    assert triggers.due_on(pending, claim(KILL, 1)) == [] and triggers.due_on(pending, claim(anyone, 1)) == []
    assert triggers.claimed(KILL) and triggers.claims == {"kill#1": 1, "any#1": 1}
    # The agent fires at the start of step 25, before it reports step 25: a report of 25 without its
    # fault.applied is not yet a lapse; 26 is, and only the claiming rank's steps count.
    assert triggers.due_on(pending, step(25, 1)) == []
    assert triggers.due_on(pending, step(26, 0)) == []
    assert triggers.due_on(pending, step(26, 1)) == [KILL, anyone]
    assert polled(KILL, 26, 0.05, triggers) == {
        "fired_by": "poll",
        "seen_step": 26,
        "poll_s": 0.05,
        "claim_lapsed": True,
    }
    assert polled(KILL, 27, 0.05, Triggers()) == {"fired_by": "poll", "seen_step": 27, "poll_s": 0.05}
    assert polled(LATER, 27, 0.05, triggers) == {}  # a time trigger has no step resolution
    [record] = not_fired([KILL], 12, "target exited (1)", triggers.claims)
    assert "agent of rank 1 claimed it, to fire at the start of step 25" in str(record.data["reason"])
    assert "step 12 at most" in str(record.data["reason"])


def test_a_fault_a_ranks_agent_fired_is_recorded_on_that_ranks_host() -> None:
    hosts: dict[int, str] = {}
    start = Event(ts_ns=1, kind="target.start", source="target", rank=1, data={"pid": 7, "host": "h2"})
    assert placed(start, hosts) == start and hosts == {1: "h2"}
    fired = Event(ts_ns=2, kind="fault.applied", source="target", rank=1, data={"op": "kill#1"})
    assert placed(fired, hosts).data == {"op": "kill#1", "host": "h2"}
    named = fired.model_copy(update={"data": {"op": "kill#1", "host": "h9"}})
    assert placed(named, hosts) == named  # a host the job named stays
    other = fired.model_copy(update={"rank": 0})
    assert placed(other, hosts) == other  # a rank with no known host: as it came


def test_a_step_op_on_a_job_without_steps_says_what_to_add_and_the_check_cites_it() -> None:
    [event] = not_fired([KILL], None, "target exited (0)")
    reason = event.get_str("reason") or ""
    assert event.kind == "fault.not_fired" and event.get_str("op") == "kill#1"
    assert "reported no step at all" in reason and "chaos.agent.attach(model, optimizer)" in reason
    assert "event: target.step" in reason and reason.endswith("(the run ended: target exited (0))")
    history = History()
    history.append(event)
    cited = missing_fault_reason(history, "kill")
    assert "was never applied" in cited and "chaos.agent.attach(model, optimizer)" in cited


def test_a_step_op_the_job_never_reached_names_the_highest_step() -> None:
    [event] = not_fired([KILL], 12, "max_duration 60s reached")
    assert "the highest step the job reported was 12" in (event.get_str("reason") or "")


def _scenario(tmp_path: Path, target: dict[str, object], trigger: dict[str, object]) -> Scenario:
    fault = {"name": "k", "type": "kill", "params": {"rank": 1}, "trigger": trigger}
    text = scenario_yaml("s", 1, target, faults=[fault], checks=[{"type": "completes"}], safety={"max_duration": "60s"})
    (tmp_path / "s.yaml").write_text(text)
    return load_scenario(tmp_path / "s.yaml")


def test_validate_notes_a_step_trigger_only_when_nothing_reports_steps(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import torch\n")
    plain = {"type": "torchrun", "script": str(script)}
    at_25 = {"at_step": 25, "rank": 1}
    assert step_source_notes(_scenario(tmp_path, plain, at_25)) == []  # the zero-line step reporter
    off = {**plain, "optimizer_steps": False}
    [note] = step_source_notes(_scenario(tmp_path, off, at_25))
    assert "fault(s) k fire at a step" in note and "optimizer_steps is off" in note and STEP_SOURCES in note
    matcher = {**off, "matchers": [{"pattern": r"step (?P<step>\d+)", "event": "target.step"}]}
    assert step_source_notes(_scenario(tmp_path, matcher, at_25)) == []
    script.write_text("import torch\nimport chaos.agent\n")  # the one-line agent reports them
    assert step_source_notes(_scenario(tmp_path, off, at_25)) == []
    script.write_text("import torch\n")
    assert step_source_notes(_scenario(tmp_path, off, {"after": "5s"})) == []  # no step trigger
