"""ETTR from the scheduler's record: a Slurm job's attempts split into queue (Q), productive (R) and wasted (U)
time, ETTR = R / (Q + R + U) (Kokolis et al.; FIELD-NOTES.md).

**Attempts** (:class:`Attempt`, one per run of the job under its one job id) come from any of three sources:

* the job-completion log (``JobCompType=jobcomp/filetxt``; :func:`parse_jobcomp`): one ``key=value`` line
  per attempt with ``SubmitTime`` (for a requeued attempt: when it was requeued), ``EligibleTime`` (when the
  requeue hold ended), ``StartTime``, ``EndTime``, ``JobState``, ``ExitCode``, ``NodeList``; 1 s resolution;
* ``sacct --parsable2`` rows (:func:`attempts_from_sacct`, via :meth:`SlurmClient.accounting`); ``sacct
  --completion`` prints the start as the submit time and has no eligible time, so Q and the requeue hold
  cannot be told apart there (both go to U's restart part);
* the ``slurm.job`` history events of the ``slurm`` target (:func:`attempts_from_events`), one per observed
  state change: an attempt runs from an observed RUNNING to the next observed state that is not RUNNING;
  times are when the poll saw them.

**The split** (:func:`breakdown`), over the job's wall time from its first submission to its last attempt's end:

* **Q**: waiting in the queue while eligible: submit → start of the first attempt, and eligible → start of
  each requeued one.
* **U**, wasted, in four parts: ``restart`` (a failed attempt's end → the next one's eligible time: Slurm's
  requeue hold), ``startup`` (an attempt's start → the moment it trains again: its ``target.resume``, else
  ``target.start``, else first ``target.step`` event), ``checkpoint`` (the job's checkpoint writes, each
  ``target.checkpoint`` event's ``duration_s`` ending at the event) and ``lost`` (a failed attempt's work after
  its last checkpoint: recomputed by the next attempt; all of its training when it wrote none).
* **R**: the rest of every attempt: training that a checkpoint (or the job's completion) made count.

The job's events are matched to attempts by their ``attempt`` field (Slurm's ``SLURM_RESTART_COUNT``), else
by time. Without progress events a failed attempt is all U (``lost``) and a completed one all R, with a note:
right for a job that never checkpoints, a lower bound on R otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

from chaos.event_kinds import SLURM_JOB as SLURM_JOB_EVENT
from chaos.event_kinds import TARGET_CHECKPOINT, TARGET_RESUME, TARGET_START, TARGET_STEP
from chaos.history.timeline import Event
from chaos.slurm.client import AccountingRecord, parse_fields, parse_time

COMPLETED = "COMPLETED"
_RUNNING = "RUNNING"
_BEGIN_KINDS = (TARGET_RESUME, TARGET_START, TARGET_STEP)  # the first found marks "training again"


@dataclass(frozen=True)
class Attempt:
    """One run of a job (times in epoch seconds; None when the record has none)."""

    job_id: int
    index: int
    """0 for the first run, k for the k-th requeue (Slurm's Restarts)."""
    state: str
    """How it ended: COMPLETED, FAILED, NODE_FAIL, REQUEUED, CANCELLED, ... (RUNNING while it runs)."""
    start: float
    end: float
    submit: float | None = None
    eligible: float | None = None
    nodes: tuple[str, ...] = ()
    exit_code: str | None = None

    @property
    def completed(self) -> bool:
        return self.state == COMPLETED


def _epoch(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()


def parse_jobcomp(text: str, job_id: int | None = None) -> list[Attempt]:
    """The attempts in a ``jobcomp/filetxt`` log (every job's, or ``job_id``'s), in order of start.

    Lines without a start or end time (a job cancelled while pending) are skipped."""
    seen: dict[int, int] = {}
    out: list[Attempt] = []
    for line in text.splitlines():
        if not line.startswith("JobId="):
            continue
        f = parse_fields(line)
        jid = int(f["JobId"])
        start, end = _epoch(parse_time(f.get("StartTime", ""))), _epoch(parse_time(f.get("EndTime", "")))
        if (job_id is not None and jid != job_id) or start is None or end is None:
            continue
        index = seen.get(jid, 0)
        seen[jid] = index + 1
        nodes = f.get("NodeList", "")
        out.append(
            Attempt(
                job_id=jid,
                index=index,
                state=f.get("JobState", "UNKNOWN").split()[0] if f.get("JobState") else "UNKNOWN",
                start=start,
                end=end,
                submit=_epoch(parse_time(f.get("SubmitTime", ""))),
                eligible=_epoch(parse_time(f.get("EligibleTime", ""))),
                nodes=tuple(nodes.split(",")) if nodes and nodes != "(null)" else (),
                exit_code=f.get("ExitCode") or None,
            )
        )
    return sorted(out, key=lambda a: (a.job_id, a.start, a.index))


def attempts_from_sacct(records: Iterable[AccountingRecord]) -> list[Attempt]:
    """Attempts from ``sacct --parsable2`` job rows (steps such as ``7.0`` are skipped), in order of start."""
    out: list[Attempt] = []
    for record in records:
        if not record.job_id.isdigit():
            continue
        start, end = _epoch(record.start_time), _epoch(record.end_time)
        if start is None or end is None:
            continue
        code = None if record.exit_code is None else f"{record.exit_code}:{record.exit_signal or 0}"
        out.append(
            Attempt(
                job_id=int(record.job_id),
                index=0,
                state=record.state,
                start=start,
                end=end,
                submit=_epoch(record.submit_time),
                nodes=record.nodes,
                exit_code=code,
            )
        )
    out.sort(key=lambda a: (a.job_id, a.start))
    counts: dict[int, int] = {}
    renumbered = []
    for attempt in out:
        index = counts.get(attempt.job_id, 0)
        counts[attempt.job_id] = index + 1
        renumbered.append(replace(attempt, index=index))
    return renumbered


def attempts_from_events(events: Iterable[Event], job_id: int | None = None) -> list[Attempt]:
    """Attempts from ``slurm.job`` events (the ``slurm`` target's record): RUNNING → next other state.

    The first observation of the job is its submit time; an attempt after a requeue is submitted at the
    requeue. An attempt still running at the last event ends there, state RUNNING."""
    mine = sorted(
        (e for e in events if e.kind == SLURM_JOB_EVENT and (job_id is None or e.get_int("job_id") == job_id)),
        key=lambda e: e.ts_ns,
    )
    out: list[Attempt] = []
    submit: float | None = None
    running: Event | None = None
    for event in mine:
        ts, state = event.ts_ns / 1e9, (event.get_str("state") or "UNKNOWN").split("+")[0]
        if submit is None:
            submit = ts
        if state == _RUNNING:
            if running is None:
                running = event
            continue
        if running is not None:
            out.append(_attempt_from(running, len(out), submit, ts, state, event))
            running = None
            submit = ts  # the next attempt waits from here (requeue)
    if running is not None:
        out.append(_attempt_from(running, len(out), submit, mine[-1].ts_ns / 1e9, _RUNNING, mine[-1]))
    return out


def _attempt_from(running: Event, index: int, submit: float | None, end: float, state: str, last: Event) -> Attempt:
    nodes = running.data.get("nodes")
    restarts = running.get_int("restarts")
    return Attempt(
        job_id=running.get_int("job_id") or 0,
        index=index if restarts is None else restarts,
        state=state,
        start=running.ts_ns / 1e9,
        end=end,
        submit=submit,
        nodes=tuple(str(n) for n in nodes) if isinstance(nodes, list) else (),
        exit_code=last.get_str("exit_code"),
    )


# ---------------------------------------------------------------------------------------------------------
# the split


@dataclass(frozen=True)
class AttemptSplit:
    """Where one attempt's time (and the wait before it) went, in seconds."""

    attempt: Attempt
    queue_s: float
    restart_s: float
    startup_s: float
    checkpoint_s: float
    lost_s: float
    productive_s: float
    checkpoints: int


@dataclass(frozen=True)
class Breakdown:
    """Q, R, U of a job from its attempts; ``q_s + r_s + u_s == wall_s``."""

    attempts: tuple[AttemptSplit, ...]
    wall_s: float
    notes: tuple[str, ...] = field(default=())

    @property
    def q_s(self) -> float:
        return sum(a.queue_s for a in self.attempts)

    @property
    def r_s(self) -> float:
        return sum(a.productive_s for a in self.attempts)

    @property
    def u_s(self) -> float:
        return sum(self.u_parts().values())

    def u_parts(self) -> dict[str, float]:
        """U by cause: restart (requeue hold), startup, checkpoint (writes), lost (work redone)."""
        return {
            "restart": sum(a.restart_s for a in self.attempts),
            "startup": sum(a.startup_s for a in self.attempts),
            "checkpoint": sum(a.checkpoint_s for a in self.attempts),
            "lost": sum(a.lost_s for a in self.attempts),
        }

    @property
    def ettr(self) -> float:
        """R / (Q + R + U); 0 for an empty record."""
        return self.r_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def failures(self) -> int:
        """Attempts that ended without completing and were followed by another: the job's failures."""
        return sum(1 for a in self.attempts[:-1] if not a.attempt.completed)

    @property
    def mean_restart_s(self) -> float | None:
        """Mean failure-to-training-again time over the failures (restart hold + queue + startup), or None."""
        gaps = [
            nxt.queue_s + nxt.restart_s + nxt.startup_s
            for prev, nxt in zip(self.attempts, self.attempts[1:], strict=False)
            if not prev.attempt.completed
        ]
        return sum(gaps) / len(gaps) if gaps else None


def _clip(lo: float, hi: float, a: float, b: float) -> float:
    return max(0.0, min(hi, b) - max(lo, a))


def breakdown(attempts: Sequence[Attempt], progress: Iterable[Event] = ()) -> Breakdown:
    """Split one job's attempts (in order; :func:`parse_jobcomp` etc.) into Q, R and U (module doc), using the
    job's ``target.*`` progress events when there are any. ValueError for no attempts or several jobs."""
    if not attempts:
        raise ValueError("no attempt of the job in the record (did it start?)")
    if len({a.job_id for a in attempts}) > 1:
        raise ValueError(f"attempts of several jobs ({sorted({a.job_id for a in attempts})}); pass one job's")
    attempts = sorted(attempts, key=lambda a: a.start)
    events = sorted((e for e in progress if e.kind.startswith("target.")), key=lambda e: e.ts_ns)
    notes: list[str] = []
    if not events:
        notes.append(
            "no progress events of the job: a failed attempt counts as all lost work, a completed one as all "
            "productive (right for a job without checkpoints; a lower bound on R otherwise)"
        )
    first = attempts[0]
    begin = first.submit if first.submit is not None and first.submit <= first.start else first.start
    splits: list[AttemptSplit] = []
    prev_end: float | None = None
    for k, attempt in enumerate(attempts):
        lo = begin if prev_end is None else prev_end
        start = max(attempt.start, lo)
        end = max(attempt.end, start)
        # The wait before this attempt: after a failure, the requeue hold (U) until eligible, then queue (Q).
        if prev_end is None:
            queue, restart = start - lo, 0.0
        else:
            eligible = attempt.eligible if attempt.eligible is not None else start
            eligible = min(max(eligible, lo), start)
            restart, queue = eligible - lo, start - eligible
            if attempt.eligible is None:
                restart, queue = start - lo, 0.0
        mine = [e for e in events if _belongs(e, attempt, k, start, end)]
        if mine:
            # The accounting's times are whole seconds (floored); the job's own events are exact. An attempt
            # lasted at least until its last event, e.g. a checkpoint written 0.3 s before the kill.
            end = max(end, mine[-1].ts_ns / 1e9)
        span = end - start
        if not events:
            lost = 0.0 if attempt.completed else span
            splits.append(AttemptSplit(attempt, queue, restart, 0.0, 0.0, lost, span - lost, 0))
            prev_end = end
            continue
        began = _training_began(mine, start, end)
        startup = began - start
        writes = [
            (e.ts_ns / 1e9 - d, e.ts_ns / 1e9)
            for e in mine
            if e.kind == TARGET_CHECKPOINT and (d := _dur(e)) is not None
        ]
        writing = sum(_clip(began, end, a, b) for a, b in writes)
        lost = 0.0
        if not attempt.completed:
            marks = [e.ts_ns / 1e9 for e in mine if e.kind == TARGET_CHECKPOINT]
            durable = max([m for m in marks if began <= m <= end], default=began)
            lost = end - durable
        productive = max(0.0, span - startup - writing - lost)
        checkpoints = sum(1 for e in mine if e.kind == TARGET_CHECKPOINT)
        splits.append(AttemptSplit(attempt, queue, restart, startup, writing, lost, productive, checkpoints))
        prev_end = end
    wall = (prev_end or begin) - begin
    if attempts[-1].state == _RUNNING:
        notes.append("the last attempt was still running: its time so far is counted")
    elif not attempts[-1].completed:
        notes.append(
            f"the job ended {attempts[-1].state}, not COMPLETED: its last attempt's work after a checkpoint is lost"
        )
    return Breakdown(attempts=tuple(splits), wall_s=wall, notes=tuple(notes))


def _dur(event: Event) -> float | None:
    value = event.data.get("duration_s")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        return None
    return float(value)


def _belongs(event: Event, attempt: Attempt, k: int, start: float, end: float) -> bool:
    number = event.get_int("attempt")
    if number is not None:
        return number == attempt.index
    # No attempt field: by time, with a second of slack (the accounting's times are whole seconds).
    return start - 1.0 <= event.ts_ns / 1e9 <= end + 1.0


def _training_began(events: Sequence[Event], start: float, end: float) -> float:
    for kind in _BEGIN_KINDS:
        found = [e.ts_ns / 1e9 for e in events if e.kind == kind]
        if found:
            return min(max(min(found), start), end)
    return start
