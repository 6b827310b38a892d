"""Hand-made histories of the rendezvous-store story, for ``rerendezvous_within`` (contract: ``target.rendezvous``
per host from the agents' INFO lines, ``target.step``, ``target.node_exit``/``target.exit``,
``detect.rendezvous_error``; ``fault.applied`` of the kill that starts the clock).

:class:`RdzvRun`: ``nodes`` agents complete a round at t=1 s and train; the fault (a kill) fires at ``fault_at``; then
either every node joins a new round ``rejoin_after`` seconds later and training resumes (recovered), or every agent
exits ``exit_after`` seconds later, one of them naming a rendezvous error (gave up). :meth:`but` makes the variations
that break the property. :data:`RENDEZVOUS` is the check-safety entry: name -> (strategy of holding cases, [(what,
strategy of violating cases, verdict)]), each case a tuple (events, params, scenario).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from hypothesis import strategies as st
from support import ev

from chaos.history.timeline import Event

FAULT = "kill-rank"


@dataclass(frozen=True)
class RdzvRun:
    nodes: int = 3
    fault_at: float = 6.0
    outcome: str = "recovered"
    rejoin_after: float | None = 12.0  # None: no new round
    rejoining: int | None = None  # how many nodes join the new round (None: all)
    resumed: bool = True  # steps after the new round
    exit_after: float | None = None  # the agents exit this long after the fault (None: they never do)
    exiting: int | None = None  # how many agents exit (None: all)
    exit_code: int = 1
    rdzv_error: bool = True  # an agent names a rendezvous error before exiting
    first_round: bool = True  # the round before the fault was read
    with_fault: bool = True
    within: float = 30.0

    def but(self, **changes: Any) -> RdzvRun:
        return replace(self, **changes)

    def events(self) -> list[Event]:
        hosts = [f"h{i + 1}" for i in range(self.nodes)]
        out = [ev(0.5, "runner.start", source="runner", seed=1)]
        if self.first_round:
            out += [ev(1.0, "target.rendezvous", source="torchrun", host=h, detector="torchrun") for h in hosts]
        out += [ev(1.2, "target.start", r, host=h, attempt=0) for r, h in enumerate(hosts)]
        out += [
            ev(1.5 + s * 0.1, "target.step", r, step=s)
            for s in range(int((self.fault_at - 1.6) / 0.1))
            for r in range(self.nodes)
        ]
        if self.with_fault:
            out.append(
                ev(
                    self.fault_at,
                    "fault.applied",
                    self.nodes - 1,
                    source="runner",
                    fault=FAULT,
                    op="op-1",
                    injector="kill",
                    host=hosts[-1],
                )
            )
        if self.rejoin_after is not None:
            t = self.fault_at + self.rejoin_after
            joined = hosts[: self.rejoining if self.rejoining is not None else self.nodes]
            out += [ev(t, "target.rendezvous", source="torchrun", host=h, detector="torchrun") for h in joined]
            if self.resumed:
                out += [
                    ev(t + 1.0 + s * 0.1, "target.step", r, step=30 + s) for s in range(5) for r in range(self.nodes)
                ]
        if self.exit_after is not None:
            t = self.fault_at + self.exit_after
            if self.rdzv_error:
                out.append(
                    ev(
                        t - 0.5,
                        "detect.rendezvous_error",
                        source="torchrun",
                        host=hosts[0],
                        detector="torchrun",
                        error="RendezvousConnectionError: The connection to the C10d store has failed.",
                    )
                )
            leaving = hosts[: self.exiting if self.exiting is not None else self.nodes]
            out += [
                ev(t + 0.01 * i, "target.node_exit", source="runner", host=h, code=self.exit_code)
                for i, h in enumerate(leaving)
            ]
            if len(leaving) == self.nodes:
                out.append(ev(t + 0.1, "target.exit", source="runner", code=self.exit_code))
        return sorted(out, key=lambda e: e.ts_ns)

    def case(self) -> tuple[list[Event], dict[str, Any], None]:
        return self.events(), {"fault": FAULT, "within": self.within, "outcome": self.outcome}, None


def recovered_runs() -> st.SearchStrategy[RdzvRun]:
    return st.builds(RdzvRun, nodes=st.integers(2, 5), fault_at=st.floats(3.0, 8.0), rejoin_after=st.floats(0.5, 25.0))


def gave_up_runs() -> st.SearchStrategy[RdzvRun]:
    return st.builds(
        RdzvRun,
        nodes=st.integers(2, 5),
        fault_at=st.floats(3.0, 8.0),
        outcome=st.just("gave_up"),
        rejoin_after=st.just(None),
        exit_after=st.floats(1.0, 25.0),
        exit_code=st.integers(1, 143),
    )


def _cases(runs: st.SearchStrategy[RdzvRun], **changes: Any) -> st.SearchStrategy[tuple[Any, ...]]:
    return runs.map(lambda r: r.but(**changes).case())


RENDEZVOUS: dict[str, tuple[Any, list[tuple[str, Any, str]]]] = {
    "rerendezvous_within": (
        st.one_of(_cases(recovered_runs()), _cases(gave_up_runs())),
        [
            ("recovered: a node never joined a new round", _cases(recovered_runs(), rejoining=1), "fail"),
            ("recovered: the new round came after the bound", _cases(recovered_runs(), rejoin_after=45.0), "fail"),
            ("recovered: nothing trained after the new round", _cases(recovered_runs(), resumed=False), "fail"),
            (
                "recovered: the job gave up instead",
                _cases(recovered_runs(), rejoin_after=None, exit_after=5.0),
                "fail",
            ),
            ("gave_up: the agents met again instead", _cases(gave_up_runs(), rejoin_after=3.0), "fail"),
            ("gave_up: an agent never exited (hung)", _cases(gave_up_runs(), exiting=1), "fail"),
            ("gave_up: an agent exited 0", _cases(gave_up_runs(), exit_code=0), "fail"),
            ("gave_up: exits without a rendezvous error", _cases(gave_up_runs(), rdzv_error=False), "fail"),
            ("gave_up: the agents gave up after the bound", _cases(gave_up_runs(), exit_after=45.0), "fail"),
            ("no round was read before the fault", _cases(recovered_runs(), first_round=False), "unknown"),
            ("the fault never applied", _cases(recovered_runs(), with_fault=False), "unknown"),
        ],
    ),
}
