"""The host-side helper of the ``slow`` injector: a SIGSTOP/SIGCONT duty cycle that outlives the harness.

``python -m injectors.process.dutycycle --op-id ID --pids 1,2 --start-times T1,T2 --stopped-fraction 0.5
--period 1.0 --until-ns N [--log PATH] [--foreground]`` detaches (see :func:`chaos.safety.deadman.detach`), then
each period stops the targets for ``stopped-fraction`` of it and continues them for the rest, until the
wall-clock deadline ``until-ns``, until every target has exited, or until SIGTERM/SIGINT. Whichever way it
ends (short of SIGKILL) it releases every target that is still the process it was told about: a pid whose
start time changed has been reused by a stranger and is never signalled.

Stops and continues go through the host's hold registry (:mod:`injectors.process.holds`): a stop phase marks
this op's hold as holding, a run phase (and the end) continues a target only when no other fault holds it, so
a freeze that overlaps the duty cycle lasts its whole duration. If the registry itself fails (an unwritable
state dir), the helper falls back to plain signals: a target left running beats a target left stopped.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from chaos.cluster.local import process_start_time
from chaos.plugins.injector import InjectionError
from chaos.safety.deadman import detach
from injectors.process.holds import SLACK_S, LocalHolds

MODULE = "injectors.process.dutycycle"
_SLICE_S = 0.05  # sleeps are sliced so a SIGTERM ends the cycle promptly without raising mid-signal


class _Cycle:
    def __init__(self, targets: dict[int, int], op_id: str, until_ns: int, holds: LocalHolds) -> None:
        self.targets = targets
        self.op_id = op_id
        self.until_ns = until_ns
        self.holds = holds
        self.stop_requested = False

    def request_stop(self, signum: int, frame: object) -> None:
        # A flag instead of an exception: an exception could fire inside the final SIGCONT and skip it.
        self.stop_requested = True

    def alive(self) -> list[int]:
        """Targets that still are the processes we were given (same pid AND same start time)."""
        gone = [pid for pid, start in self.targets.items() if process_start_time(pid) != start]
        for pid in gone:
            del self.targets[pid]
        return list(self.targets)

    def phase(self, holding: bool) -> None:
        """Stop every target (``holding``) or continue those no other fault holds; one target at a time, so a
        target we may not signal is dropped without costing the others their phase."""
        lasts_s = (self.until_ns - time.time_ns()) / 1e9 + SLACK_S
        for pid in self.alive():
            try:
                [outcome] = self.holds.hold(
                    [(pid, self.targets[pid])], self.op_id, lasts_s=lasts_s, holding=holding, signal=True
                )
            except InjectionError as exc:
                print(f"dutycycle: {exc}; dropping {pid}", flush=True)
                self.targets.pop(pid, None)
                continue
            except OSError as exc:
                print(f"dutycycle: hold registry failed ({exc}); signalling {pid} directly", flush=True)
                self._signal(pid, signal.SIGSTOP if holding else signal.SIGCONT)
                continue
            if outcome.gone:
                self.targets.pop(pid, None)

    def release(self) -> None:
        """The end: drop our holds and continue every target that no other fault holds."""
        for pid in self.alive():
            try:
                self.holds.release([(pid, self.targets[pid])], self.op_id, signal=True)
            except (InjectionError, OSError) as exc:
                print(f"dutycycle: release through the registry failed ({exc}); continuing {pid}", flush=True)
                self._signal(pid, signal.SIGCONT)

    def _signal(self, pid: int, signum: int) -> None:
        try:
            os.kill(pid, signum)
        except (ProcessLookupError, PermissionError):
            self.targets.pop(pid, None)

    def sleep_until(self, deadline: float) -> None:
        while not self.stop_requested and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, _SLICE_S))


def run(
    targets: dict[int, int],
    stopped_fraction: float,
    period_s: float,
    until_ns: int,
    *,
    op_id: str = "dutycycle",
    holds: LocalHolds | None = None,
) -> None:
    """Cycle ``targets`` (pid -> start time) until ``until_ns``; always releases them at the end."""
    cycle = _Cycle(dict(targets), op_id, until_ns, holds if holds is not None else LocalHolds())
    signal.signal(signal.SIGTERM, cycle.request_stop)
    signal.signal(signal.SIGINT, cycle.request_stop)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        while not cycle.stop_requested and cycle.alive():
            left_s = (until_ns - time.time_ns()) / 1e9
            if left_s <= 0:
                break
            start = time.monotonic()
            cycle.phase(holding=True)
            cycle.sleep_until(start + min(period_s * stopped_fraction, left_s))
            cycle.phase(holding=False)
            cycle.sleep_until(start + min(period_s, left_s))
    finally:
        cycle.release()


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}")
    parser.add_argument("--op-id", required=True, help="the fault op this helper belongs to (heal finds it by it)")
    parser.add_argument("--pids", type=_ints, required=True)
    parser.add_argument("--start-times", type=_ints, required=True)
    parser.add_argument("--stopped-fraction", type=float, required=True)
    parser.add_argument("--period", type=float, required=True, help="seconds")
    parser.add_argument("--until-ns", type=int, required=True, help="wall-clock deadline (time.time_ns)")
    parser.add_argument("--log", type=Path, default=None)
    parser.add_argument("--foreground", action="store_true", help="do not detach (debugging)")
    args = parser.parse_args(argv)
    if len(args.pids) != len(args.start_times):
        parser.error("--pids and --start-times must have the same length")
    if not 0 < args.stopped_fraction < 1 or args.period <= 0:
        parser.error("need 0 < --stopped-fraction < 1 and --period > 0")
    if not args.foreground:
        detach(args.log)
    targets = {pid: start for pid, start in zip(args.pids, args.start_times, strict=False) if pid != os.getpid()}
    print(f"dutycycle[{os.getpid()}] {args.op_id}: cycling {sorted(targets)}", flush=True)
    run(targets, args.stopped_fraction, args.period, args.until_ns, op_id=args.op_id)
    print(f"dutycycle[{os.getpid()}] {args.op_id}: done, targets released", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
