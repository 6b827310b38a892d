"""When a planned op fires, as the harness sees it: at a time, at a step the job reported, on the Nth event of a
kind; and, for an op still waiting when the run ends, why it never fired and what would make it fire.

The harness's at_step trigger fires on the first ``target.step`` event with step >= N (of the op's rank when it
names one): the job must report steps, through the one-line agent, the zero-line step reporter (a local
torchrun, command or roles target's ``optimizer_steps``), its own ``chaos.events`` or a matcher with event
``target.step``. A run that ends with such an op still waiting records ``fault.not_fired`` {fault, op, trigger,
reason} with that fix, and the checks about the fault cite it.

A kill aimed at one rank of a torchrun job is offered to that rank's agent
(:func:`chaos.run.in_job.claimable`): an agent that will fire it at the start of the step says so with
``fault.claimed`` when it attaches, and its ``fault.applied`` then comes before the step's own report. The harness
keeps a claimed op pending and takes it back only when the rank reports the step after the named one without
that ``fault.applied`` (an agent whose loop never ran the point it fires at): then the poll fires it, late, and
its ``fault.applied`` says so (``claim_lapsed``). A poll-fired op records the step the harness had seen and the
poll interval, its resolution.
"""

from __future__ import annotations

from typing import TypedDict

from pydantic import JsonValue

from chaos.event_kinds import FAULT_APPLIED, FAULT_CLAIMED, FAULT_NOT_FIRED, TARGET_START, TARGET_STEP
from chaos.history.timeline import Event, now_ns
from chaos.plan.build import PlannedOp

STEP_SOURCES = (
    "add `agent = chaos.agent.attach(model, optimizer)` to the script, keep `optimizer_steps: true` on a torchrun, "
    "command or roles target on this host (the default), or add a matcher with `event: target.step` that reads the "
    "step from a line the job prints"
)


class Triggers:
    """Which pending ops are due, per event or per elapsed second (counts of ``on_event`` triggers kept here)."""

    def __init__(self) -> None:
        self.event_counts: dict[str, int] = {}
        self.claims: dict[str, int | None] = {}  # op id -> the rank whose agent claimed it

    def claimed(self, op: PlannedOp) -> bool:
        """Whether a rank's agent claimed ``op`` (its firing, if the harness fires it, is a lapsed claim)."""
        return op.op_id in self.claims

    def due_at(self, pending: list[PlannedOp], elapsed: float) -> list[PlannedOp]:
        """Time-triggered ops due ``elapsed`` seconds after the target was ready."""
        return [op for op in pending if op.at_s is not None and op.at_s <= elapsed]

    def due_on(self, pending: list[PlannedOp], event: Event) -> list[PlannedOp]:
        """Ops ``event`` makes due: a step at or past an op's ``at_step`` (on its rank; past it when an agent
        claimed the op), or its Nth event. A ``fault.claimed`` from the job is noted, and makes nothing due."""
        if event.kind == FAULT_CLAIMED and event.source == "target":
            op_id = event.get_str("op")
            if op_id is not None:
                self.claims[op_id] = event.rank
            return []
        due = []
        for op in pending:
            if op.at_step is not None and event.kind == TARGET_STEP:
                step = event.get_int("step")
                claimed = op.op_id in self.claims
                rank = self.claims[op.op_id] if claimed and op.rank is None else op.rank  # a lapse: the claimer's
                if step is not None and step >= op.at_step + claimed and (rank is None or rank == event.rank):
                    due.append(op)
            elif op.event_kind is not None and event.matches(op.event_kind):
                if op.rank is not None and op.rank != event.rank:
                    continue
                self.event_counts[op.op_id] = self.event_counts.get(op.op_id, 0) + 1
                if self.event_counts[op.op_id] >= (op.event_nth or 1):
                    due.append(op)
        return due


def not_fired(
    pending: list[PlannedOp], step: int | None, why_ended: str, claims: dict[str, int | None] | None = None
) -> list[Event]:
    """A ``fault.not_fired`` record per op still waiting at the end: what it waited for, why it never came and,
    for a step trigger on a job that reported no step, how to give it one (``claims``: :attr:`Triggers.claims`)."""
    records: list[Event] = []
    claims = claims or {}
    for op in pending:
        if op.op_id in claims:
            reached = "no step" if step is None else f"step {step} at most"
            reason = (
                f"the agent of rank {claims[op.op_id]} claimed it, to fire at the start of step {op.at_step}, and the "
                f"job reported {reached}"
            )
        elif op.at_step is not None:
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


class PollResolution(TypedDict, total=False):
    """What a step-triggered ``fault.applied`` the harness recorded says about its resolution (see :func:`polled`)."""

    fired_by: str
    seen_step: int | None
    poll_s: float
    claim_lapsed: bool


def polled(op: PlannedOp, step: int | None, poll_s: float, triggers: Triggers) -> PollResolution:
    """What the ``fault.applied`` of an op the harness fired on a step says about its resolution: the highest
    step it had seen and its poll interval (the fault lands that much after the job reported the step, or
    later); ``claim_lapsed`` when a rank's agent had claimed it. Nothing for other triggers."""
    if op.at_step is None:
        return {}
    data: PollResolution = {"fired_by": "poll", "seen_step": step, "poll_s": poll_s}
    if triggers.claimed(op):
        data["claim_lapsed"] = True
    return data


def placed(event: Event, rank_hosts: dict[int, str]) -> Event:
    """``event`` as the harness records it: a rank's ``target.start`` that names its host is noted in
    ``rank_hosts``; a ``fault.applied`` a rank's agent reported without a host gets that rank's (the agent
    knows no inventory name), so a fault fired in the job names its host as one the harness fired does."""
    host = event.get_str("host")
    if event.kind == TARGET_START and event.rank is not None and host is not None:
        rank_hosts[event.rank] = host
    elif event.kind == FAULT_APPLIED and event.rank in rank_hosts and host is None:
        return event.model_copy(update={"data": {**event.data, "host": rank_hosts[event.rank]}})
    return event
