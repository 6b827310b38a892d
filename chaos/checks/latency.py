"""Judging per-op latencies against a bound: the verdict shared by every "X within T of each fault op" check.

A latency check (``detected_within``, ``recovered_within``, ``failover_within``, ``failback_within``) measures,
for each applied op of one fault, the time until something happened. What it found is a :class:`Latencies`
(:func:`fault_latencies` starts one with the fault's applied ops); :meth:`Latencies.judge` turns that into the
:class:`~chaos.checks.base.CheckResult` (:func:`judge_op_times` does it for per-op outcomes a measure already
classified), in one fixed order so the checks cannot drift apart:

1. ``fail`` when some op never got the transition (``missed``), or another definite problem was found;
2. ``fail`` when the worst latency is over the bound;
3. ``unknown`` when some op cannot be judged (``undecided``) or no op was measured at all;
4. ``pass`` otherwise.

A definite failure outranks "cannot tell", and nothing passes without a measured latency for every op.
A latency check that judges its ops in its own order (``culprit_named``, ``rerendezvous_within``) builds its
verdicts with :func:`latency_result` instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Literal, Protocol

from pydantic import Field

from chaos.checks._evidence import (
    Verdict,
    applied_ops,
    capped,
    fmt_offset,
    fmt_seconds,
    missing_fault_reason,
    verdict_of,
)
from chaos.checks.base import CheckParams, CheckResult, Status
from chaos.history.timeline import Event, History
from chaos.spec.units import Duration


class FaultBound(CheckParams):
    """The parameters every "X within T of each fault op" check of the training job takes; a subclass's docstring
    says what it waits for after each op."""

    fault: str = Field(description="name of the scenario fault whose every applied op is timed")
    within: Duration = Field(
        description="largest allowed time from each fault.applied to what the check waits for (e.g. 10s, 2m, 0.5)"
    )


def latency_verdict(check: str, fault: str, within: float | None) -> Verdict:
    """``CheckResult`` bound to a latency check of ``fault``: name ``check[fault]``, unit seconds, bound
    ``<= <within>`` (``-`` when no bound is known, which the check must then judge ``unknown``)."""
    return verdict_of(check, fault, bound="-" if within is None else f"<= {fmt_seconds(within)}", unit="s")


class LatencyResult(Protocol):
    """A latency check's verdict maker (:func:`latency_result`): status, reason, the evidence (capped) and the
    measured seconds."""

    def __call__(
        self, status: Status, reason: str, evidence: list[str], measured: float | None = None
    ) -> CheckResult: ...


def latency_result(check: str, fault: str, within: float | None) -> LatencyResult:
    """:func:`latency_verdict` of ``check``, taking its fields positionally and capping the evidence, for a
    check that judges each op itself rather than through :class:`Latencies`."""
    verdict = latency_verdict(check, fault, within)

    def result(status: Status, reason: str, evidence: list[str], measured: float | None = None) -> CheckResult:
        return verdict(status=status, reason=reason, evidence=capped(evidence), measured=measured)

    return result


@dataclass
class Latencies:
    """What a latency check measured over one fault's applied ops, before judging.

    ``verdict``: the check's result with its fixed fields bound (:func:`latency_verdict`); ``within``: the bound
    judged, seconds; ``ops``: the applied ops to measure; ``measured``: (seconds, op) for every op whose latency
    is known, in op order; ``evidence``: the lines to cite (capped when judged); ``missed``: why the check fails
    for an op that never got the transition (None when none); ``problems``: other definite failures;
    ``undecided``: why some op cannot be judged (None when all can); ``nothing``: why the check is unknown when no
    op was measured and none was undecided.
    """

    verdict: Verdict
    within: float
    ops: list[Event] = field(default_factory=list)
    measured: list[tuple[float, Event]] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)
    missed: str | None = None
    problems: list[str] = field(default_factory=list)
    undecided: str | None = None
    nothing: str = "no op to judge"

    def add(self, seconds: float, op: Event) -> None:
        """Record the latency of ``op``."""
        self.measured.append((seconds, op))

    def cannot_judge(self, why: str) -> None:
        """Record why an op cannot be judged (joined into ``undecided``)."""
        self.undecided = why if self.undecided is None else f"{self.undecided}; {why}"

    def worst(self) -> tuple[float, Event] | None:
        """The largest latency and its op; the earliest op on ties; None when nothing was measured."""
        return max(self.measured, key=lambda pair: pair[0], default=None)

    def judge(
        self, *, too_slow: Callable[[float, Event], str], passed: str, worst_op: Callable[[Event], str] | None = None
    ) -> CheckResult:
        """The verdict against ``within`` (order in the module docstring).

        ``measured`` is the worst latency (None when nothing was measured) and ``evidence`` is ``evidence``
        capped. Reasons: ``too_slow(seconds, op)`` followed by ``", over the <within> bound"``; a pass is
        ``passed`` followed by ``"; worst <seconds>"`` and, with ``worst_op``, ``" (<worst_op(op)>)"``.
        """
        worst = self.worst()
        verdict = partial(self.verdict, evidence=capped(self.evidence), measured=None if worst is None else worst[0])
        if self.missed is not None:
            return verdict(status="fail", reason=self.missed)
        if self.problems:
            return verdict(status="fail", reason="; ".join(self.problems))
        if worst is not None and worst[0] > self.within:
            return verdict(status="fail", reason=f"{too_slow(*worst)}, over the {fmt_seconds(self.within)} bound")
        if self.undecided is not None or worst is None:
            return verdict(status="unknown", reason=self.undecided or self.nothing)
        latency, op = worst
        detail = "" if worst_op is None else f" ({worst_op(op)})"
        return verdict(status="pass", reason=f"{passed}; worst {fmt_seconds(latency)}{detail}")


def fault_latencies(history: History, check: str, fault: str, within: float) -> Latencies:
    """A latency check ``check`` of ``fault`` about to measure: its verdict, the bound ``within`` and the fault's
    applied ops. A fault that never applied has no op to measure, and judging that is ``unknown`` saying why
    (:func:`~chaos.checks._evidence.missing_fault_reason`): such a check never passes vacuously."""
    ops = applied_ops(history, fault)
    nothing = f"no op of {fault!r} to judge" if ops else missing_fault_reason(history, fault)
    return Latencies(latency_verdict(check, fault, within), within, ops, nothing=nothing)


class OpOutcome(Protocol):
    """One applied op's transition as a measure reports it (e.g. :class:`chaos.checks.serving.measures.OpTime`):
    ``ok`` with ``seconds`` set, ``never`` (it did not come), or ``unknown`` (``note`` says why)."""

    @property
    def applied(self) -> Event: ...
    @property
    def outcome(self) -> Literal["ok", "never", "unknown"]: ...
    @property
    def seconds(self) -> float | None: ...
    @property
    def note(self) -> str: ...
    @property
    def evidence(self) -> tuple[str, ...]: ...


def judge_op_times(
    history: History, what: str, times: Sequence[OpOutcome], within: float, fault: str, verdict: Verdict
) -> CheckResult:
    """:meth:`Latencies.judge` on per-op transitions (``what``: e.g. ``failover``): an op that ``never`` got it
    fails, naming the first one's note; an ``unknown`` op makes the verdict unknown unless something failed."""
    found = Latencies(
        verdict,
        within,
        [t.applied for t in times],
        measured=[(t.seconds, t.applied) for t in times if t.seconds is not None],
        evidence=[line for t in times for line in t.evidence],
        nothing=f"no op of {fault!r} to judge",
    )
    unknown = [t.note for t in times if t.outcome == "unknown"]
    if unknown:
        found.undecided = "; ".join(unknown) or found.nothing
    never = [t for t in times if t.outcome == "never"]
    if never:
        found.missed = f"no {what} for {len(never)} of {len(times)} op(s) of {fault!r}: {never[0].note}"
    return found.judge(
        too_slow=lambda taken, op: (
            f"{what} took {fmt_seconds(taken)} after the apply at {fmt_offset(history, op.ts_ns)}"
        ),
        passed=f"{what} after all {len(times)} op(s) of {fault!r}",
    )
