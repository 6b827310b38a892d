"""Counted holds on stopped processes: a process two faults stop is continued only when the last one lets go.

``freeze`` holds its processes stopped from apply to heal. ``slow`` registers on its processes from apply to
heal, and its duty-cycle helper (:mod:`injectors.process.dutycycle`) marks its hold as *holding* only during
its stop phases. A SIGCONT is sent only when no other live hold on that process is holding, so healing a slow
duty cycle (or one of its run phases) never ends a freeze early, and healing a freeze never cuts a slow
fault's stop phase short.

The registry lives on the process's host, where both the harness (through the transport) and the helper (in
Python) see it: ``<state dir>/holds`` by the rule of :func:`chaos.safety.state.state_dir`, applied in the
host's own environment. Per process (pid AND kernel start time, so a recycled pid is another process) and per
fault op, one file ``<pid>-<start>.<tag>.hold`` reads ``<expires, unix s> <holding 0|1> <op id>``; per
process, ``<pid>-<start>.lock`` is ``flock``-ed around each decision, so "nobody else holds it, so SIGCONT" is
atomic against another fault's "hold it, then SIGSTOP".

A hold lasts until its op releases it or, if nobody ever does (the harness and the helper both died), until
its expiry: the fault's own end plus :data:`SLACK_S`. The dead-man's revert (:func:`revert_argv`) drops its op's
hold and sends an unconditional SIGCONT, the last resort; so a harness that dies leaves no hold behind once its
switches have fired, and a stale hold can delay a later SIGCONT but never prevent one for good.

The harness runs the registry in Python on this machine (:class:`LocalHolds`) and through the constant
:data:`SCRIPT` (``sh``, ``flock`` when present, ``kill``) on any other host (:class:`RemoteHolds`); both
implement the same file protocol, and the tests hold them to it.
"""

from __future__ import annotations

import fcntl
import hashlib
import math
import os
import signal as signals
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from pydantic import JsonValue

from chaos.cluster.base import Transport, TransportError
from chaos.cluster.local import process_start_time
from chaos.event_kinds import FAULT_OVERLAP
from chaos.history.timeline import Event, now_ns
from chaos.plugins.injector import Applied, InjectionContext, InjectionError
from chaos.safety.state import state_dir

SCRIPT_NAME = "mlchaos-holds"  # $0 of SCRIPT: marks its process (selectors by name never pick it)
SLACK_S = 30.0  # a hold outlives its fault's planned end by this much before it counts as stale
Target = tuple[int, int]  # (pid, kernel start time)


@dataclass(frozen=True)
class Holder:
    """Another fault op's live hold on a process; ``holding`` when it wants the process stopped right now."""

    op_id: str
    holding: bool


@dataclass(frozen=True)
class Outcome:
    """What one hold or release found on one process: the other live holds, and whether it stays stopped.

    ``stays_stopped`` is True when a release (or a run phase) did not continue the process because another
    hold is holding it; ``gone`` when the process is no longer the one recorded (exited, or its pid reused).
    """

    pid: int
    others: tuple[Holder, ...]
    stays_stopped: bool = False
    gone: bool = False

    @property
    def held_by_others(self) -> bool:
        return any(holder.holding for holder in self.others)


class Holds(Protocol):
    """A host's hold registry (see the module docstring)."""

    def hold(
        self, targets: Sequence[Target], op_id: str, *, lasts_s: float, holding: bool, signal: bool
    ) -> list[Outcome]:
        """Record (or update) ``op_id``'s hold on each target, expiring ``lasts_s`` from now. With ``signal``:
        SIGSTOP when ``holding``, else SIGCONT unless another live hold is holding."""
        ...

    def release(self, targets: Sequence[Target], op_id: str, *, signal: bool) -> list[Outcome]:
        """Drop ``op_id``'s hold on each target (fine when there is none); with ``signal``, SIGCONT each one that
        no other live hold is holding."""
        ...


