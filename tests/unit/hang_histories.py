"""Hand-made histories of the hang-culprit story, for ``culprit_named`` (contract: ``detect.hang`` from
the hang watch, :mod:`chaos.detect.hang_watch`; ``fault.applied`` of a freeze/spin/skip on one rank).

:class:`HangRun`: ``world`` ranks step from t=1 s; a hang fault hits rank ``hit`` at ``fault_at`` s; the hang
watch reports ``detect.hang`` naming ``named`` (reason ``reason``) ``after`` seconds later; steps resume after
the heal. :meth:`but` makes the variations that break the property. :data:`HANG` is the check-safety entry:
name -> (strategy of holding cases, [(what, strategy of violating cases, verdict)]), each case a tuple
(events, params, scenario).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from hypothesis import strategies as st
from support import ev, ns, runs_in_worlds

from chaos.history.timeline import Event

FAULT = "hang-fault"


@dataclass(frozen=True)
class HangRun:
    world: int = 4
    hit: int = 2
    fault_at: float = 5.0
    after: float | None = 1.5  # None: no detect.hang at all
    named: tuple[int, ...] | None = None  # None: the hit rank
    reason: str = "stopped"
    injector: str = "freeze"
    with_fault: bool = True
    early_detection: bool = False  # a detect.hang naming the hit rank BEFORE the fault
    within: float | None = 10.0

    def but(self, **changes: Any) -> HangRun:
        return replace(self, **changes)

    def events(self) -> list[Event]:
        out = [ev(0.5, "runner.start", source="runner", seed=1)]
        out += [ev(0.6, "target.start", r, pid=100 + r, attempt=0) for r in range(self.world)]
        for step in range(1, 40):
            t = 1.0 + step * 0.1
            if self.fault_at <= t < self.fault_at + 4.0:
                continue
            out += [ev(t, "target.step", r, step=step) for r in range(self.world)]
        if self.early_detection:
            out.append(self._hang(self.fault_at - 1.0, (self.hit,)))
        if self.with_fault:
            source = "target" if self.injector != "freeze" else "runner"
            out.append(
                ev(
                    self.fault_at,
                    "fault.applied",
                    self.hit,
                    source=source,
                    fault=FAULT,
                    op="op-1",
                    injector=self.injector,
                    description=f"{self.injector} rank {self.hit}",
                )
            )
            out.append(ev(self.fault_at + 4.0, "fault.healed", self.hit, source=source, fault=FAULT, op="op-1"))
        if self.after is not None:
            named = (self.hit,) if self.named is None else self.named
            out.append(self._hang(self.fault_at + self.after, named))
        return sorted(out, key=lambda e: e.ts_ns)

    def _hang(self, t: float, named: tuple[int, ...]) -> Event:
        culprit = named[0] if len(named) == 1 else None
        waiting = [r for r in range(self.world) if r not in named]
        return ev(
            t,
            "detect.hang",
            culprit,
            source="runner",
            detector="flight_recorder",
            culprit_rank=culprit,
            culprit_ranks=list(named),
            reason=self.reason if named else "all_waiting",
            seq=40,
            op="all_reduce",
            nbytes=16384,
            step=12,
            waiting_ranks=waiting,
            stalled_s=1.2,
            hung_since_ns=ns(t - 1.2),
            evidence={},
        )

    def case(self) -> tuple[list[Event], dict[str, Any], None]:
        params: dict[str, Any] = {"fault": FAULT}
        if self.within is not None:
            params["within"] = self.within
        return self.events(), params, None


def hang_runs() -> st.SearchStrategy[HangRun]:
    return runs_in_worlds(
        HangRun,
        st.integers(2, 8),
        "hit",
        fault_at=st.floats(2.0, 4.0),
        after=st.floats(0.2, 5.0),
        reason=st.sampled_from(("stopped", "spinning", "not_in_collective", "wrong_collective")),
        injector=st.sampled_from(("freeze", "spin", "skip_collective")),
        within=st.sampled_from((None, 10.0)),
    )


def _other(run: HangRun) -> int:
    return (run.hit + 1) % run.world


HANG: dict[str, tuple[Any, list[tuple[str, Any, str]]]] = {
    "culprit_named": (
        hang_runs().map(HangRun.case),
        [
            (
                "the hang was pinned on another rank",
                hang_runs().map(lambda r: r.but(named=(_other(r),)).case()),
                "fail",
            ),
            ("the hang was pinned on nobody (all_waiting)", hang_runs().map(lambda r: r.but(named=()).case()), "fail"),
            (
                "the hang was pinned on the hit rank AND another",
                hang_runs().map(lambda r: r.but(named=tuple(sorted({r.hit, _other(r)}))).case()),
                "fail",
            ),
            ("named after the bound", hang_runs().map(lambda r: r.but(after=20.0, within=10.0).case()), "fail"),
            ("no detect.hang followed the fault", hang_runs().map(lambda r: r.but(after=None).case()), "unknown"),
            (
                "only a detect.hang from BEFORE the fault names the rank",
                hang_runs().map(lambda r: r.but(after=None, early_detection=True).case()),
                "unknown",
            ),
            (
                "only a detect.hang of a later episode (hung since after the heal) names the rank",
                hang_runs().map(lambda r: r.but(after=12.0, within=None).case()),
                "unknown",
            ),
            (
                "only a detect.hang of a later episode names the rank, within the bound",
                hang_runs().map(lambda r: r.but(after=8.0, within=10.0).case()),
                "unknown",
            ),
            ("the fault never applied", hang_runs().map(lambda r: r.but(with_fault=False).case()), "unknown"),
        ],
    ),
}
