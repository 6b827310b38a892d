"""The dead-man switch for faults on remote hosts: a detached ``sh`` on the host itself.

A remote host may have no Python and no mlchaos, and the harness (with its journal) may be gone when the
switch has to fire, so the switch is the most portable thing there is: ``setsid -f sh -c SCRIPT`` with a
CONSTANT script that sleeps, then ``exec``s the injector's revert argv passed as positional parameters. No
scenario text is ever interpolated into the script. The marker (``$0``, a hash of the op) names the process
so heal can cancel it with ``pkill -f``; reverts are idempotent, so a switch that fires after a heal (or after
``mlchaos cleanup``) changes nothing.
"""

from __future__ import annotations

import hashlib

from chaos.cluster.base import Transport, TransportError

MARKER_PREFIX = "mlchaos-deadman-"
# $0 = marker, $1 = seconds, $2.. = revert argv. Stdio is detached first so the SSH channel closes at once.
SCRIPT = 'exec </dev/null >/dev/null 2>&1; sleep "$1"; shift; exec "$@"'


def marker(op_key: str) -> str:
    """The process-name marker of the switch for ``op_key`` (letters and digits only: safe in pkill -f)."""
    return MARKER_PREFIX + hashlib.sha256(op_key.encode()).hexdigest()[:16]


def arm_argv(op_key: str, revert_argv: list[str], fires_in_s: float) -> list[str]:
    """The argv that starts the switch on a host (exposed for tests and docs)."""
    return ["setsid", "-f", "sh", "-c", SCRIPT, marker(op_key), f"{fires_in_s:.3f}", *revert_argv]


def arm(transport: Transport, op_key: str, revert_argv: list[str], fires_in_s: float) -> str:
    """Start the switch on the transport's host; returns its marker. Raises TransportError if it cannot."""
    transport.run(arm_argv(op_key, revert_argv, fires_in_s), timeout=15, check=True)
    return marker(op_key)


def disarm(transport: Transport, mark: str) -> bool:
    """Cancel the switch named ``mark`` on the host; True if one was running. Never raises for 'not found'."""
    if not mark.startswith(MARKER_PREFIX) or not mark[len(MARKER_PREFIX) :].isalnum():
        raise ValueError(f"not a dead-man marker: {mark!r}")
    try:
        return transport.run(["pkill", "-f", "--", mark], timeout=15).returncode == 0
    except TransportError:
        return False
