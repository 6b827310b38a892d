"""Effective training time ratio (ETTR): the analytical model, and goodput measured from a run's history.

**Model** (Kokolis et al., "Revisiting Reliability in Large-Scale ML Research Clusters", Eq. 2 and the
Daly-Young optimum; see FIELD-NOTES.md). ETTR = R / (Q + R + U): productive runtime over wall time. For a
job on N nodes, each failing at r_f per node-day, restarting with overhead u0, writing a checkpoint in w
every Δt::

    E[ETTR] ≈ [1 − N r_f (u0 + Δt/2)] / (1 + w/Δt)          Δt* = sqrt(2 w / (N r_f))

N r_f is the job's failure rate λ (1/λ its MTBF); every failure costs the restart (u0) plus, on average, half
an interval of lost work (Δt/2); every interval also pays one checkpoint write (w/Δt). Units: N counts
**nodes** (GPUs / GPUs per node, 8 in the paper), r_f is per node-**day** and is converted to per second
here, so every time is in seconds. The model is first order in λ (u0 + Δt): good while failures within one
interval are rare, optimistic otherwise. Published vectors (8 GPUs/node, u0 = w = 5 min, r_f = 6.5 per
1000 node-days), all reproduced by :func:`expected_ettr` with N = GPUs / 8 exactly: 12,288 GPUs (1,536
nodes) → Δt* = 38.0 min, ETTR = 0.737; 4,096 → 0.848; 2,048 → 0.893; 12,288 with w = 10 s → 0.919; with
r_f = 1/1000 → 0.897. (FIELD-NOTES says "12k GPUs": 12,000 GPUs, 1,500 nodes, gives 38.4 min and 0.740, so
both readings round to the published 38 min and 0.74.) Δt* minimises the first-order overhead, not Eq. 2
itself, which peaks a little lower (:func:`eq2_best_interval`: 32.6 min, 0.739 at 12,288 GPUs); where
restarts eat about half the time (1 − λu0 < 1/2 + 3/2 sqrt(λw/2)) even Δt*/2 beats Δt* under Eq. 2.

**Measured** (:func:`goodput`): the wall time of a run, from its first ``target.start`` to its last
``target.exit``/``target.digest``, split into productive step time, recomputed (lost) step time, restart
downtime, checkpoint writes and everything else; ETTR_measured = productive / wall. :func:`predict_for`
feeds the run's own failure rate, restart cost, checkpoint cost and interval back into the model: a fit that
restates the run, not a prediction (the CLI no longer prints it). A prediction is fed the scenario's inputs
only: :mod:`chaos.analysis.ettr_inputs`; Slurm's record: :mod:`chaos.slurm.accounting`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from chaos import event_kinds as kinds  # the event kinds goodput is read from
from chaos.checks._evidence import attempt_of, events_of, fmt_seconds, seconds, step_events, step_of
from chaos.checks.lineage import committed_lineage  # the lineage exactly_once judges; one definition
from chaos.history.timeline import Event, History
from chaos.spec.units import format_duration

SECONDS_PER_DAY = 86_400.0
DEFAULT_GPUS_PER_NODE = 8
RSC1_FAILURES_PER_NODE_DAY = 6.5 / 1000
"""r_f of Meta's RSC-1 cluster (Kokolis et al.); RSC-2 saw 2.34 per 1000 node-days."""

CHECKPOINT_DURATION_KEYS = ("duration_s", "write_s")
"""``target.checkpoint`` data keys read as the write's duration in seconds (the first present wins)."""


# ---------------------------------------------------------------------------------------------------------
# the model


@dataclass(frozen=True)
class EttrModel:
    """One evaluation of Eq. 2. ``nodes``/``failure_rate_per_node_day`` are None when the job's failure
    rate was measured directly (a run's own numbers) rather than built from a per-node rate."""

    job_failure_rate_per_s: float
    """λ = N r_f, in failures per second."""
    restart_overhead_s: float
    """u0: time from a failure to training again (detect, reschedule, load, warm up)."""
    checkpoint_write_s: float
    """w: time one checkpoint write stalls training."""
    interval_s: float
    """Δt: the checkpoint interval this evaluation assumed."""
    ettr: float
    """E[ETTR] at ``interval_s``."""
    failure_loss: float
    """λ (u0 + Δt/2): the fraction of time lost to failures (restarts plus redone work)."""
    checkpoint_overhead: float
    """w / Δt: time spent writing checkpoints per unit of training time."""
    optimal_interval_s: float | None = None
    """Δt*, when it exists (λ > 0)."""
    nodes: int | None = None
    failure_rate_per_node_day: float | None = None

    @property
    def mtbf_s(self) -> float:
        """The job's mean time between failures, 1/λ (infinite when λ = 0)."""
        return math.inf if self.job_failure_rate_per_s == 0 else 1.0 / self.job_failure_rate_per_s


