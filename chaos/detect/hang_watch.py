"""The hang watch: reads every rank's collective flight recorder (:mod:`chaos.injob.flight_recorder`) and /proc
state from OUTSIDE the job, and names the rank a hang is waiting for (``detect.hang``).

On for a torchrun target with ``hang_watch: {hang_after: 3s}``: the harness then sets ``CHAOS_FLIGHT_DIR`` to
``<run_dir>/flight`` in the job's environment (the agent's recorder writes there) and polls the directory
every ``poll`` seconds (0.2). Nothing here talks to the job: a stopped (SIGSTOP) or spinning rank is read the
same as a healthy one.

What is read, per rank file: the recorder's state and, from ``/proc/<pid>/stat`` of the pid it names (only when
that process's kernel start time matches the file's: a reused pid is never read), the scheduler state and the
CPU time. Ranks on other hosts: covered when their recorder file is visible here (the netns testbed shares this
machine's filesystem and pid namespace); on SSH hosts without a shared filesystem their files are not read
(no hang is named for them), which :meth:`HangWatch.coverage` says.

A hang: some live rank has been inside a collective for ``hang_after`` seconds and no rank completed a
collective in that time. It is judged once per episode (:func:`judge`), in this order:

1. ``stopped``: a rank in state ``T``/``t`` (SIGSTOPped) is the culprit;
2. ``spinning`` / ``not_in_collective``: the live ranks that are NOT inside a collective while their peers are
   (``spinning`` when each of them is running (``R``) or used at least 30% of a CPU since the last poll: on a
   busy machine a spinning rank waits for a CPU part of the time, so its share alone can be low);
3. ``wrong_collective``: every rank is inside a collective, but one (a minority) is in a different one
   (a different (step, index in the step, op, bytes, group)): it skipped or added one;
4. ``all_waiting``: every rank is waiting in the same collective: no rank is odd, the link or fabric is
   (``culprit_rank`` null; a listener such as a link probe takes it from there).

``detect.hang`` (source runner, rank = the culprit, or null): {detector: "flight_recorder", culprit_rank,
culprit_ranks, reason, seq, op, nbytes, step (of the collective the waiting ranks are in), waiting_ranks,
stalled_s, hung_since_ns, evidence: {rank: {proc, cpu_s, in_collective, started, completed, step, index, op,
nbytes, seq, group, since_s}}}. The episode ends when any rank completes a collective again (or the ranks'
processes change: a restart); the next hang is a new episode.

Listeners (:func:`register_listener`, or ``listeners=``) are called with every ``detect.hang`` on a thread of
their own (a link probe takes seconds); the events they return join the history at the next poll.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import JsonValue

from chaos.event_kinds import DETECT_HANG, RUNNER_HANG_LISTENER_ERROR
from chaos.history.timeline import Event
from chaos.injob.flight_recorder import ENV_FLIGHT_DIR, FlightState, read_state
from chaos.kernel.procfs import parse_stat
from chaos.spec.scenario import Scenario, TorchrunTarget

DETECTOR = "flight_recorder"
REASONS = ("stopped", "spinning", "not_in_collective", "wrong_collective", "all_waiting")
FLIGHT_DIR = "flight"
DEFAULT_POLL_S = 0.2
SPIN_SHARE = 0.3  # CPU seconds per wall second over the last interval that counts as spinning

Listener = Callable[[Event], Iterable[Event]]
ProcReader = Callable[[int], str | None]  # pid -> the text of /proc/<pid>/stat, or None
LISTENERS: list[Listener] = []


def register_listener(listener: Listener) -> None:
    """Call ``listener`` with every ``detect.hang`` of every later run (e.g. a link probe on ``all_waiting``)."""
    if listener not in LISTENERS:
        LISTENERS.append(listener)


def local_stat(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


@dataclass(frozen=True)
class RankView:
    """One rank at one poll: its recorder state, its process state (``T``, ``R``, ``S``, ``D``…; ``gone`` when
    the process is not there any more; ``unknown`` when /proc cannot be read from here), and the CPU seconds it
    used per wall second since the previous poll (None on the first look)."""

    state: FlightState
    proc: str
    cpu_share: float | None = None
    cpu_s: float | None = None

    @property
    def rank(self) -> int:
        return self.state.rank

    @property
    def live(self) -> bool:
        return self.proc not in ("gone", "Z", "X")


@dataclass(frozen=True)
class Verdict:
    """What :func:`judge` found: the culprit(s) and why, and the collective the waiting ranks are in."""

    reason: str
    culprits: tuple[int, ...]
    waiting: tuple[int, ...]
    hung_since_ns: int
    signature: tuple[int, int, str, int, int] | None  # (step, index, op, nbytes, group) of the waiting majority
    seq: int | None


def _signature(view: RankView) -> tuple[int, int, str, int, int] | None:
    current = view.state.current
    if current is None:
        return None
    return (current.step, current.index, current.op, current.nbytes, current.group)


def judge(views: Sequence[RankView], now_ns: int, hang_after_s: float) -> Verdict | None:
    """The hang the ranks show at ``now_ns``, or None (see the module docstring for the rules, in order)."""
    live = [v for v in views if v.live]
    if len(live) < 2:
        return None
    waiting = [v for v in live if v.state.in_collective]
    if not waiting:
        return None
    after_ns = int(hang_after_s * 1e9)
    earliest = min(v.state.current.start_ns for v in waiting if v.state.current is not None)
    last_done = max((v.state.completed_ns for v in views), default=0)
    hung_since = max(last_done, earliest)
    if now_ns - hung_since < after_ns:
        return None
    counts = Counter(_signature(v) for v in waiting)
    common, _ = counts.most_common(1)[0]
    seq = next((v.state.current.seq for v in waiting if _signature(v) == common and v.state.current), None)
    ids = tuple(v.rank for v in waiting)

    def verdict(reason: str, culprits: Sequence[int]) -> Verdict:
        return Verdict(reason, tuple(sorted(culprits)), ids, hung_since, common, seq)

    stopped = [v.rank for v in live if v.proc in ("T", "t")]
    if stopped:
        return verdict("stopped", stopped)
    elsewhere = [v for v in live if not v.state.in_collective]
    if elsewhere:
        spinning = all(v.proc == "R" or (v.cpu_share or 0.0) >= SPIN_SHARE for v in elsewhere)
        return verdict("spinning" if spinning else "not_in_collective", [v.rank for v in elsewhere])
    if len(counts) > 1:
        ranked = counts.most_common()
        if ranked[0][1] > ranked[1][1]:  # a strict majority collective: the others are odd
            return verdict("wrong_collective", [v.rank for v in waiting if _signature(v) != common])
        return verdict("wrong_collective", [])  # no majority: no single rank can be named
    return verdict("all_waiting", [])


def hang_event(verdict: Verdict, views: Sequence[RankView], now_ns: int) -> Event:
    """The ``detect.hang`` event of ``verdict`` (contract in the module docstring)."""
    evidence: dict[str, JsonValue] = {}
    for view in views:
        state, current = view.state, view.state.current
        evidence[str(view.rank)] = {
            "proc": view.proc,
            "cpu_share": None if view.cpu_share is None else round(view.cpu_share, 3),
            "cpu_s": view.cpu_s,
            "pid": state.pid,
            "host": state.host,
            "in_collective": state.in_collective,
            "started": state.started,
            "completed": state.completed,
            "step": state.step,
            "next_index": state.next_index,
            "seq": None if current is None else current.seq,
            "op": None if current is None else current.op,
            "nbytes": None if current is None else current.nbytes,
            "index": None if current is None else current.index,
            "collective_step": None if current is None else current.step,
            "group": None if current is None else current.group,
            "since_s": None if current is None else round((now_ns - current.start_ns) / 1e9, 3),
        }
    culprit = verdict.culprits[0] if len(verdict.culprits) == 1 else None
    sig = verdict.signature
    data: dict[str, JsonValue] = {
        "detector": DETECTOR,
        "culprit_rank": culprit,
        "culprit_ranks": list(verdict.culprits),
        "reason": verdict.reason,
        "seq": verdict.seq,
        "op": None if sig is None else sig[2],
        "nbytes": None if sig is None else sig[3],
        "step": None if sig is None else sig[0],
        "index": None if sig is None else sig[1],
        "waiting_ranks": list(verdict.waiting),
        "stalled_s": round((now_ns - verdict.hung_since_ns) / 1e9, 3),
        "hung_since_ns": verdict.hung_since_ns,
        "evidence": evidence,
    }
    return Event(ts_ns=now_ns, kind=DETECT_HANG, source="runner", rank=culprit, data=data)


class HangWatch:
    """Polls ``directory`` (every rank's ``rank-<R>.flight``) and emits one ``detect.hang`` per hang episode."""

    def __init__(
        self,
        directory: Path,
        *,
        hang_after: float,
        poll_s: float = DEFAULT_POLL_S,
        listeners: Sequence[Listener] | None = None,
        proc_stat: ProcReader = local_stat,
    ) -> None:
        self.directory = directory
        self.hang_after = hang_after
        self.poll_s = poll_s
        self.listeners = LISTENERS if listeners is None else list(listeners)
        self._proc_stat = proc_stat
        self._last_poll = 0.0
        self._cpu: dict[int, tuple[int, float, int]] = {}  # rank -> (pid, cpu seconds, at ns)
        self._episode: tuple[tuple[int, int, int], ...] | None = None  # (rank, pid, completed) at the detection
        self._extra: list[Event] = []
        self._lock = threading.Lock()
        self.detections = 0
        self._ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def env(self) -> dict[str, str]:
        """What the job's environment needs for its agent to record."""
        return {ENV_FLIGHT_DIR: str(self.directory)}

    def coverage(self) -> list[int]:
        """The ranks whose recorder file is visible here (a rank missing from it is not watched)."""
        return sorted(state.rank for state in self._states())

    def _states(self) -> list[FlightState]:
        try:
            paths = sorted(self.directory.glob("rank-*.flight"))
        except OSError:
            return []
        return [state for state in (read_state(path) for path in paths) if state is not None]

    def views(self, now_ns: int) -> list[RankView]:
        """Every visible rank now, with its process state and CPU share since the last look."""
        found = []
        for state in self._states():
            stat = self._proc_stat(state.pid) if state.pid > 0 else None
            proc, cpu = _parse_stat(stat, state.start_time, self._ticks)
            share = None
            if cpu is not None:
                previous = self._cpu.get(state.rank)
                if previous is not None and previous[0] == state.pid and now_ns > previous[2]:
                    share = (cpu - previous[1]) / ((now_ns - previous[2]) / 1e9)
                self._cpu[state.rank] = (state.pid, cpu, now_ns)
            found.append(RankView(state, proc, share, cpu))
        return found

    def poll(self, now_ns: int | None = None, *, force: bool = False) -> list[Event]:
        """Look (at most every ``poll_s``, unless ``force``); the new ``detect.hang`` and listener events."""
        with self._lock:
            events, self._extra = self._extra, []
        mono = time.monotonic()
        if not force and mono - self._last_poll < self.poll_s:
            return events
        self._last_poll = mono
        now = time.time_ns() if now_ns is None else now_ns
        views = self.views(now)
        key = tuple((v.rank, v.state.pid, v.state.completed) for v in views)
        if self._episode is not None:
            before = {(rank, pid): done for rank, pid, done in self._episode}
            moved = any(before.get((rank, pid), -1) != done for rank, pid, done in key)
            if not moved:
                return events
            self._episode = None  # a collective completed (or the processes changed): the episode is over
        verdict = judge(views, now, self.hang_after)
        if verdict is None:
            return events
        self._episode = key
        event = hang_event(verdict, views, now)
        self.detections += 1
        if self.listeners:
            threading.Thread(target=self._tell, args=(event,), name="mlchaos-hang-listeners", daemon=True).start()
        return [*events, event]

    def _tell(self, event: Event) -> None:
        for listener in self.listeners:
            try:
                produced = list(listener(event))
            except Exception as exc:  # noqa: BLE001  (a listener's failure is recorded, never the run's)
                produced = [
                    Event(ts_ns=time.time_ns(), kind=RUNNER_HANG_LISTENER_ERROR, data={"error": str(exc)[:500]})
                ]
            with self._lock:
                self._extra.extend(produced)


def _parse_stat(stat: str | None, start_time: int, ticks: int) -> tuple[str, float | None]:
    """(scheduler state, CPU seconds) from a /proc/PID/stat text; ``gone`` when it is another process or none."""
    if stat is None:
        return "gone", None
    parsed = parse_stat(stat)
    if parsed is None:
        return "unknown", None
    if start_time and parsed.start_time != start_time:
        return "gone", None
    return parsed.state, parsed.cpu_ticks / ticks


def for_scenario(scenario: Scenario, run_dir: Path) -> HangWatch | None:
    """The hang watch a scenario asks for (a torchrun target's ``hang_watch``), or None."""
    target = scenario.target
    spec = target.hang_watch if isinstance(target, TorchrunTarget) else None
    if spec is None:
        return None
    return HangWatch(run_dir / FLIGHT_DIR, hang_after=spec.hang_after, poll_s=spec.poll)


def job_env(watch: HangWatch | None) -> dict[str, str]:
    return {} if watch is None else watch.env()


def poll(watch: HangWatch | None) -> list[Event]:
    return [] if watch is None else watch.poll()


__all__ = [
    "DETECT_HANG",
    "LISTENERS",
    "REASONS",
    "HangWatch",
    "RankView",
    "Verdict",
    "for_scenario",
    "hang_event",
    "job_env",
    "judge",
    "poll",
    "register_listener",
]
