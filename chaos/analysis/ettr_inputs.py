"""The model side of an ETTR comparison: Eq. 2 fed only a scenario's inputs, never a run's outcome.

A scenario states, before anything runs: the job's nodes N, the per-node failure rate r_f (per node-day),
the restart overhead u0, the checkpoint write time w and the checkpoint interval Δt (Daly-Young's
Δt* = sqrt(2w / (N r_f)) when not given), all at the scale of the cluster it stands for, and the **time
compression** c: how many cluster seconds one second of the test run stands for (c = 60: one run second is
one cluster minute). :func:`predict` evaluates Eq. 2 (:func:`chaos.analysis.ettr.expected_ettr`) at cluster
scale. Eq. 2 depends on its times only through λu0, λΔt and w/Δt, so the same compression applied to every
time leaves E[ETTR] unchanged: the run executes the compressed schedule (:class:`RunSchedule`: the job's MTBF
1/(λ c), u0/c, w/c, Δt/c in run seconds) and its measured ETTR, a ratio of run seconds, is held against the
same number. The fault trigger of the run is a ``poisson`` trigger with ``mtbf`` = :attr:`RunSchedule.mtbf_s`.

What a run measures is not an input here: a prediction that read the run's restarts, restart downtime or
checkpoint writes would only restate the run (``mlchaos ettr run`` without inputs prints no prediction).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from chaos.analysis.ettr import SECONDS_PER_DAY, EttrModel, expected_ettr


@dataclass(frozen=True)
class ScenarioInputs:
    """What the scenario declares, at the scale of the cluster it stands for (times in cluster seconds)."""

    nodes: int
    """N: nodes of the modelled job (the failure process of all of them hits the test job)."""
    failure_rate_per_node_day: float
    """r_f, failures per node-day."""
    restart_overhead_s: float
    """u0: failure to training again (detection, requeue hold, scheduling, start-up, checkpoint load)."""
    checkpoint_write_s: float
    """w: how long one checkpoint write stalls training."""
    interval_s: float | None = None
    """Δt: training time between checkpoints; None: the Daly-Young optimum."""
    compression: float = 1.0
    """c: cluster seconds per run second (1: no compression)."""

    def __post_init__(self) -> None:
        if not math.isfinite(self.compression) or self.compression <= 0:
            raise ValueError(f"the time compression must be a finite number > 0, got {self.compression!r}")


@dataclass(frozen=True)
class RunSchedule:
    """The inputs in run seconds (cluster seconds / c): what the test run must execute."""

    mtbf_s: float
    """1 / (N r_f), compressed: the ``mtbf`` of the run's poisson fault trigger."""
    restart_overhead_s: float
    checkpoint_write_s: float
    interval_s: float


@dataclass(frozen=True)
class Prediction:
    """Eq. 2 for the inputs: the model at cluster scale and the schedule it implies for the run."""

    inputs: ScenarioInputs
    model: EttrModel
    run: RunSchedule

    @property
    def ettr(self) -> float:
        return self.model.ettr

    def describe(self) -> str:
        i, m, r, c = self.inputs, self.model, self.run, self.inputs.compression
        return (
            f"Eq. 2 with N = {i.nodes} nodes, r_f = {i.failure_rate_per_node_day * 1000:g}/1000 node-days "
            f"(job MTBF {m.mtbf_s:.0f} s), u0 = {i.restart_overhead_s:g} s, w = {i.checkpoint_write_s:g} s, "
            f"Δt = {m.interval_s:.1f} s{' (Daly-Young)' if i.interval_s is None else ''}; compression {c:g}x: "
            f"the run's MTBF {r.mtbf_s:.2f} s, u0 {r.restart_overhead_s:.2f} s, w {r.checkpoint_write_s:.3f} s, "
            f"Δt {r.interval_s:.2f} s"
        )


def predict(inputs: ScenarioInputs) -> Prediction:
    """E[ETTR] for ``inputs`` (Eq. 2, Daly-Young Δt* unless an interval is given) and the compressed schedule.

    ValueError as :func:`~chaos.analysis.ettr.expected_ettr` (a zero rate with no interval, negative times, a
    scale at which the job cannot make progress)."""
    model = expected_ettr(
        inputs.nodes,
        inputs.failure_rate_per_node_day,
        inputs.restart_overhead_s,
        inputs.checkpoint_write_s,
        inputs.interval_s,
    )
    c = inputs.compression
    run = RunSchedule(
        mtbf_s=model.mtbf_s / c,
        restart_overhead_s=inputs.restart_overhead_s / c,
        checkpoint_write_s=inputs.checkpoint_write_s / c,
        interval_s=model.interval_s / c,
    )
    return Prediction(inputs=inputs, model=model, run=run)


def rate_for_mtbf(nodes: int, run_mtbf_s: float, compression: float = 1.0) -> float:
    """r_f (per node-day) that gives N nodes a job MTBF of ``run_mtbf_s`` run seconds under compression c:
    86400 / (N · MTBF · c). The inverse of :attr:`RunSchedule.mtbf_s` for a poisson trigger's ``mtbf``."""
    if nodes < 1 or not math.isfinite(run_mtbf_s) or run_mtbf_s <= 0 or compression <= 0:
        raise ValueError("nodes >= 1, an MTBF > 0 and a compression > 0 are needed")
    return SECONDS_PER_DAY / (nodes * run_mtbf_s * compression)


def parse_rate(text: str) -> float:
    """A failure rate per node-day: ``6.5/1000``, ``0.0065`` or ``6.5e-3``; ValueError otherwise."""
    try:
        if "/" in text:
            numerator, denominator = text.split("/", 1)
            value = float(numerator) / float(denominator)
        else:
            value = float(text)
    except (ValueError, ZeroDivisionError):
        raise ValueError(f"{text!r} is not a failure rate; write e.g. 6.5/1000 or 0.0065 (per node-day)") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"a failure rate must be a finite number >= 0, got {text!r}")
    return value


def parse_compression(text: str) -> float:
    """``60``, ``60x`` or ``1s=1m`` (one run second stands for one cluster minute) as c; ValueError otherwise."""
    from chaos.spec.units import parse_duration

    raw = text.strip().lower()
    try:
        if "=" in raw:
            run, cluster = (part.strip() for part in raw.split("=", 1))
            value = parse_duration(cluster) / parse_duration(run)
        else:
            value = float(raw.removesuffix("x"))
    except (ValueError, ZeroDivisionError):
        raise ValueError(f"{text!r} is not a time compression; write e.g. 60, 60x or 1s=1m") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"a time compression must be > 0, got {text!r}")
    return value
