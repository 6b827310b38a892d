"""The dead-man switch for faults on remote hosts: a detached ``sh`` on the host itself.

A remote host may have no Python and no mlchaos, and the harness (with its journal) may be gone when the
switch has to fire, so the switch is the most portable thing there is: ``setsid -f sh -c SCRIPT`` with a
CONSTANT script that sleeps, then ``exec``s the injector's revert argv passed as positional parameters. No
scenario text is ever interpolated into the script. The marker (``$0``, a hash of the op) names the process
so heal can cancel it with ``pkill -f``; reverts are idempotent, so a switch that fires after a heal (or after
``mlchaos cleanup``) changes nothing. A switch that fired leaves ``/tmp/<marker>.fired`` (its revert's exit
status): :func:`fired` reads and removes it, so ``cleanup`` and the next run's start record the heal as the
dead-man's instead of healing again; a cancel (and a heal with its cancel) removes it too.

One round trip per host per action: :func:`armed_argv` arms the switch and, only once it runs, the fault's own
command (its text on stdin), in ONE command; :func:`disarmed_argv` runs the heal command and then cancels the
switch by its pid (its process group, so its ``sleep`` goes too; only while that pid still carries the marker,
so a reused pid is never hit). Both scripts are constants too; data reach them only as positional parameters.

A sleeping ``sh`` cannot be told a new deadline, so a switch is re-armed (a duration-less fault kept alive by a
live harness) by starting its next *generation* and then cancelling the previous one. Generation markers
extend the op's marker with a fixed-width ``g000001``, so cancelling one generation never matches another,
and cancelling the op's plain marker matches every generation at once.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from chaos.cluster.base import Transport, TransportError

MARKER_PREFIX = "mlchaos-deadman-"
# $0 = marker, $1 = seconds, $2.. = revert argv. It prints its pid (a session leader: ``setsid``), then detaches
# stdio so the SSH channel closes at once. It waits on a background ``sleep`` that a SIGTERM (a cancel) takes
# down with it, so a cancelled switch leaves no ``sleep`` behind. One line: :data:`DISARMED_SCRIPT` finds the
# marker with one ``read``.
SCRIPT = (
    "echo $$; exec </dev/null >/dev/null 2>&1; trap 'kill $! 2>/dev/null; exit 143' TERM; "
    'sleep "$1" & wait $!; trap - TERM; shift; "$@"; echo "$?" >"/tmp/$0.fired"'
)
# $1 = marker: print the status a fired switch of it left and remove the record; exit 1 when none fired.
FIRED_SCRIPT = 'for f in /tmp/"$1"*.fired; do [ -f "$f" ] || continue; cat "$f"; rm -f "$f"; exit 0; done; exit 1'
# $1$2 = marker (split, so this shell's own command line does not match it): cancel every switch of it and drop
# any record of one that fired; pkill's status.
CANCEL_SCRIPT = 'm=$1$2; pkill -f -- "$m"; rc=$?; rm -f /tmp/"$m"*.fired; exit $rc'

# $1 = k, $2 = stdin text, $3..$(k+2) = the switch's arm argv (prints its pid), the rest = the fault's command.
# The subshell keeps only the first k words and starts the switch; the command runs only once a pid came back.
ARMED_SCRIPT = """\
k=$1 input=$2; shift 2
pid=$(i=0; for w in "$@"; do if [ "$i" -eq 0 ]; then set --; fi; \
if [ "$i" -lt "$k" ]; then set -- "$@" "$w"; fi; i=$((i + 1)); done; exec "$@")
case $pid in ''|*[!0-9]*) echo "mlchaos: the dead-man switch did not start" >&2; exit 125;; esac
echo "$pid"
shift "$k"
printf '%s' "$input" | "$@"
"""

# $1 = marker, $2 = the switch's pid, $3 = stdin text, the rest = the heal command. The switch is cancelled only
# when the command succeeded (a failed heal keeps it armed) and only while that pid still carries the marker.
DISARMED_SCRIPT = """\
mark=$1 pid=$2 input=$3; shift 3
printf '%s' "$input" | "$@" || exit
{ IFS= read -r cmd; } 2>/dev/null <"/proc/$pid/cmdline"
case $cmd in *"$mark"*) kill -TERM "-$pid" 2>/dev/null;; esac
rm -f /tmp/"$mark"*.fired
exit 0
"""
# $@ = the switch's arm argv. Its pid line comes from the detached switch, which may write it after ``setsid``
# itself has exited: the command substitution waits for it (for a transport whose ``run`` returns at exit).
STARTED_SCRIPT = 'pid=$("$@") || exit; echo "$pid"'
ARMED_FAILED = 125  # the exit status of ARMED_SCRIPT when the switch did not start (the command never ran)
MAX_INPUT = 96 * 1024  # one argv word may hold 128 KiB (Linux MAX_ARG_STRLEN); larger texts take the long way


def marker(op_key: str, generation: int | None = None) -> str:
    """The process-name marker of the switch for ``op_key`` (letters and digits only: safe in pkill -f); with a
    ``generation`` (0 .. 999999), the marker of that generation alone."""
    base = MARKER_PREFIX + hashlib.sha256(op_key.encode()).hexdigest()[:16]
    if generation is None:
        return base
    if not 0 <= generation <= 999_999:
        raise ValueError(f"a dead-man generation is 0..999999, got {generation}")
    return f"{base}g{generation:06d}"


def arm_argv(op_key: str, revert_argv: list[str], fires_in_s: float, generation: int | None = None) -> list[str]:
    """The argv that starts the switch on a host (exposed for tests and docs)."""
    return ["setsid", "-f", "sh", "-c", SCRIPT, marker(op_key, generation), f"{fires_in_s:.3f}", *revert_argv]


def arm(
    transport: Transport, op_key: str, revert_argv: list[str], fires_in_s: float, *, generation: int | None = None
) -> str:
    """Start the switch on the transport's host; returns its marker (of ``generation`` when given).
    Raises TransportError if it cannot."""
    return start(transport, op_key, revert_argv, fires_in_s, generation=generation)[0]


def start(
    transport: Transport, op_key: str, revert_argv: list[str], fires_in_s: float, *, generation: int | None = None
) -> tuple[str, int | None]:
    """:func:`arm`, also returning the switch's pid (None when the host did not report one)."""
    argv = ["sh", "-c", STARTED_SCRIPT, "mlchaos-arm", *arm_argv(op_key, revert_argv, fires_in_s, generation)]
    done = transport.run(argv, timeout=15, check=True)
    return marker(op_key, generation), pid_of(done.stdout)