def tag(op_id: str) -> str:
    """The file-name tag of ``op_id``'s holds (op ids may hold characters unfit for file names)."""
    return hashlib.sha256(op_id.encode()).hexdigest()[:16]


def folder() -> Path:
    """This machine's hold registry."""
    return state_dir() / "holds"


class LocalHolds:
    """The registry of this machine, in Python: what the harness uses here and what the duty-cycle helper uses
    on whichever host it runs."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root if root is not None else folder()

    def hold(
        self, targets: Sequence[Target], op_id: str, *, lasts_s: float, holding: bool, signal: bool
    ) -> list[Outcome]:
        # Whole seconds, compared with the floor of the clock: rounded up so the hold lasts at least ``lasts_s``
        # (int(now) + 1 made a 1 s hold taken late in a second expire a moment later).
        expires = math.ceil(time.time() + max(1.0, lasts_s))
        return [self._decide(pid, start, op_id, (expires, holding), signal) for pid, start in targets]

    def release(self, targets: Sequence[Target], op_id: str, *, signal: bool) -> list[Outcome]:
        return [self._decide(pid, start, op_id, None, signal) for pid, start in targets]

    def _decide(self, pid: int, start: int, op_id: str, mine: tuple[int, bool] | None, signal: bool) -> Outcome:
        """Under the process's lock: write (``mine`` = (expires, holding)) or drop our hold, read the others,
        then signal as :class:`Holds` says."""
        self.root.mkdir(parents=True, exist_ok=True)
        key = f"{pid}-{start}"
        lock = os.open(self.root / f"{key}.lock", os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            path = self.root / f"{key}.{tag(op_id)}.hold"
            now = int(time.time())
            if process_start_time(pid) != start:  # exited or reused: nothing to signal, nothing to keep
                for stale in self.root.glob(f"{key}.*.hold"):
                    stale.unlink(missing_ok=True)
                return Outcome(pid, (), gone=True)
            if mine is not None:
                temporary = path.with_suffix(".new")
                temporary.write_text(f"{mine[0]} {int(mine[1])} {op_id}\n", encoding="utf-8")
                os.replace(temporary, path)
            else:
                path.unlink(missing_ok=True)
            others = tuple(self._others(key, path, now))
            held = any(holder.holding for holder in others)
            if not signal:
                return Outcome(pid, others)
            if mine is not None and mine[1]:
                _kill(pid, signals.SIGSTOP)
                return Outcome(pid, others)
            if held:
                return Outcome(pid, others, stays_stopped=True)
            _kill(pid, signals.SIGCONT)
            return Outcome(pid, others)
        finally:
            os.close(lock)  # closing the only descriptor releases the flock

    def _others(self, key: str, mine: Path, now: int) -> list[Holder]:
        found = []
        for path in sorted(self.root.glob(f"{key}.*.hold")):
            if path == mine:
                continue
            try:
                expires_text, holding_text, op_id = path.read_text(encoding="utf-8").split(maxsplit=2)
                expires = int(expires_text)
            except (OSError, ValueError):
                path.unlink(missing_ok=True)  # torn or foreign: it holds nothing
                continue
            if expires <= now:
                path.unlink(missing_ok=True)  # its owner died without releasing it
                continue
            found.append(Holder(op_id.strip(), holding_text == "1"))
        return found


def _kill(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass  # exited since we looked: nothing left to stop or continue
    except PermissionError as exc:
        raise InjectionError(f"cannot send {signals.Signals(signum).name} to pid {pid}: {exc}") from exc


# The registry on a host reached through a transport, and every dead-man's revert of a stop. A CONSTANT script:
# every piece of data (action, tag, op id, seconds, flags, pid-starttime keys) arrives as a positional
# parameter, never as code. ``hold``/``release`` mirror LocalHolds._decide line for line; without flock(1) on
# the host they run unlocked (a narrower guarantee, the same files). ``revert`` is the dead-man's last resort:
# drop the op's hold and SIGCONT unconditionally, needing nothing but sh, cat, rm and kill. The start time is
# field 22 of /proc/PID/stat, counted after the ")" that ends the command name.
SCRIPT = r"""
action=$1 tag=$2 op=$3 secs=$4 holding=$5 signal=$6
shift 6
if [ -n "${MLCHAOS_STATE_DIR:-}" ]; then dir=$MLCHAOS_STATE_DIR
elif [ "$(id -u)" = 0 ]; then dir=/var/lib/mlchaos
else dir=${HOME:-/nonexistent}/.local/state/mlchaos
fi
dir=$dir/holds
rp=')'
started() {
  st=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  set -f; set -- ${st##*"$rp"}; set +f
  if [ "$#" -ge 20 ]; then shift 19; echo "$1"; fi
}
rc=0
if [ "$action" = revert ]; then
  for key in "$@"; do
    pid=${key%-*} start=${key#*-}
    case "$pid:$start" in :*|*:|*[!0-9:]*) rc=2; continue ;; esac
    rm -f "$dir/$key.$tag.hold"
    if [ "$(started "$pid")" = "$start" ]; then kill -s CONT "$pid" || rc=1; fi
  done
  exit "$rc"
fi
mkdir -p "$dir" || exit 3
for key in "$@"; do
  pid=${key%-*} start=${key#*-}
  case "$pid:$start" in :*|*:|*[!0-9:]*) echo "bad process key: $key" >&2; rc=2; continue ;; esac
  (
    if command -v flock >/dev/null 2>&1; then
      exec 9>>"$dir/$key.lock" || exit 4
      flock -w 30 9 || exit 4
    fi
    now=$(date +%s)
    mine=$dir/$key.$tag.hold
    if [ "$(started "$pid")" != "$start" ]; then
      rm -f "$dir/$key".*.hold
      echo "gone $pid"
      exit 0
    fi
    if [ "$action" = hold ]; then
      # now is the clock's floor: +1 so the hold lasts at least secs
      printf '%s %s %s\n' "$((now + secs + 1))" "$holding" "$op" >"$mine.new" && mv -f "$mine.new" "$mine" || exit 5
    else
      rm -f "$mine"
    fi
    held=0
    for f in "$dir/$key".*.hold; do
      [ "$f" = "$mine" ] && continue
      [ -f "$f" ] || continue
      exp= other_holding= other=
      read -r exp other_holding other <"$f" || true
      case "$exp" in ''|*[!0-9]*) rm -f "$f"; continue ;; esac
      if [ "$exp" -le "$now" ]; then rm -f "$f"; continue; fi
      echo "other $pid $other_holding $other"
      if [ "$other_holding" = 1 ]; then held=1; fi
    done
    if [ "$signal" = 1 ]; then
      if [ "$action" = hold ] && [ "$holding" = 1 ]; then
        kill -s STOP "$pid" || exit 6
      elif [ "$held" = 1 ]; then
        echo "stays $pid"
      else
        kill -s CONT "$pid" || exit 6
      fi
    fi
  ) || rc=1
