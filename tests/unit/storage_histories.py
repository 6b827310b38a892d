"""Hand-made histories of the storage recovery stories, for ``restore_straggler_named`` and
``retried_with_backoff`` (the event contract in chaos/event_kinds.py: ``storage.hit`` from the fault layer,
``target.restore`` / ``target.checkpoint_retry`` / ``target.checkpoint_failed`` from the job).

:class:`StragglerRun`: ``world`` ranks step from t=1 s; a read-latency fault on rank ``aimed``'s files applies at
4 s, rank ``world - 1`` is killed at 5 s, every rank restarts (attempt 1) at 6 s and restores the step-10
checkpoint; the layer delays ``slow``'s reads (``aimed`` unless changed) by ``delay`` seconds.

:class:`RetryRun`: an EIO window over the checkpoint dir applies at 10 s; rank 0's step-20 save fails at 10.2 s
and is retried after ``base`` x ``growth``^k (capped at ``cap``) until the window ends; each failure meets
``errors`` errors of the layer (create, then the cleanup's unlink); the save commits after the window.
:meth:`but` makes the variations that break a property.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from hypothesis import strategies as st
from support import ev, ns, runs_in_worlds

from chaos.history.timeline import Event

FAULT = "ckpt-storage"


def applied(t: float, mode: str) -> Event:
    return ev(
        t,
        "fault.applied",
        source="runner",
        fault=FAULT,
        op="op-1",
        injector="storage",
        host="local",
        description=f"FUSE {mode} over /ckpt",
    )


def hit(op: str, path: str, times: list[float], errno_name: str | None, latency: float = 0.0) -> Event:
    stamps = [ns(t) for t in sorted(times)]
    return Event(
        ts_ns=stamps[0],
        kind="storage.hit",
        source="injector",
        data={
            "op_id": "op-1",
            "fault": FAULT,
            "host": "local",
            "op": op,
            "path": path,
            "mount": "/ckpt",
            "mode": "latency" if errno_name is None else "eio",
            "errno_name": errno_name,
            "latency_s": latency,
            "count": len(stamps),
            "first_ns": stamps[0],
            "last_ns": stamps[-1],
            "times_ns": stamps[:256],
        },
    )


@dataclass(frozen=True)
class StragglerRun:
    world: int = 3
    aimed: int = 1
    slow: int | None = None  # the rank whose restore is actually slow (None: aimed)
    delay: float = 2.0
    base: float = 0.1
    restores: bool = True
    aimed_restores: bool = True
    hits: bool = True
    resumes: bool = True
    attempts: bool = True  # False: no event carries an attempt (a job that does not report them)

    def but(self, **changes: Any) -> StragglerRun:
        return replace(self, **changes)

    def events(self) -> list[Event]:
        found = [applied(4.0, "latency")]
        for attempt, t0 in ((0, 0.0), (1, 6.0)):
            found += [
                ev(t0, "target.start", r, pid=100 * (attempt + 1) + r, attempt=attempt) for r in range(self.world)
            ]
        found += [
            ev(1.0 + 0.2 * s, "target.step", r, step=s, attempt=0) for s in range(1, 15) for r in range(self.world)
        ]
        found.append(ev(5.0, "fault.applied", source="runner", fault="kill", op="op-2", injector="kill", rank=2))
        slow = self.aimed if self.slow is None else self.slow
        ends = []
        for r in range(self.world):
            took = self.base + 0.01 * r + (self.delay if r == slow else 0.0)
            end = 6.5 + took
            ends.append(end)
            if self.restores and (self.aimed_restores or r != self.aimed):
                found.append(ev(end, "target.restore", r, step=10, path="/ckpt/step-10", duration_s=took, bytes=4096))
            if r == slow and self.hits:
                found.append(hit("read", f"step-10/rank-{self.aimed}.pt", [6.55, 6.5 + took / 2], None, self.delay / 2))
        if self.resumes:
            found += [
                ev(max(ends) + 0.1 + 0.2 * i, "target.step", r, step=11 + i, attempt=1)
                for i in range(4)
                for r in range(self.world)
            ]
        if not self.attempts:
            found = [e.model_copy(update={"data": {k: v for k, v in e.data.items() if k != "attempt"}}) for e in found]
        return found


def straggler_runs() -> st.SearchStrategy[StragglerRun]:
    return runs_in_worlds(
        StragglerRun, st.integers(2, 4), "aimed", delay=st.floats(0.5, 6.0), base=st.floats(0.02, 0.4)
    )


def other_rank(run: StragglerRun) -> int:
    return (run.aimed + 1) % run.world


@dataclass(frozen=True)
class RetryRun:
    base: float = 0.2
    growth: float = 2.0
    cap: float = 10.0
    window: float = 3.0  # the error window's length from the first failure
    errors: int = 2  # layer errors per failed attempt
    report: bool = True  # the job reports target.checkpoint_retry (a user job may not)
    gives_up: bool = False
    crashes: bool = False
    succeeds: bool = True
    spin: int = 0  # > 0: a tight loop of this many attempts 1 ms apart, instead of the backoff
    hits: bool = True

    def but(self, **changes: Any) -> RetryRun:
        return replace(self, **changes)

    def failures(self) -> list[float]:
        if self.spin:
            return [10.2 + 0.001 * i for i in range(self.spin)]
        times, t, k = [], 10.2, 0
        while t < 10.2 + self.window:
            times.append(t)
            t += min(self.base * self.growth**k, self.cap) + 0.01  # the delay, then the attempt itself
            k += 1
        return times if not self.crashes else times[:1]

    def events(self) -> list[Event]:
        found = [applied(10.0, "eio"), ev(0.0, "target.start", 0, pid=100, attempt=0)]
        found += [ev(0.5 * s, "target.step", 0, step=s, attempt=0) for s in range(1, 21)]
        found.append(ev(5.0, "target.checkpoint", 0, step=10, path="/ckpt/step-10", attempt=0))
        fails = self.failures()
        if self.hits:
            found.append(hit("create", "step-20/rank-0.pt.tmp", fails, "EIO"))
            if self.errors > 1:
                found.append(hit("unlink", "step-20/rank-0.pt.tmp", [t + 0.002 for t in fails], "EIO"))
        last = fails[-1]
        if self.crashes:
            found.append(ev(last + 0.3, "target.exit", source="runner", code=1))
            return found
        if self.report:
            for k, t in enumerate(fails if not self.gives_up else fails[:-1]):
                delay = min(self.base * self.growth**k, self.cap) if not self.spin else 0.0
                found.append(
                    ev(
                        t + 0.001,
                        "target.checkpoint_retry",
                        0,
                        step=20,
                        attempt=k + 1,
                        errno_name="EIO",
                        error="[Errno 5] Input/output error",
                        delay_s=delay,
                    )
                )
        if self.gives_up:
            found.append(ev(last + 0.001, "target.checkpoint_failed", 0, step=20, attempts=len(fails), error="EIO"))
            found.append(ev(last + 0.2, "target.exit", source="runner", code=1))
            return found
        found.append(ev(10.0 + self.window + 1.0, "fault.healed", source="runner", fault=FAULT, op="op-1"))
        if self.succeeds:
            done = (
                max(last + min(self.base * self.growth ** min(len(fails), 30), self.cap), 10.0 + self.window + 1.0)
                + 0.05
            )
            found.append(ev(done, "target.checkpoint", 0, step=20, path="/ckpt/step-20", attempt=0))
            found += [ev(done + 0.5 * i, "target.step", 0, step=21 + i, attempt=0) for i in range(3)]
            found.append(ev(done + 2.0, "target.exit", source="runner", code=0))
        return found


@st.composite
def retry_runs(draw: st.DrawFn) -> RetryRun:
    return RetryRun(
        base=draw(st.floats(0.05, 0.4)),
        growth=draw(st.floats(1.8, 3.0)),
        window=draw(st.floats(2.0, 4.0)),
        errors=draw(st.integers(1, 2)),
        report=draw(st.booleans()),
    )


# -- the safety suite's cases: per check, (histories that hold, [(what, violating histories, verdict)]), each
# history as (events, params); tests/unit/test_check_safety.py wraps them in its Case/Entry/Violation.

Cases = st.SearchStrategy[tuple[list[Event], dict[str, Any]]]


def _straggler(run: StragglerRun, **params: Any) -> tuple[list[Event], dict[str, Any]]:
    return run.events(), {"fault": FAULT, **params}


def _retry(run: RetryRun, **params: Any) -> tuple[list[Event], dict[str, Any]]:
    return run.events(), {"fault": FAULT, **params}


STORAGE_RECOVERY: dict[str, tuple[Cases, list[tuple[str, Cases, str]]]] = {
    "restore_straggler_named": (
        st.one_of(
            straggler_runs().map(lambda r: _straggler(r)),
            straggler_runs().map(lambda r: _straggler(r, rank=r.aimed, min_excess=0.2, resume_within=30)),
            straggler_runs().map(lambda r: _straggler(r.but(attempts=False))),
        ),
        [
            (
                "another rank is the slowest restore",
                straggler_runs().map(lambda r: _straggler(r.but(slow=other_rank(r)))),
                "fail",
            ),
            (
                "the delayed rank never reports its restore",
                straggler_runs().map(lambda r: _straggler(r.but(aimed_restores=False))),
                "fail",
            ),
            (
                "no rank stands out (no delay), min_excess 0.5s",
                straggler_runs().map(lambda r: _straggler(r.but(delay=0.0), min_excess=0.5)),
                "fail",
            ),
            (
                "the job never steps after the restore",
                straggler_runs().map(lambda r: _straggler(r.but(resumes=False))),
                "fail",
            ),
            (
                "the job never steps after the restore, and reports no attempts (steps before the fault remain)",
                straggler_runs().map(lambda r: _straggler(r.but(resumes=False, attempts=False))),
                "fail",
            ),
            (
                "time to resume over its bound",
                straggler_runs().map(lambda r: _straggler(r, resume_within=0.01)),
                "fail",
            ),
            ("no restore evidence", straggler_runs().map(lambda r: _straggler(r.but(restores=False))), "unknown"),
            ("the layer delayed no read", straggler_runs().map(lambda r: _straggler(r.but(hits=False))), "unknown"),
        ],
    ),
    "retried_with_backoff": (
        st.one_of(
            retry_runs().map(lambda r: _retry(r)),
            # capped backoff: the gaps stop growing at the cap, which the check is told
            retry_runs().map(lambda r: _retry(r.but(base=0.2, growth=2.0, cap=0.8, window=5.0), cap=0.8)),
        ),
        [
            ("it crashes on the first error", retry_runs().map(lambda r: _retry(r.but(crashes=True))), "fail"),
            (
                "a tight loop it does not report (1000 tries in 1 s)",
                retry_runs().map(lambda r: _retry(r.but(spin=1000, report=False))),
                "fail",
            ),
            (
                "a tight loop it reports (50 tries 1 ms apart)",
                retry_runs().map(lambda r: _retry(r.but(spin=50, report=True))),
                "fail",
            ),
            (
                "a fixed delay: the gaps do not grow",
                retry_runs().map(lambda r: _retry(r.but(growth=1.0, base=0.5))),
                "fail",
            ),
            ("it gives up", retry_runs().map(lambda r: _retry(r.but(gives_up=True))), "fail"),
            ("the save never succeeds", retry_runs().map(lambda r: _retry(r.but(succeeds=False))), "fail"),
            ("the layer returned no error", retry_runs().map(lambda r: _retry(r.but(hits=False))), "unknown"),
            ("too short a window to see a backoff", retry_runs().map(lambda r: _retry(r.but(window=0.01))), "unknown"),
        ],
    ),
}
