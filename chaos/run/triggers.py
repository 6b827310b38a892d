"""When a planned op fires, as the harness sees it: at a time, at a step the job reported, on the Nth event of a
kind; and, for an op still waiting when the run ends, why it never fired and what would make it fire.

The harness's at_step trigger fires on the first ``target.step`` event with step >= N (of the op's rank when it
names one): the job must report steps, through the one-line agent, the zero-line step reporter (a local
torchrun or command target's ``optimizer_steps``), its own ``chaos.events`` or a matcher with event
``target.step``. A run that ends with such an op still waiting records ``fault.not_fired`` {fault, op, trigger,
reason} with that fix, and the checks about the fault cite it.
"""

from __future__ import annotations

from pydantic import JsonValue

from chaos.history.timeline import FAULT_NOT_FIRED, TARGET_STEP, Event, now_ns
from chaos.plan.build import PlannedOp

STEP_SOURCES = (
    "add `agent = chaos.agent.attach(model, optimizer)` to the script, keep `optimizer_steps: true` on a torchrun "
    "or command target on this host (the default), or add a matcher with `event: target.step` that reads the "
    "step from a line the job prints"
)


class Triggers:
    """Which pending ops are due, per event or per elapsed second (counts of ``on_event`` triggers kept here)."""

    def __init__(self) -> None:
        self.event_counts: dict[str, int] = {}

    def due_at(self, pending: list[PlannedOp], elapsed: float) -> list[PlannedOp]:
        """Time-triggered ops due ``elapsed`` seconds after the target was ready."""
        return [op for op in pending if op.at_s is not None and op.at_s <= elapsed]

    def due_on(self, pending: list[PlannedOp], event: Event) -> list[PlannedOp]:
        """Ops ``event`` makes due: a step at or past an op's ``at_step`` (on its rank), or its Nth event."""
        due = []
        for op in pending:
            if op.at_step is not None and event.kind == TARGET_STEP:
                step = event.get_int("step")
                if step is not None and step >= op.at_step and (op.rank is None or op.rank == event.rank):
                    due.append(op)
            elif op.event_kind is not None and event.matches(op.event_kind):
                if op.rank is not None and op.rank != event.rank:
                    continue
                self.event_counts[op.op_id] = self.event_counts.get(op.op_id, 0) + 1
                if self.event_counts[op.op_id] >= (op.event_nth or 1):
                    due.append(op)
        return due


def not_fired(pending: list[PlannedOp], step: int | None, why_ended: str) -> list[Event]:
    """A ``fault.not_fired`` record per op still waiting at the end: what it waited for, why it never came and,
    for a step trigger on a job that reported no step, how to give it one."""
    records: list[Event] = []
    for op in pending:
        if op.at_step is not None:
            if step is None:
                reason = f"it waits for step {op.at_step}, and the job reported no step at all: {STEP_SOURCES}"
            else:
                reason = f"it waits for step {op.at_step}; the highest step the job reported was {step}"
        elif op.event_kind is not None:
            reason = f"it waits for event #{op.event_nth or 1} {op.event_kind}, which did not come"
        else:
            reason = "its time had not come"
        reason += f" (the run ended: {why_ended})"
        data: dict[str, JsonValue] = {"fault": op.fault, "op": op.op_id, "trigger": op.describe(), "reason": reason}
        records.append(Event(ts_ns=now_ns(), kind=FAULT_NOT_FIRED, data=data))
    return records