done
exit "$rc"
"""


def script_argv(
    action: str, op_id: str, targets: Sequence[Target], *, lasts_s: float = 0.0, holding: bool = False, signal: bool
) -> list[str]:
    """The argv that runs :data:`SCRIPT` on a host: ``action`` is ``hold``, ``release`` or ``revert``."""
    if action not in ("hold", "release", "revert"):
        raise ValueError(f"unknown hold action {action!r}")
    seconds = str(max(1, math.ceil(lasts_s)))
    keys = [f"{int(pid)}-{int(start)}" for pid, start in targets]
    flags = [str(int(holding)), str(int(signal))]
    return ["sh", "-c", SCRIPT, SCRIPT_NAME, action, tag(op_id), op_id, seconds, *flags, *keys]


def revert_argv(op_id: str, targets: Sequence[Target]) -> list[str] | None:
    """The dead-man's revert of a stop: drop ``op_id``'s hold on each target and SIGCONT it unconditionally
    (when it is still the recorded process). Dropping the hold matters: a stale hold would otherwise keep a
    later fault's heal from continuing the process until the hold expired. None without targets."""
    return script_argv("revert", op_id, targets, signal=True) if targets else None


def parse_outcomes(output: str, targets: Sequence[Target]) -> list[Outcome]:
    """The :class:`Outcome` of each target from :data:`SCRIPT`'s output lines (``other``, ``stays``, ``gone``)."""
    others: dict[int, list[Holder]] = {pid: [] for pid, _ in targets}
    stays: set[int] = set()
    gone: set[int] = set()
    for line in output.splitlines():
        word, _, rest = line.partition(" ")
        if word == "other":
            pid_text, _, rest = rest.partition(" ")
            holding_text, _, op_id = rest.partition(" ")
            if pid_text.isdigit() and int(pid_text) in others:
                others[int(pid_text)].append(Holder(op_id.strip(), holding_text == "1"))
        elif word in ("stays", "gone") and rest.strip().isdigit():
            (stays if word == "stays" else gone).add(int(rest.strip()))
    return [Outcome(pid, tuple(others[pid]), stays_stopped=pid in stays, gone=pid in gone) for pid, _ in targets]