def pid_of(stdout: str) -> int | None:
    """The switch's pid from the first line a starting switch printed, or None."""
    first = stdout.split("\n", 1)[0].strip()
    return int(first) if first.isdigit() else None


@dataclass(frozen=True)
class HostCommand:
    """A fault's whole apply or heal as ONE command on its host: ``argv`` with ``input`` on its stdin."""

    argv: list[str]
    input: str = ""

    def fits(self) -> bool:
        """Whether ``input`` is small enough to travel as one argv word (see :data:`MAX_INPUT`)."""
        return len(self.input.encode()) <= MAX_INPUT


def armed_argv(
    op_key: str, revert_argv: list[str], fires_in_s: float, then: HostCommand, generation: int | None = None
) -> list[str]:
    """The argv that arms the switch and, only once it runs, runs ``then``: prints the switch's pid first, exits
    with ``then``'s status, or :data:`ARMED_FAILED` without running ``then`` when the switch did not start."""
    arm = arm_argv(op_key, revert_argv, fires_in_s, generation)
    return ["sh", "-c", ARMED_SCRIPT, "mlchaos-armed", str(len(arm)), then.input, *arm, *then.argv]


def disarmed_argv(mark: str, pid: int, then: HostCommand) -> list[str]:
    """The argv that runs ``then`` and, when it succeeded, cancels the switch ``mark`` running as ``pid``."""
    return ["sh", "-c", DISARMED_SCRIPT, "mlchaos-disarmed", _checked(mark), str(int(pid)), then.input, *then.argv]


def rearm(transport: Transport, op_key: str, revert_argv: list[str], fires_in_s: float, generation: int) -> str:
    """Replace generation ``generation`` of ``op_key``'s switch by the next one, firing ``fires_in_s`` from now;
    returns the new marker. The new one starts first, so the op is never without a switch; TransportError
    when it cannot start (the old one then stays armed)."""
    mark = arm(transport, op_key, revert_argv, fires_in_s, generation=generation + 1)
    disarm(transport, marker(op_key, generation))
    return mark


def disarm(transport: Transport, mark: str) -> bool:
    """Cancel the switch named ``mark`` on the host (and drop the record of one that fired); True if one was
    running. Never raises for 'not found'."""
    try:
        argv = ["sh", "-c", CANCEL_SCRIPT, "mlchaos-cancel", MARKER_PREFIX, _checked(mark)[len(MARKER_PREFIX) :]]
        return transport.run(argv, timeout=15).returncode == 0
    except TransportError:
        return False


def fired(transport: Transport, op_key: str) -> int | None:
    """The exit status of ``op_key``'s revert when a switch of it (any generation) fired on the host, whose
    record is then removed (so it is reported once); None when none fired. Raises TransportError when the host
    cannot be asked."""
    done = transport.run(["sh", "-c", FIRED_SCRIPT, "mlchaos-fired", marker(op_key)], timeout=15)
    status = done.stdout.strip()
    return int(status) if done.returncode == 0 and status.lstrip("-").isdigit() else None


def _checked(mark: str) -> str:
    if not mark.startswith(MARKER_PREFIX) or not mark[len(MARKER_PREFIX) :].isalnum():
        raise ValueError(f"not a dead-man marker: {mark!r}")
    return mark
