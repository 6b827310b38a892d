"""Histories of a late-detected corruption and the rollback after it, for ``rolled_back_before_corruption``.

W ranks train ``steps`` steps in lockstep (one step every 0.1 s), write a checkpoint every ``ckpt_every`` steps,
and the consistency guard checks every ``check_every`` steps (its verdict reported one step later, as the real
guard's pipelined exchange does). The fault ``flip`` corrupts rank ``victim`` at ``fault_step``; the first check
at or after it reports ``detect.divergence`` at the end of the next step, and then (by default) every rank rolls
back in place to the newest checkpoint at or before the last clean check (scratch, step 0, when none) and
replays to the end. The knobs break one property at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

from hypothesis import strategies as st

from chaos.history.timeline import Event

FAULT = "flip"
STEP_NS = 100_000_000
Style = Literal["inplace", "resume", "both"]


@dataclass(frozen=True)
class RollbackRun:
    world: int = 3
    steps: int = 40
    ckpt_every: int = 5
    check_every: int = 10
    fault_step: int = 13
    victim: int = 1
    style: Style = "inplace"  # target.rollback in place | a restart that only reports target.resume | both
    to_step: int | None = None  # where the ranks roll back to; None: the right target
    rollback: bool = True  # False: the job trains on after the detection
    next_offset: int = 1  # the first step after the rollback is to_step + next_offset
    resume_step: int | None = None  # style "both": the restart resumes here instead of at to_step
    stop_at: int | None = None  # after the rollback the job stops at this step (None: runs to the end)
    only_rank0: bool = False  # only rank 0 rolls back; the others train on
    detect: bool = True
    redetect: bool = False  # a second detection after the rollback, with no rollback after it
    with_fault: bool = True
    fault_step_known: bool = True  # False: the fault.applied (from the runner) carries no step
    to_step_known: bool = True

    def but(self, **changes: object) -> RollbackRun:
        return replace(self, **changes)  # type: ignore[arg-type]

    @property
    def detected(self) -> int:
        """The step of the first check at or after the fault."""
        return -(-self.fault_step // self.check_every) * self.check_every

    @property
    def last_clean(self) -> int | None:
        clean = (self.detected // self.check_every - 1) * self.check_every
        return clean if clean > 0 else None

    @property
    def right_target(self) -> int:
        clean = self.last_clean
        return 0 if clean is None else (clean // self.ckpt_every) * self.ckpt_every

    @property
    def newest_checkpoint(self) -> int:
        """The newest checkpoint when the detection is reported (end of step detected + 1)."""
        return (self.detected // self.ckpt_every) * self.ckpt_every

    def events(self) -> list[Event]:
        out: list[Event] = []
        t = 1_000_000_000

        def ev(kind: str, rank: int | None, source: str = "target", **data: object) -> None:
            nonlocal t
            t += 1  # every event its own time: ties would be ordered by content, not as emitted
            out.append(Event(ts_ns=t, kind=kind, source=source, rank=rank, data=data))  # type: ignore[arg-type]

        for r in range(self.world):
            ev("target.start", r, attempt=0, pid=100 + r)
        attempt = 0
        step = 1
        rolled = False
        to = self.right_target if self.to_step is None else self.to_step
        while step <= self.steps:
            t += STEP_NS
            if self.with_fault and step == self.fault_step and not rolled:
                if self.fault_step_known:
                    ev("fault.applied", self.victim, fault=FAULT, op=1, injector="bitflip", step=step)
                else:
                    ev("fault.applied", None, "runner", fault=FAULT, op=1, injector="bitflip", host="local")
                t += 1000
            for r in range(self.world):
                ev("target.step", r, step=step, attempt=attempt, loss=0.1)
            if step % self.ckpt_every == 0:
                ev("target.checkpoint", 0, step=step, attempt=attempt)
            checked = step - 1
            if checked > 0 and checked % self.check_every == 0:
                diverged = self.with_fault and self.fault_step <= checked and not rolled
                ev(
                    "guard.consistency",
                    0,
                    step=checked,
                    agree=not diverged,
                    odd_ranks=[self.victim] if diverged else [],
                )
                if diverged and self.detect and checked == self.detected:
                    t += 1000
                    ev(
                        "detect.divergence",
                        self.victim,
                        step=checked,
                        culprit_rank=self.victim,
                        odd_ranks=[self.victim],
                        detector="consistency",
                    )
                    if self.rollback:
                        t += 1000
                        rolled = True
                        attempt = self._roll_back(ev, step, to, attempt)
                        step = to + self.next_offset
                        continue
            if rolled and self.redetect and step == self.steps - 1:
                ev("detect.divergence", self.victim, step=step - 1, odd_ranks=[self.victim], detector="consistency")
            if rolled and self.stop_at is not None and step >= self.stop_at:
                break
            step += 1
        for r in range(self.world):
            ev("target.digest", r, digest="d" * 64, step=step - 1, attempt=attempt)
        return out

    def _roll_back(self, emit: Callable[..., None], from_step: int, to: int, attempt: int) -> int:
        ranks = [0] if self.only_rank0 else list(range(self.world))
        data = {"to_step": to} if self.to_step_known else {}
        if self.style in ("inplace", "both"):
            for r in ranks:
                emit(
                    "target.rollback",
                    r,
                    from_step=from_step,
                    detected_step=self.detected,
                    last_clean_step=self.last_clean,
                    reason="divergence",
                    **data,
                )
        if self.style in ("resume", "both"):
            attempt += 1
            resumed = to if self.resume_step is None else self.resume_step
            for r in ranks:
                emit("target.start", r, attempt=attempt, pid=200 + r)
                emit("target.resume", r, attempt=attempt, **({"step": resumed} if self.to_step_known else {}))
        return attempt


@st.composite
def rollback_runs(draw: st.DrawFn, *, poisoned_newest: bool = False) -> RollbackRun:
    """A run whose property holds (knobs at their defaults), with a random shape. ``poisoned_newest``: only shapes
    whose newest checkpoint at the detection is at or after the fault step (so rolling back to it is wrong)."""
    check_every = draw(st.integers(2, 8))
    ckpt_every = draw(st.integers(1, check_every))
    fault_step = draw(st.integers(1, 24))
    run = RollbackRun(
        world=draw(st.integers(2, 4)),
        steps=36,
        ckpt_every=ckpt_every,
        check_every=check_every,
        fault_step=fault_step,
        victim=draw(st.integers(0, 1)),
        style=draw(st.sampled_from(["inplace", "resume", "both"])),
    )
    if poisoned_newest and run.newest_checkpoint < run.fault_step:
        run = run.but(fault_step=run.newest_checkpoint) if run.newest_checkpoint > 0 else run.but(ckpt_every=1)
    return run


# --- the check safety suite's entry (tests/unit/test_check_safety.py builds its Entry from these) ------------

CaseTuple = tuple[list[Event], dict[str, object], None]


def _case(run: RollbackRun) -> CaseTuple:
    return (run.events(), {"fault": FAULT}, None)


_RUNS = rollback_runs()
_POISONED = rollback_runs(poisoned_newest=True)
ROLLBACK: dict[str, tuple[st.SearchStrategy[CaseTuple], list[tuple[str, st.SearchStrategy[CaseTuple], str]]]] = {
    "rolled_back_before_corruption": (
        _RUNS.map(_case),
        [
            (
                "rolled back to the newest checkpoint, which already holds the corruption",
                _POISONED.map(lambda r: _case(r.but(to_step=r.newest_checkpoint))),
                "fail",
            ),
            (
                "rolled back to a checkpoint between the corruption and the detection",
                _RUNS.map(lambda r: _case(r.but(to_step=r.fault_step))),
                "fail",
            ),
            (
                "trained on after the detection without rolling back",
                _RUNS.map(lambda r: _case(r.but(rollback=False))),
                "fail",
            ),
            (
                "reported a rollback but went on without replaying",
                _RUNS.map(lambda r: _case(r.but(next_offset=r.detected - r.right_target + 2))),
                "fail",
            ),
            (
                "rolled back, then a restart resumed from the newest checkpoint",
                _POISONED.map(lambda r: _case(r.but(style="both", resume_step=r.newest_checkpoint))),
                "fail",
            ),
            (
                "stopped before getting past the detection",
                _RUNS.map(lambda r: _case(r.but(stop_at=r.detected))),
                "fail",
            ),
            ("only rank 0 rolled back", _RUNS.map(lambda r: _case(r.but(only_rank0=True))), "fail"),
            (
                "detected again after the rollback, never rolled back again",
                _RUNS.map(lambda r: _case(r.but(redetect=True))),
                "fail",
            ),
            ("no detection: nothing to roll back from", _RUNS.map(lambda r: _case(r.but(detect=False))), "unknown"),
            ("the fault never applied", _RUNS.map(lambda r: _case(r.but(with_fault=False))), "unknown"),
            ("the rollback names no step", _RUNS.map(lambda r: _case(r.but(to_step_known=False))), "unknown"),
        ],
    )
}
