"""A network fault's detached helper on its host (the flap toggler, the NFQUEUE packet holder): start, stop."""

from __future__ import annotations

from chaos.cluster.base import TransportError
from chaos.plugins.injector import InjectionContext
from chaos.safety import deadman
from injectors import detached
from injectors.network.host import TIMEOUT_S, Host, shares_machine
from injectors.process.faults import ProcessHost


def start_helper(ctx: InjectionContext, host: Host, module: str, op_id: str, what: str, **options: object) -> int:
    """Start ``python -m module --op-id op_id --option value ...`` detached on the fault's host (behind ``sudo -n``
    when the op needs it; logging to ``<module's last part>.log`` in the state dir on this machine); its pid."""
    argv = [
        *(["sudo", "-n"] if host.sudo else []),
        *detached.helper_argv(ctx.transport, module, op_id, **options),
    ]
    log = f"{module.rsplit('.', 1)[-1]}.log" if shares_machine(ctx.transport) else None
    return detached.launch(ctx.transport, argv, what=what, log=log, timeout=TIMEOUT_S)


def stop_helper(host: Host, module: str, op_id: str, pid: int | None) -> None:
    """SIGTERM ``op_id``'s helper (``pid`` as journaled, or found by its command line after a crash before that
    record), SIGKILL it if it has not left within 10 s. Only a process whose command line still runs
    ``-m module --op-id op_id`` is signalled, so a recycled pid is never touched."""
    pids = [pid] if pid is not None else _find(host, module, op_id)
    detached.stop(
        pids,
        lambda candidate: _is_helper(host, candidate, module, op_id),
        lambda name, chosen: _signal(host, name, chosen),
        grace_s=10.0,
        poll_s=0.05,
    )


def _is_helper(host: Host, pid: int, module: str, op_id: str) -> bool:
    try:
        done = host.transport.run(["cat", f"/proc/{pid}/cmdline"], timeout=TIMEOUT_S)
    except TransportError:
        return False
    argv = done.stdout.split("\0")[:-1] if done.ok else []
    return deadman.module_of(argv) == module and deadman.option(argv, "--op-id") == op_id


def _find(host: Host, module: str, op_id: str) -> list[int]:
    try:
        return detached.find(ProcessHost(host.transport).command_lines(), module, op_id)
    except TransportError:
        return []


def _signal(host: Host, name: str, pids: list[int]) -> None:
    if pids:
        try:
            host.run(["kill", "-s", name.removeprefix("SIG"), *map(str, pids)])
        except TransportError:
            pass  # gone or unreachable: the rule removal around it is what heals
