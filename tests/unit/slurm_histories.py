"""Hand-made histories of the ``slurm`` target's events (its event contract), for the Slurm checks.

A 3-node cluster h1..h3; job 7 runs on h1+h2 from t=1 s; a fault hits ``hit`` (h1 or h2) at ``fault_at``; the
health check drains it ``drain_after`` later; the job is REQUEUED ``requeue_after`` after the fault, PENDING,
then RUNNING again (restarts 1) on ``rerun`` ``rerun_after`` after the fault; the fault heals at ``heal_after``
and the history ends at ``end``. :meth:`SlurmRun.but` makes the variations that break a property.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from hypothesis import strategies as st

from chaos.history.timeline import Event

SECOND = 1_000_000_000
FAULT = "gpu"
JOB = 7
HC_REASON = "mlchaos-hc: xid 79 on PCI:0000:3b:00 (GPU has fallen off the bus.)"


def ns(t: float) -> int:
    return round(t * SECOND)


def node(t: float, name: str, state: str, reason: str | None = None) -> Event:
    return Event(ts_ns=ns(t), kind="slurm.node", source="slurm", data={"node": name, "state": state, "reason": reason})


def job(t: float, state: str, nodes: tuple[str, ...] = (), restarts: int = 0, job_id: int = JOB) -> Event:
    data: dict[str, Any] = {
        "job_id": job_id,
        "state": state,
        "reason": None,
        "nodes": list(nodes),
        "restarts": restarts,
        "exit_code": None,
    }
    return Event(ts_ns=ns(t), kind="slurm.job", source="slurm", data=data)


def applied(t: float, host: str, fault: str = FAULT, op: str = "gpu#1") -> Event:
    return Event(
        ts_ns=ns(t), kind="fault.applied", data={"fault": fault, "op": op, "injector": "gpu_xid", "host": host}
    )


def healed(t: float, host: str, fault: str = FAULT, op: str = "gpu#1") -> Event:
    return Event(ts_ns=ns(t), kind="fault.healed", data={"fault": fault, "op": op, "injector": "gpu_xid", "host": host})


@dataclass(frozen=True)
class SlurmRun:
    hit: str = "h2"
    fault_at: float = 5.0
    drain_after: float | None = 4.0  # None: never drained
    drain_reason: str = HC_REASON
    drained_node: str | None = None  # None: the hit node
    requeue_after: float | None = 1.0  # None: the attempt just goes on (never interrupted)
    end_state: str | None = None  # instead of a requeue the job ends in this state
    rerun_after: float | None = 15.0  # None: never RUNNING again
    rerun: tuple[str, ...] = ()  # () = the survivor + the spare h3
    new_job_id: int | None = None  # the next attempt runs under another job id (a resubmission)
    heal_after: float | None = 30.0
    resume_after: float | None = None  # the drained node IDLE again this long after the fault
    end: float = 60.0
    node_events: bool = True
    seen_before_fault: bool = True  # False: Slurm's first sight of the hit node is after the fault
    job_events: bool = True
    with_fault: bool = True

    def but(self, **changes: Any) -> SlurmRun:
        return replace(self, **changes)

    @property
    def survivor(self) -> str:
        return "h1" if self.hit == "h2" else "h2"

    @property
    def rerun_nodes(self) -> tuple[str, ...]:
        return self.rerun or (self.survivor, "h3")

    def events(self) -> list[Event]:
        t0 = self.fault_at
        out: list[Event] = []
        if self.node_events:
            out += [node(0.5, "h1", "IDLE"), node(0.5, "h2", "IDLE"), node(0.5, "h3", "IDLE")]
            out += [node(1.0, "h1", "ALLOCATED"), node(1.0, "h2", "ALLOCATED")]
            if self.drain_after is not None:
                target = self.drained_node or self.hit
                out.append(node(t0 + self.drain_after, target, "ALLOCATED+DRAIN", self.drain_reason))
                later = max(t0 + (self.requeue_after or 0.0), t0 + self.drain_after) + 0.1
                if self.requeue_after is not None and (self.resume_after is None or later < t0 + self.resume_after):
                    out.append(node(later, target, "IDLE+DRAIN", self.drain_reason))
                if self.resume_after is not None:
                    out.append(node(t0 + self.resume_after, target, "IDLE"))
        if not self.seen_before_fault:
            out = [e for e in out if e.get_str("node") != self.hit or e.ts_ns > ns(t0)]
        if self.job_events:
            out += [job(0.2, "PENDING"), job(1.0, "RUNNING", ("h1", "h2"))]
            if self.end_state is not None:
                out.append(job(t0 + (self.requeue_after or 1.0), self.end_state, ("h1", "h2")))
            elif self.requeue_after is not None:
                out += [
                    job(t0 + self.requeue_after, "REQUEUED", ("h1", "h2")),
                    job(t0 + self.requeue_after + 0.5, "PENDING", restarts=1),
                ]
                if self.rerun_after is not None:
                    job_id = self.new_job_id or JOB
                    out.append(
                        job(t0 + self.rerun_after, "RUNNING", self.rerun_nodes, 0 if self.new_job_id else 1, job_id)
                    )
        if self.with_fault:
            out.append(applied(t0, self.hit))
            if self.heal_after is not None:
                out.append(healed(t0 + self.heal_after, self.hit))
        out.append(Event(ts_ns=ns(self.end), kind="runner.end", data={"reason": "done"}))
        return out


@st.composite
def slurm_runs(draw: st.DrawFn) -> SlurmRun:
    """A run where every Slurm property holds: the hit node drains, the job is requeued onto the others."""
    drain = draw(st.floats(0.5, 20.0))
    requeue = draw(st.floats(0.2, 5.0))
    rerun = requeue + draw(st.floats(1.0, 20.0))
    return SlurmRun(
        hit=draw(st.sampled_from(["h1", "h2"])),
        fault_at=draw(st.floats(2.0, 10.0)),
        drain_after=drain,
        requeue_after=requeue,
        rerun_after=rerun,
        heal_after=rerun + draw(st.floats(1.0, 10.0)),
        end=rerun + 40.0,
    )