class RemoteHolds:
    """The registry of the transport's host, driven through :data:`SCRIPT` (one command per call)."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport

    def hold(
        self, targets: Sequence[Target], op_id: str, *, lasts_s: float, holding: bool, signal: bool
    ) -> list[Outcome]:
        return self._run(script_argv("hold", op_id, targets, lasts_s=lasts_s, holding=holding, signal=signal), targets)

    def release(self, targets: Sequence[Target], op_id: str, *, signal: bool) -> list[Outcome]:
        return self._run(script_argv("release", op_id, targets, signal=signal), targets)

    def _run(self, argv: list[str], targets: Sequence[Target]) -> list[Outcome]:
        if not targets:
            return []
        try:
            done = self.transport.run(argv, timeout=60)
        except TransportError as exc:
            raise InjectionError(f"cannot update the process holds on {self.transport.host}: {exc}") from exc
        if not done.ok:
            said = (done.stderr or done.stdout).strip()[:300]
            raise InjectionError(f"process holds on {self.transport.host} failed (exit {done.returncode}): {said}")
        return parse_outcomes(done.stdout, targets)


def record_overlaps(ctx: InjectionContext, applied: Applied, outcomes: Sequence[Outcome], *, healed: bool) -> None:
    """Record one ``fault.overlap`` event in ``ctx.history`` when other faults hold any of ``applied``'s processes:
    at apply (``healed=False``) and at heal, naming the processes its heal left stopped. Nothing otherwise."""
    shared = [outcome for outcome in outcomes if outcome.others]
    if ctx.history is None or not shared:
        return
    others = sorted({holder.op_id for outcome in shared for holder in outcome.others})
    pids = [outcome.pid for outcome in shared]
    stopped = [outcome.pid for outcome in shared if outcome.stays_stopped]
    names = ", ".join(others)
    where = f"pid{'s' if len(pids) > 1 else ''} {', '.join(map(str, pids))}"
    if not healed:
        text = f"applied on {where}, also held by {names}"
    elif stopped:
        text = f"healed; {where} stay stopped: still held by {names}"
    else:
        text = f"healed; {where} also under {names}"
    data: dict[str, JsonValue] = {
        "fault": applied.fault,
        "op": applied.op_id.removesuffix(f"@{applied.host}"),  # the plan's op id, as fault.applied names it
        "injector": applied.injector,
        "host": applied.host,
        "phase": "heal" if healed else "apply",
        "with": list(others),
        "pids": list(pids),
        "stays_stopped": list(stopped),
        "description": text,
    }
    ctx.history.append(Event(ts_ns=now_ns(), kind=FAULT_OVERLAP, data=data))
