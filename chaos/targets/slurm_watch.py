"""What the ``slurm`` target records of Slurm's own view: one event per observed change (pure logic, no I/O).

``slurm.job`` {job_id, state, reason, nodes, restarts, exit_code} and ``slurm.node`` {node, state, reason}, from
polling ``scontrol show job/node``; the first observation of each is recorded too, so a check knows where
things started. Timestamps are when the change was observed.

Slurm requeues a job whose node failed within one scheduling pass: a poll sees RUNNING, then PENDING with
``Restarts`` one higher, never the attempt's end state. When the restart count rises without its end having
been seen, the attempt's end is read from accounting (the completion log or slurmdbd: one record per attempt)
and recorded as a ``slurm.job`` event with ``via: "accounting"`` (e.g. NODE_FAIL on the old node list), followed
by ``REQUEUED`` (the new restart count) unless Slurm showed that state itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pydantic import JsonValue

from chaos.event_kinds import SLURM_JOB, SLURM_NODE
from chaos.history.timeline import Event
from chaos.slurm.client import AccountingRecord, Job, Node

SOURCE = "slurm"
REQUEUED = "REQUEUED"
# Base states in which a job is over (unless Slurm requeues it: see JobWatch.settled).
FINAL_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}
)
SETTLE_S = 1.0  # a final state must hold this long (and two polls) before the job counts as over


@dataclass(frozen=True)
class JobView:
    """What the target records of one observation of its job."""

    state: str
    reason: str | None
    nodes: tuple[str, ...]
    restarts: int
    exit_code: str | None

    @classmethod
    def of(cls, job: Job) -> JobView:
        exit_code = job.fields.get("ExitCode") or None
        return cls(_base(job.state), _reason(job.reason), job.nodes, job.restarts, exit_code)

    def data(self, job_id: int) -> dict[str, JsonValue]:
        return {
            "job_id": job_id,
            "state": self.state,
            "reason": self.reason,
            "nodes": list(self.nodes),
            "restarts": self.restarts,
            "exit_code": self.exit_code,
        }


def _base(state: str) -> str:
    """Slurm's state without flag suffixes (``CANCELLED by 0`` -> CANCELLED, ``RUNNING+X`` -> RUNNING)."""
    return state.split()[0].split("+")[0] if state.strip() else "UNKNOWN"


def _reason(reason: str | None) -> str | None:
    return None if reason is None or reason.strip() in ("", "None", "(null)") else reason.strip()


def exit_code_of(view: JobView) -> int:
    """The target's exit code for a job that ended in ``view``: 0 for COMPLETED; 128 + the signal when one
    ended it; else the batch script's code, or 1 when Slurm ended it without one (CANCELLED, NODE_FAIL ...)."""
    code, _, signal = (view.exit_code or "").partition(":")
    if signal.isdigit() and int(signal) > 0:
        return 128 + int(signal)
    if code.isdigit() and int(code) > 0:
        return int(code)
    return 0 if view.state == "COMPLETED" else 1


class JobWatch:
    """Turns successive observations of one job into ``slurm.job`` events, and says when it is over."""

    def __init__(self, job_id: int) -> None:
        self.job_id = job_id
        self.last: JobView | None = None
        self._final_since: int | None = None  # ts_ns the current final state was first seen
        self._final_polls = 0

    def observe(
        self, view: JobView, ts_ns: int, attempts: Callable[[], Sequence[AccountingRecord]] | None = None
    ) -> list[Event]:
        """Events for ``view`` seen at ``ts_ns`` (none when nothing changed). ``attempts`` reads the job's
        accounting records when an attempt's end was missed (see the module doc)."""
        events: list[Event] = []
        last = self.last
        if last is not None and view.restarts > last.restarts:
            if last.state not in FINAL_STATES and last.state != REQUEUED:
                ended = _attempt_end(attempts, self.job_id, last.restarts) if attempts is not None else None
                if ended is not None:
                    events.append(self._event(ts_ns, ended, via="accounting"))
            if view.state != REQUEUED and last.state != REQUEUED:
                requeued = JobView(REQUEUED, view.reason, (), view.restarts, view.exit_code)
                events.append(self._event(ts_ns, requeued, via="restarts"))
        if view != last:
            events.append(self._event(ts_ns, view))
        if view.state in FINAL_STATES and (last is None or view.restarts == last.restarts):
            if self._final_since is None:
                self._final_since = ts_ns
            self._final_polls += 1
        else:
            self._final_since, self._final_polls = None, 0
        self.last = view
        return events

    def settled(self, now_ns: int) -> bool:
        """True once the job has been in a final state for :data:`SETTLE_S` over at least two polls (a job that
        Slurm is about to requeue may show its end state for a moment)."""
        return self._final_since is not None and self._final_polls >= 2 and now_ns - self._final_since >= SETTLE_S * 1e9

    def _event(self, ts_ns: int, view: JobView, via: str | None = None) -> Event:
        data = view.data(self.job_id)
        if via is not None:
            data["via"] = via
        return Event(ts_ns=ts_ns, kind=SLURM_JOB, source=SOURCE, data=data)


def _attempt_end(attempts: Callable[[], Sequence[AccountingRecord]], job_id: int, index: int) -> JobView | None:
    """Attempt ``index`` (0 = the first) of ``job_id`` as accounting recorded its end, or None."""
    try:
        records = [r for r in attempts() if r.job_id == str(job_id) and r.state and r.end_time is not None]
    except Exception:  # noqa: BLE001 - accounting is evidence we add when we can; polling goes on without it
        return None
    records.sort(key=lambda r: r.end_time.timestamp() if r.end_time is not None else 0.0)
    if index >= len(records):
        return None
    record = records[index]
    exit_code = f"{record.exit_code or 0}:{record.exit_signal or 0}"
    return JobView(_base(record.state), None, record.nodes, index, exit_code)


@dataclass(frozen=True)
class NodeView:
    """What the target records of one node: Slurm's state string (base and flags, ``IDLE+DRAIN``) and reason."""

    state: str
    reason: str | None

    @classmethod
    def of(cls, node: Node) -> NodeView:
        raw = node.fields.get("State", "")
        state = raw if raw else "+".join([node.state, *sorted(node.flags)])
        if state.endswith("*"):  # older releases' "not responding" mark
            state = state.rstrip("*") + "+NOT_RESPONDING"
        return cls(state, _reason(node.reason))


class NodeWatch:
    """Turns successive observations of the cluster's nodes into ``slurm.node`` events."""

    def __init__(self, names: Sequence[str] | None = None) -> None:
        self.names = set(names) if names is not None else None  # None: every node observed
        self.last: dict[str, NodeView] = {}

    def observe(self, nodes: Sequence[Node], ts_ns: int) -> list[Event]:
        events = []
        for node in nodes:
            if self.names is not None and node.name not in self.names:
                continue
            view = NodeView.of(node)
            if self.last.get(node.name) != view:
                self.last[node.name] = view
                data: dict[str, JsonValue] = {"node": node.name, "state": view.state, "reason": view.reason}
                events.append(Event(ts_ns=ts_ns, kind=SLURM_NODE, source=SOURCE, data=data))
        return events
