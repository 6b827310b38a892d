"""Histories of checkpoint faults for the checkpoint checks' tests and the check safety suite.

A run: W ranks commit a checkpoint every K steps (every rank reports ``target.checkpoint`` for the step's
directory), then one ``checkpoint_*`` fault damages a checkpoint (``fault.checkpoint``): ``corrupt`` or
``drop_shard`` the newest committed one, ``torn_write`` the next one while it is written (never committed),
``stale_pointer`` a pointer to a next one that never completed. The job restarts and every rank resumes, having
verified it, from the newest intact checkpoint (``expected``). :class:`CkptRun` makes the ways to break that.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from hypothesis import strategies as st
from pydantic import JsonValue

from chaos.history.timeline import Event

FAULT = "ckpt-fault"
MODES = ("corrupt", "drop_shard", "torn_write", "stale_pointer")
SECOND = 1_000_000_000
ROOT = "/run/checkpoints"


def ckpt(step: int) -> str:
    return f"{ROOT}/ckpt-{step:06d}"


@dataclass(frozen=True)
class CkptRun:
    """One simulated run; ``resumes`` are every rank's resume after the fault (``None``: the damaged step)."""

    world: int
    every: int
    committed: int  # how many checkpoints were committed before the fault
    mode: str
    resume_steps: tuple[int | None, ...] | None = None  # per rank; None: every rank resumes ``expected``
    verified: bool = True
    with_damage: bool = True
    with_resume: bool = True
    silent_ranks: bool = False  # only rank 0 reports its resume; the others restart and step from scratch

    @property
    def damaged_step(self) -> int:
        last = self.committed * self.every
        return last if self.mode in ("corrupt", "drop_shard") else last + self.every

    @property
    def expected(self) -> int:
        last = self.committed * self.every
        return last - self.every if self.mode in ("corrupt", "drop_shard") else last

    def but(self, **changes: object) -> CkptRun:
        return replace(self, **changes)  # type: ignore[arg-type]

    @property
    def events(self) -> list[Event]:
        events: list[Event] = []
        t = SECOND
        for n in range(1, self.committed + 1):
            step = n * self.every
            t += SECOND
            for rank in range(self.world):
                saved: dict[str, JsonValue] = {"step": step, "path": ckpt(step), "attempt": 0, "files": self.world}
                events.append(Event(ts_ns=t + rank, kind="target.checkpoint", source="target", rank=rank, data=saved))
        t += SECOND
        events.append(Event(ts_ns=t, kind="fault.applied", data={"fault": FAULT, "op": f"{FAULT}#1", "injector": "x"}))
        damaged = self.damaged_step
        committed = self.mode in ("corrupt", "drop_shard")
        file = f"{ckpt(damaged)}/rank-{self.world - 1}.pt" if self.mode != "stale_pointer" else f"{ROOT}/latest"
        if self.mode == "torn_write":
            file = f"{ckpt(damaged)}/.rank-0.pt.tmp.4242"
        if self.with_damage:
            damage: dict[str, JsonValue] = {
                "fault": FAULT,
                "op": f"{FAULT}#1",
                "mode": self.mode,
                "path": file,
                "checkpoint": ckpt(damaged),
                "step": damaged if committed else None,
            }
            events.append(Event(ts_ns=t + 1, kind="fault.checkpoint", data=damage))
        t += 2 * SECOND
        events.append(Event(ts_ns=t, kind="target.restart", source="target", rank=0, data={"attempt": 1}))
        if self.with_resume:
            steps = self.resume_steps or (self.expected,) * self.world
            for rank, chosen in enumerate(steps):
                at = damaged if chosen is None else chosen
                start: dict[str, JsonValue] = {"attempt": 1, "pid": 200 + rank}
                events.append(Event(ts_ns=t + rank, kind="target.start", source="target", rank=rank, data=start))
                if self.silent_ranks and rank > 0:
                    at = 0  # started over: the first step is 1, and no target.resume is reported
                else:
                    data: dict[str, JsonValue] = {"step": at, "attempt": 1, "path": ckpt(at)}
                    if self.verified:
                        data |= {"verified": True, "rejected": [s for s in (damaged,) if s > at]}
                    else:
                        data = {"step": at, "attempt": 1, "path": None, "seen": "first step"}  # the agent's inference
                    events.append(
                        Event(ts_ns=t + SECOND + rank, kind="target.resume", source="target", rank=rank, data=data)
                    )
                stepped: dict[str, JsonValue] = {"step": at + 1, "attempt": 1}
                events.append(
                    Event(ts_ns=t + 2 * SECOND + rank, kind="target.step", source="target", rank=rank, data=stepped)
                )
        return events


