"""The dead-man switch for faults on remote hosts: a detached ``sh`` on the host itself.

A remote host may have no Python and no mlchaos, and the harness (with its journal) may be gone when the
switch has to fire, so the switch is the most portable thing there is: ``setsid -f sh -c SCRIPT`` with a
CONSTANT script that sleeps, then ``exec``s the injector's revert argv passed as positional parameters. No
scenario text is ever interpolated into the script. The marker (``$0``, a hash of the op) names the process
so heal can cancel it with ``pkill -f``; reverts are idempotent, so a switch that fires after a heal (or after
``mlchaos cleanup``) changes nothing.

A sleeping ``sh`` cannot be told a new deadline, so a switch is re-armed (a duration-less fault kept alive by a
live harness) by starting its next *generation* and then cancelling the previous one. Generation markers
extend the op's marker with a fixed-width ``g000001``, so cancelling one generation never matches another,
and cancelling the op's plain marker matches every generation at once.
"""

from __future__ import annotations

import hashlib

from chaos.cluster.base import Transport, TransportError

MARKER_PREFIX = "mlchaos-deadman-"
# $0 = marker, $1 = seconds, $2.. = revert argv. Stdio is detached first so the SSH channel closes at once.
SCRIPT = 'exec </dev/null >/dev/null 2>&1; sleep "$1"; shift; exec "$@"'


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
    transport.run(arm_argv(op_key, revert_argv, fires_in_s, generation), timeout=15, check=True)
    return marker(op_key, generation)


def rearm(transport: Transport, op_key: str, revert_argv: list[str], fires_in_s: float, generation: int) -> str:
    """Replace generation ``generation`` of ``op_key``'s switch by the next one, firing ``fires_in_s`` from now;
    returns the new marker. The new one starts first, so the op is never without a switch; TransportError
    when it cannot start (the old one then stays armed)."""
    mark = arm(transport, op_key, revert_argv, fires_in_s, generation=generation + 1)
    disarm(transport, marker(op_key, generation))
    return mark


def disarm(transport: Transport, mark: str) -> bool:
    """Cancel the switch named ``mark`` on the host; True if one was running. Never raises for 'not found'."""
    if not mark.startswith(MARKER_PREFIX) or not mark[len(MARKER_PREFIX) :].isalnum():
        raise ValueError(f"not a dead-man marker: {mark!r}")
    try:
        return transport.run(["pkill", "-f", "--", mark], timeout=15).returncode == 0
    except TransportError:
        return False