def nodes_for_gpus(gpus: int, gpus_per_node: int = DEFAULT_GPUS_PER_NODE) -> int:
    """Nodes holding ``gpus`` GPUs; a partly used node still fails like a whole one, so this rounds up."""
    if gpus < 1:
        raise ValueError(f"gpus must be at least 1, got {gpus}")
    if gpus_per_node < 1:
        raise ValueError(f"gpus per node must be at least 1, got {gpus_per_node}")
    return -(-gpus // gpus_per_node)


def _check_time(name: str, value: float) -> None:
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")


def _job_rate(nodes: int, failure_rate_per_node_day: float) -> float:
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise ValueError(f"nodes must be an integer >= 1, got {nodes!r}")
    if not math.isfinite(failure_rate_per_node_day) or failure_rate_per_node_day < 0:
        raise ValueError(
            f"the failure rate must be a finite number >= 0 per node-day, got {failure_rate_per_node_day!r}"
        )
    return nodes * failure_rate_per_node_day / SECONDS_PER_DAY


def _optimum(job_rate_per_s: float, checkpoint_write_s: float) -> float:
    if job_rate_per_s <= 0:
        raise ValueError(
            "with no failures (rate 0) checkpointing never pays off and the optimal interval is unbounded; "
            "give the interval explicitly"
        )
    return math.sqrt(2.0 * checkpoint_write_s / job_rate_per_s)


def optimal_checkpoint_interval(nodes: int, failure_rate_per_node_day: float, checkpoint_write_s: float) -> float:
    """Daly-Young optimum Δt* = sqrt(2 w / (N r_f)) in seconds (r_f per node-day, w in seconds).

    0 when w = 0 (a free checkpoint is best taken continuously). ValueError for nodes < 1, a negative or
    non-finite rate or write time, and for rate 0, where no finite interval is optimal.
    """
    _check_time("the checkpoint write time", checkpoint_write_s)
    return _optimum(_job_rate(nodes, failure_rate_per_node_day), checkpoint_write_s)


def eq2_best_interval(job_failure_rate_per_s: float, restart_overhead_u0_s: float, checkpoint_write_s: float) -> float:
    """The interval that maximises Eq. 2 itself: Δt = −w + sqrt(w² + 2 (1 − λ u0) w / λ), in seconds.

    Daly-Young's Δt* minimises the first-order overhead λΔt/2 + w/Δt and ignores the (1 − λ u0) and
    1/(1 + w/Δt) factors, so Eq. 2 peaks slightly below it (12,288 GPUs: 32.6 min, E[ETTR] 0.739, against
    38.0 min and 0.737). Both round to the published vector. ValueError for λ <= 0 or λ u0 >= 1.
    """
    lam = job_failure_rate_per_s
    if not math.isfinite(lam) or lam <= 0:
        raise ValueError(f"the job failure rate must be a finite number > 0 per second, got {lam!r}")
    _check_time("the restart overhead u0", restart_overhead_u0_s)
    _check_time("the checkpoint write time", checkpoint_write_s)
    room = 1.0 - lam * restart_overhead_u0_s
    if room <= 0:
        raise ValueError("the job cannot make progress: it fails more often than it can restart (λ u0 >= 1)")
    w = checkpoint_write_s
    return -w + math.sqrt(w * w + 2.0 * room * w / lam)


def ettr_for_job_rate(
    job_failure_rate_per_s: float,
    restart_overhead_u0_s: float,
    checkpoint_write_s: float,
    interval_s: float | None = None,
) -> EttrModel:
    """Eq. 2 with the job's failure rate λ = N r_f given directly (per second); the Daly-Young optimum when
    ``interval_s`` is None. With w = 0 the optimum is Δt → 0 and E[ETTR] its limit 1 − λ u0.

    ValueError on negative or non-finite inputs, an interval <= 0, and when the model predicts E[ETTR] <= 0:
    failures then arrive faster than the job can restart and redo lost work, so it cannot make progress.
    """
    lam = job_failure_rate_per_s
    if not math.isfinite(lam) or lam < 0:
        raise ValueError(f"the job failure rate must be a finite number >= 0 per second, got {lam!r}")
    _check_time("the restart overhead u0", restart_overhead_u0_s)
    _check_time("the checkpoint write time", checkpoint_write_s)
    optimum = _optimum(lam, checkpoint_write_s) if lam > 0 else None
    if interval_s is None:
        interval = _optimum(lam, checkpoint_write_s)  # raises for rate 0, which has no optimum
    else:
        if not math.isfinite(interval_s) or interval_s <= 0:
            raise ValueError(f"the checkpoint interval must be a finite number of seconds > 0, got {interval_s!r}")
        interval = interval_s
    failure_loss = lam * (restart_overhead_u0_s + interval / 2.0)
    # w = 0 at the optimum Δt = 0: the overhead term's limit is 0 (0/0 otherwise).
    overhead = 0.0 if checkpoint_write_s == 0 else checkpoint_write_s / interval
    ettr = (1.0 - failure_loss) / (1.0 + overhead)
    if ettr <= 0:
        mtbf = 1.0 / lam
        raise ValueError(
            f"the model predicts E[ETTR] = {ettr:.3f} <= 0: the job cannot make progress at this scale. It fails "
            f"every {format_duration(mtbf)} on average, while each failure costs u0 + Δt/2 = "
            f"{format_duration(restart_overhead_u0_s + interval / 2.0)} (N r_f (u0 + Δt/2) = {failure_loss:.2f} >= 1); "
            "use fewer nodes, a lower failure rate, a faster restart or a shorter checkpoint interval"
        )
    return EttrModel(
        job_failure_rate_per_s=lam,
        restart_overhead_s=restart_overhead_u0_s,
        checkpoint_write_s=checkpoint_write_s,
        interval_s=interval,
        ettr=ettr,
        failure_loss=failure_loss,
        checkpoint_overhead=overhead,
        optimal_interval_s=optimum,
    )


def expected_ettr(
    nodes: int,
    failure_rate_per_node_day: float,
    restart_overhead_u0_s: float,
    checkpoint_write_s: float,
    interval_s: float | None = None,
) -> EttrModel:
    """E[ETTR] ≈ [1 − N r_f (u0 + Δt/2)] / (1 + w/Δt) for N ``nodes`` failing at r_f per node-day, with
    u0, w and Δt in seconds; Δt defaults to the Daly-Young optimum. Errors as :func:`ettr_for_job_rate`."""
    lam = _job_rate(nodes, failure_rate_per_node_day)
    model = ettr_for_job_rate(lam, restart_overhead_u0_s, checkpoint_write_s, interval_s)
    return replace(model, nodes=nodes, failure_rate_per_node_day=failure_rate_per_node_day)


# ---------------------------------------------------------------------------------------------------------
# goodput from a history


@dataclass(frozen=True)
class Goodput:
    """Where a run's wall time went. The five buckets sum to ``wall_s``."""

    wall_s: float
    productive_s: float
    """Step time of steps in the committed lineage (what the final model reflects), each step once."""
    recomputed_s: float
    """Step time of step reports outside the committed lineage: work rolled back by a restart (and redone
    later) or a repeated report of a step."""
    restart_s: float
    """From the last step before each restart to the first step after it."""
    checkpoint_s: float
    """Checkpoint writes with a known duration (0 for those without one; see ``notes``)."""
    other_s: float
    """Start-up before the first step and teardown after the last (every span between steps has a bucket)."""
    committed_steps: int
    recomputed_steps: int
    restarts: int
    checkpoints: int
    checkpoints_timed: int
    """How many of ``checkpoints`` carried a duration."""
    step_s: float | None
    """Mean time of one step (over every measured step interval), None when no interval was measured."""
    checkpoint_interval_steps: int | None
    """Steps between checkpoints, read from their step numbers; None without checkpoints."""
    speaker_rank: int | None
    """The rank whose step reports timed the run."""
    notes: tuple[str, ...] = field(default=())

    @property
    def ettr(self) -> float:
        """ETTR_measured = productive / wall (0 for an empty window)."""
        return self.productive_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def training_s(self) -> float:
        """Wall time from the first step to the last: the span Eq. 2 describes (no start-up or teardown)."""
        return self.wall_s - self.other_s

    @property
    def training_ettr(self) -> float:
        """productive / :attr:`training_s`: the measured figure to hold against :func:`predict_for`, since a
        short test run's start-up and teardown would otherwise swamp it (0 for an empty span)."""
        return self.productive_s / self.training_s if self.training_s > 0 else 0.0


def _float(event: Event, key: str) -> float | None:
    value = event.data.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _write_duration(event: Event) -> float | None:
    for key in CHECKPOINT_DURATION_KEYS:
        value = _float(event, key)
        if value is not None and math.isfinite(value) and value >= 0:
            return value
    return None


def _write_key(event: Event) -> float:
    duration = _write_duration(event)
    return -1.0 if duration is None else duration  # a timed write (even 0 s) outranks an untimed one


def _overlap(start: int, end: int, spans: list[tuple[int, int]]) -> int:
    return sum(max(0, min(end, b) - max(start, a)) for a, b in spans)


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _untimed_bound(checkpoints: list[Event], steps: list[Event]) -> float | None:
    # A job that reports step K and then writes checkpoint K (ddp_trainer does) spends at most the gap
    # between the two events writing; only an upper bound, since other work may sit in between.
    reported = {(e.rank, attempt_of(e), step_of(e)): e.ts_ns for e in steps}
    gaps = [
        event.ts_ns - reported[key]
        for event in checkpoints
        if (key := (event.rank, attempt_of(event), step_of(event))) in reported and reported[key] <= event.ts_ns
    ]
    return seconds(sum(gaps)) if gaps else None


def goodput(history: History) -> Goodput:
    """Split the run's wall time into productive, recomputed, restart, checkpoint and other time.

    Window: first ``target.start`` to the last ``target.exit``/``target.digest`` (first/last step, with a
    note, when those are missing). Time is read from one rank's step reports, rank 0 or else the lowest
    (in a synchronous job every rank passes each step together). The interval between two consecutive steps
    of one attempt belongs to the later step: productive when that report is in the committed lineage of
    :func:`chaos.checks.lineage.committed_lineage` (after restarts, only the copy the final model reflects
    counts, once), recomputed otherwise. The gap between the last step of one attempt and the first of the
    next is restart downtime; it therefore also holds that first step's own compute, as does start-up for
    the first step of the run, since no report says when a first step began. A checkpoint whose event
    carries ``duration_s`` (or ``write_s``) occupied the span ending at its event; that span moves from
    whatever bucket held it to checkpoint time. Checkpoints are counted once per (attempt, step).
    Restarts are counted as ``lost_work_at_most`` counts them: attempts beyond the first seen on any
    ``target.step``/``start``/``resume``/``restart`` event (an attempt that died before stepping adds a
    restart whose time lies inside the one downtime gap around it).

    ValueError when the history holds no ``target.step`` with a step number.
    """
    steps = step_events(history)
    if not steps:
        raise ValueError("no target.step event with a step number: the run's progress was not recorded")
    notes: list[str] = []
    speaker = min({e.rank for e in steps}, key=lambda r: (r is None, r or 0))
    mine = [e for e in steps if e.rank == speaker]
    kept = set(map(id, committed_lineage(history, steps)[speaker].kept.values()))

    starts = events_of(history, kinds.TARGET_START)
    ends = events_of(history, kinds.TARGET_EXIT) + events_of(history, kinds.TARGET_DIGEST)
    begin = starts[0].ts_ns if starts else mine[0].ts_ns
    finish = max(e.ts_ns for e in ends) if ends else mine[-1].ts_ns
    if not starts:
        notes.append("no target.start event: the window starts at the first step")
    if not ends:
        notes.append("no target.exit or target.digest event: the window ends at the last step")
    finish = max(finish, begin)

    # (start, end, bucket) spans covering [begin, finish]; clipped so late or early reports cannot overflow it.
    spans: list[tuple[int, int, str]] = []

    def add(start: int, end: int, bucket: str) -> None:
        start, end = max(start, begin), min(end, finish)
        if end > start:
            spans.append((start, end, bucket))

    add(begin, mine[0].ts_ns, "other")
    intervals = 0
    for prev, event in zip(mine, mine[1:], strict=False):
        if attempt_of(event) != attempt_of(prev):
            add(prev.ts_ns, event.ts_ns, "restart")
        else:
            intervals += 1
            add(prev.ts_ns, event.ts_ns, "productive" if id(event) in kept else "recomputed")
    recomputed_steps = sum(1 for e in mine if id(e) not in kept)
    lifecycle = [*steps, *events_of(history, kinds.TARGET_START), *events_of(history, kinds.TARGET_RESUME)]
    lifecycle += events_of(history, kinds.TARGET_RESTART)
    restarts = len({attempt_of(e) for e in lifecycle}) - 1
    add(mine[-1].ts_ns, finish, "other")

    checkpoints: dict[tuple[int, int], Event] = {}
    for event in events_of(history, kinds.TARGET_CHECKPOINT):
        step = step_of(event)
        if step is None:
            continue
        key = (attempt_of(event), step)
        held = checkpoints.get(key)
        # Ranks write in parallel: the slowest write (the one that stalls the barrier) stands for all.
        if held is None or _write_key(event) > _write_key(held):
            checkpoints[key] = event
    writes = _merged(
        [(e.ts_ns - round((d or 0.0) * 1e9), e.ts_ns) for e in checkpoints.values() if (d := _write_duration(e))]
    )
    timed = sum(1 for e in checkpoints.values() if _write_duration(e) is not None)
    if len(checkpoints) > timed:
        untimed = [e for e in checkpoints.values() if _write_duration(e) is None]
        note = (
            f"{len(untimed)} of {len(checkpoints)} checkpoint(s) carry no duration "
            f"({'/'.join(CHECKPOINT_DURATION_KEYS)}): their write time is estimated as 0 and stays in step time"
        )
        bound = _untimed_bound(untimed, steps)
        if bound is not None:
            note += f"; the gap from each checkpointed step's report to its checkpoint event, {fmt_seconds(bound)} in all, bounds it"
        notes.append(note)

    totals = {"productive": 0, "recomputed": 0, "restart": 0, "checkpoint": 0, "other": 0}
    for start, end, bucket in spans:
        writing = _overlap(start, end, writes)
        totals[bucket] += end - start - writing
        totals["checkpoint"] += writing

    ckpt_steps = sorted({step for _, step in checkpoints})
    spacing: int | None = None
    if ckpt_steps:
        gaps = [b - a for a, b in zip(ckpt_steps, ckpt_steps[1:], strict=False)]
        # One checkpoint: read "every K steps from step 0" off its step number.
        spacing = min(gaps) if gaps else ckpt_steps[0]
        spacing = spacing if spacing > 0 else None
    step_time = seconds(totals["productive"] + totals["recomputed"]) / intervals if intervals else None
    return Goodput(
        wall_s=seconds(finish - begin),
        productive_s=seconds(totals["productive"]),
        recomputed_s=seconds(totals["recomputed"]),
        restart_s=seconds(totals["restart"]),
        checkpoint_s=seconds(totals["checkpoint"]),
        other_s=seconds(totals["other"]),
        committed_steps=len(kept),
        recomputed_steps=recomputed_steps,
        restarts=restarts,
        checkpoints=len(checkpoints),
        checkpoints_timed=timed,
        step_s=step_time,
        checkpoint_interval_steps=spacing,
        speaker_rank=speaker,
        notes=tuple(notes),
    )


@dataclass(frozen=True)
class RunPrediction:
    """The model fed with a run's own numbers; ``model`` is None when they could not all be read."""

    model: EttrModel | None
    reason: str
    """How the inputs were read, or why there is no prediction."""


def predict_for(run: Goodput) -> RunPrediction:
    """Eq. 2 with the run's own λ = restarts / training time (first step to last), u0 = mean restart
    downtime, w = mean timed checkpoint write (0 when none is timed) and Δt = checkpoint spacing in steps ×
    mean step time.

    A single run holds few failures, so λ is a rough estimate; the prediction says what the model expects
    of a job with these costs, for comparison with :attr:`Goodput.training_ettr` (the model has no
    start-up or teardown, so :attr:`Goodput.ettr` of a short run sits well below it).
    """
    if run.training_s <= 0:
        return RunPrediction(None, "no time between the first and the last step")
    if run.checkpoint_interval_steps is None:
        return RunPrediction(None, "no target.checkpoint with a step number: the checkpoint interval is unknown")
    if run.step_s is None:
        return RunPrediction(None, "no two consecutive steps in one attempt: the step time is unknown")
    lam = run.restarts / run.training_s
    u0 = run.restart_s / run.restarts if run.restarts else 0.0
    w = run.checkpoint_s / run.checkpoints_timed if run.checkpoints_timed else 0.0
    interval = run.checkpoint_interval_steps * run.step_s
    how = (
        f"λ = {run.restarts} restart(s) / {fmt_seconds(run.training_s)} of training, u0 = {fmt_seconds(u0)} (mean restart), "
        f"w = {fmt_seconds(w)}{'' if run.checkpoints_timed else ' (no timed checkpoint)'}, "
        f"Δt = {run.checkpoint_interval_steps} steps × {fmt_seconds(run.step_s)}"
    )
    try:
        return RunPrediction(ettr_for_job_rate(lam, u0, w, interval), how)
    except ValueError as exc:
        return RunPrediction(None, f"{how}: {exc}")
