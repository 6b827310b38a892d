"""Histories of replica groups (torchft-like) for the replica-aware checks: a simulator and its knobs.

N replicas ``g.0`` … ``g.<N-1>`` commit one global step every ``period`` seconds in lockstep; the fault
``kill-g`` (a kill selecting ``replica: g.<victim>``) lands at ``fault_at``; the victim's processes exit
(``target.role_exit`` code -9), it is restarted, and from ``back_at`` on it commits the survivors' current
step again (it healed from a peer). Each committed step comes with a ``target.digest`` per replica. The knobs
break one property at a time: a survivor that dies or stalls, a victim that never returns or restarts from
scratch, a rejoined replica whose parameters stay stale.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Any

from chaos.history.timeline import Event
from injectors.process.faults import KillParams

SECOND = 1_000_000_000
FAULT = "kill-g"


def at(seconds: float) -> int:
    return int(seconds * SECOND)


@dataclass(frozen=True)
class ReplicaRun:
    """One run of the group, with the knobs of the module docstring: :meth:`events` is its history,
    :meth:`scenario` the scenario its checks read the fault from."""

    replicas: int = 2
    victim: int = 1
    period: float = 0.5
    fault_at: float = 5.0
    back_at: float | None = 9.0  # None: the victim never commits again
    end_at: float = 15.0
    survivor_dies_at: float | None = None  # the first survivor exits with code 1 then
    survivor_stalls: tuple[float, float] | None = None  # the first survivor commits nothing in [a, b)
    from_scratch: bool = False  # the victim commits steps 1, 2 … again instead of the peers' step
    stale_digest: bool = False  # the victim's digests after its return differ from the others'
    victim_joined: bool = True  # False: the victim commits nothing before the fault (it was still starting)
    applied: bool = True

    def name(self, index: int) -> str:
        return f"g.{index}"

    @property
    def survivor(self) -> int:
        return 0 if self.victim != 0 else 1

    def scenario(self) -> Any:
        fault = SimpleNamespace(name=FAULT, type="kill", params=KillParams(replica=self.name(self.victim)))
        return SimpleNamespace(faults=[fault], target=None, safety=SimpleNamespace(no_progress_timeout=None))

    def events(self) -> list[Event]:
        out: list[Event] = []
        for index in range(self.replicas):
            name = self.name(index)
            out.append(
                Event(ts_ns=at(0.1), kind="target.role_start", source="runner", data={"replica": name, "attempt": 0})
            )
        steps = int(self.end_at / self.period)
        restart_step = 0
        for k in range(1, steps + 1):
            t = k * self.period
            for index in range(self.replicas):
                name = self.name(index)
                step = k
                if index == self.victim and not self.victim_joined and at(t) < at(self.fault_at):
                    continue
                if index == self.victim and at(t) >= at(self.fault_at):  # compared in ns, as the check does
                    if self.back_at is None or at(t) < at(self.back_at):
                        continue
                    if self.from_scratch:
                        restart_step += 1
                        step = restart_step
                if index == self.survivor:
                    if self.survivor_dies_at is not None and t >= self.survivor_dies_at:
                        continue
                    if self.survivor_stalls is not None and self.survivor_stalls[0] <= t < self.survivor_stalls[1]:
                        continue
                ts = at(t) + index * 1000
                out.append(Event(ts_ns=ts, kind="target.step", rank=0, data={"step": step, "replica": name}))
                stale = self.stale_digest and index == self.victim and at(t) >= at(self.fault_at)
                digest = f"{'bad' if stale else 'ok'}-{step}"
                out.append(
                    Event(
                        ts_ns=ts + 1,
                        kind="target.digest",
                        rank=0,
                        data={"step": step, "replica": name, "digest": digest},
                    )
                )
        if self.applied:
            victim = self.name(self.victim)
            out.append(
                Event(ts_ns=at(self.fault_at), kind="fault.applied", source="runner", data={"fault": FAULT, "op": "1"})
            )
            exit_data: dict[str, Any] = {"replica": victim, "code": -9, "attempt": 0, "expected": False}
            out.append(
                Event(ts_ns=at(self.fault_at) + 5_000_000, kind="target.role_exit", source="runner", data=exit_data)
            )
            if self.back_at is not None:
                start = {"replica": victim, "attempt": 1}
                out.append(Event(ts_ns=at(self.fault_at + 1), kind="target.role_start", source="runner", data=start))
        if self.survivor_dies_at is not None:
            data = {"replica": self.name(self.survivor), "code": 1, "attempt": 0, "expected": False}
            out.append(Event(ts_ns=at(self.survivor_dies_at), kind="target.role_exit", source="runner", data=data))
        out.append(Event(ts_ns=at(self.end_at + 0.5), kind="target.exit", source="runner", data={"code": 0}))
        return out

    def but(self, **changes: Any) -> ReplicaRun:
        return replace(self, **changes)