def ckpt_runs() -> st.SearchStrategy[CkptRun]:
    """Runs where the property holds: 1-3 ranks, checkpoints every 2-5 steps, 3-5 committed, any mode."""
    return st.builds(
        CkptRun,
        world=st.integers(1, 3),
        every=st.integers(2, 5),
        committed=st.integers(3, 5),
        mode=st.sampled_from(MODES),
    )


def resumed_damaged(run: CkptRun) -> CkptRun:
    """Every rank resumed from the damaged checkpoint (and says it verified it)."""
    return run.but(resume_steps=(None,) * run.world)


def resumed_older(run: CkptRun) -> CkptRun:
    """Every rank resumed one checkpoint further back than the newest intact one: work lost for nothing."""
    return run.but(resume_steps=(run.expected - run.every,) * run.world)


def ranks_disagree(run: CkptRun) -> CkptRun:
    """Rank 0 resumed from the newest intact checkpoint, the others from an older one (needs 2+ ranks)."""
    world = max(run.world, 2)
    return run.but(world=world, resume_steps=(run.expected,) + (run.expected - run.every,) * (world - 1))


# -- the safety suite's cases: per check, (histories that hold, [(what, violating histories, verdict)]), each
# history as (events, params); tests/unit/test_check_safety.py wraps them in its Case/Entry/Violation.

Cases = st.SearchStrategy[tuple[list[Event], dict[str, Any]]]


def _case(run: CkptRun, **params: Any) -> tuple[list[Event], dict[str, Any]]:
    return run.events, {"fault": FAULT, **params}


RUNS = ckpt_runs()
CHECKPOINT: dict[str, tuple[Cases, list[tuple[str, Cases, str]]]] = {
    "resumed_from_verified_checkpoint": (
        RUNS.map(lambda r: _case(r)),
        [
            ("every rank resumed from the damaged checkpoint", RUNS.map(lambda r: _case(resumed_damaged(r))), "fail"),
            ("the job resumed without verifying", RUNS.map(lambda r: _case(r.but(verified=False))), "fail"),
            (
                "an unverified resume from the damaged step (a user job's inferred resume)",
                RUNS.filter(lambda r: r.mode in ("corrupt", "drop_shard")).map(
                    lambda r: _case(resumed_damaged(r).but(verified=False))
                ),
                "fail",
            ),
            ("the fault damaged nothing", RUNS.map(lambda r: _case(r.but(with_damage=False))), "unknown"),
            ("no resume after the damage", RUNS.map(lambda r: _case(r.but(with_resume=False))), "unknown"),
        ],
    ),
    "fell_back_to": (
        st.one_of(RUNS.map(lambda r: _case(r, step="newest_intact")), RUNS.map(lambda r: _case(r, step=r.expected))),
        [
            ("resumed from the damaged checkpoint", RUNS.map(lambda r: _case(resumed_damaged(r))), "fail"),
            ("resumed further back than the newest intact", RUNS.map(lambda r: _case(resumed_older(r))), "fail"),
            ("the ranks resumed from different steps", RUNS.map(lambda r: _case(ranks_disagree(r))), "fail"),
            (
                "only rank 0 reported a resume; the other ranks restarted and stepped from scratch",
                RUNS.map(lambda r: _case(r.but(world=max(r.world, 2), silent_ranks=True))),
                "unknown",
            ),
            (
                "resumed from the newest intact, but the scenario expects another step",
                RUNS.map(lambda r: _case(r, step=r.expected - r.every)),
                "fail",
            ),
            ("the fault damaged nothing", RUNS.map(lambda r: _case(r.but(with_damage=False))), "unknown"),
            ("no resume after the damage", RUNS.map(lambda r: _case(r.but(with_resume=False))), "unknown"),
        ],
    ),
}
