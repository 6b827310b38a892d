"""The detached helpers some faults leave running on their host: start one, find one, stop one.

``slow`` (:mod:`injectors.process.dutycycle`), ``flap`` (:mod:`injectors.network.flap_helper`),
``memory_pressure`` (:mod:`injectors.node`) and ``storage`` (:mod:`injectors.storage.fuselayer`) each run a
helper that detaches from the harness (so it survives it) and ends by itself at a deadline on the HOST's
clock. Heal finds a helper by the pid ``apply`` journaled or, after a crash before that record, by the
``-m MODULE`` and ``--op-id`` on its command line, and signals only processes whose command line still says
so (a recycled pid is never touched): :func:`helper_argv` writes that command line, :func:`find` and
:func:`stop_then` read it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence

from chaos.cluster.base import Transport, host_python
from chaos.safety import deadman
from chaos.safety.state import state_dir


def host_deadline_ns(transport: Transport, seconds: float) -> int:
    """``time.time_ns()`` ``seconds`` from now on the HOST's clock, the one its helper reads."""
    return time.time_ns() - int(transport.clock_offset() * 1e9) + int(seconds * 1e9)


def helper_argv(transport: Transport, module: str, op_id: str, **options: object) -> list[str]:
    """``python -m module --op-id op_id --name value ...`` with the host's python; each option in the given
    order, its name with dashes for underscores (``until_ns=N``: ``--until-ns N``), its value as ``str``."""
    argv = [host_python(transport), "-m", module, "--op-id", op_id]
    for name, value in options.items():
        argv += [f"--{name.replace('_', '-')}", str(value)]
    return argv


def import_argv(transport: Transport, module: str) -> list[str]:
    """``python -c "import module"`` with the host's python: a probe that a helper can run there."""
    return [host_python(transport), "-c", f"import {module}"]


def launch(transport: Transport, argv: list[str], *, what: str, log: str | None, timeout: float = 30.0) -> int:
    """Start the self-detaching helper ``argv`` on the transport's host and return its pid.

    ``log`` (a file name) is given to a helper that runs on this machine: it then writes its log into our
    state dir and imports mlchaos from this checkout (:func:`chaos.safety.deadman.python_env`). A remote
    helper uses the host's own python environment and keeps no log here. InjectionError names ``what``.
    """
    env = None
    if log is not None:
        log_dir = state_dir()
        log_dir.mkdir(parents=True, exist_ok=True)
        argv = [*argv, "--log", str(log_dir / log)]
        env = deadman.python_env()
    return deadman.spawn_helper(transport, argv, what=what, env=env, timeout=timeout)


def find(command_lines: Mapping[int, str], module: str, op_id: str) -> list[int]:
    """Pids whose command line (argv joined with spaces) runs ``-m module`` for ``op_id``."""
    return [pid for pid, args in command_lines.items() if f"-m {module} " in args and f"--op-id {op_id} " in f"{args} "]


def stop(
    pids: list[int],
    alive: Callable[[int], bool],
    signal: Callable[[str, list[int]], None],
    *,
    grace_s: float,
    poll_s: float,
) -> None:
    """SIGTERM the helpers among ``pids`` (``alive`` verifies each by its command line), wait up to ``grace_s``
    for them to leave, then SIGKILL whichever is still there. ``signal(name, pids)`` sends ``SIGTERM``/``SIGKILL``."""
    helpers = [pid for pid in pids if alive(pid)]
    if not helpers:
        return
    signal("SIGTERM", helpers)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(alive(pid) for pid in helpers):
        time.sleep(poll_s)
    signal("SIGKILL", [pid for pid in helpers if alive(pid)])  # did not leave in time


# $1$2 = the helper's command-line pattern (split, so this shell's own command line never matches it), then the
# revert argv. SIGTERM the helper, wait up to 2 s for it to leave (it continues its targets on the way out),
# SIGKILL it if it stays, then run the revert: a helper left running would undo the revert at its next cycle.
_STOP_THEN_SCRIPT = (
    'p=$1$2; shift 2; pkill -TERM -f -- "$p"; i=0; '
    'while pgrep -f -- "$p" >/dev/null && [ $i -lt 40 ]; do sleep 0.05; i=$((i + 1)); done; '
    'pkill -KILL -f -- "$p"; [ $# -eq 0 ] || exec "$@"'
)


def stop_then(module: str, op_id: str, revert: Sequence[str] = ()) -> list[str]:
    """The dead-man's argv for a fault with a helper: stop this op's helper (found by ``-m module --op-id op_id``
    on its command line, as :func:`find` does), then run ``revert`` (nothing when empty). Runs under plain
    ``sh`` with ``pkill``/``pgrep``, on this machine or a remote host alike."""
    head, tail = "-m " + module.replace(".", "[.]") + " --op-id ", re.escape(op_id) + " "
    return ["sh", "-c", _STOP_THEN_SCRIPT, "mlchaos-stop-helper", head, tail, *revert]
