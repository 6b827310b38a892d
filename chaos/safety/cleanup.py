"""Healing what earlier runs left behind, from their journals (``mlchaos cleanup``, and every run's start)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path

from chaos.cluster.base import Transport
from chaos.plugins import registry
from chaos.plugins.injector import InjectionContext
from chaos.safety import deadman, remote_deadman
from chaos.safety.journal import HEALED_BY_CLEANUP, HEALED_BY_DEADMAN, Journal, all_journals

LOCAL = "local"  # Applied.host of a fault on this machine


def _ignore(line: str) -> None:
    del line


def heal_leftovers(
    transport: Transport | Mapping[str, Transport],
    *,
    state_dir: Path | None = None,
    log: Callable[[str], None] = _ignore,
    only_dead_owners: bool = True,
    run_id: str | None = None,
) -> list[str]:
    """Heal every unhealed op of every journal whose run is no longer alive; return what was done, one line each.

    ``transport`` reaches the hosts the faults were applied on: one transport (used for every host) or a
    mapping from :attr:`Applied.host`. An op on another host whose switch there already fired (it left its
    record, :func:`chaos.safety.remote_deadman.fired`) is marked healed by "deadman" and not healed again; every
    other op is healed through its injector, marked healed by "cleanup", and its dead-man (if still running:
    this machine's reverter, or the host's switch) is disarmed. A failed heal is reported, recorded as ``failed`` and
    leaves the op unhealed for the next cleanup: nothing is ever dropped silently. Journals with nothing
    left to heal move to ``journal/done/``, so the next cleanup does not read them again.

    A run still alive (holding its journal's lock) is skipped by default, since it heals its own faults: a
    cleanup beside a running run (another CI job on the machine) never touches that run's faults.
    ``only_dead_owners=False`` (``mlchaos cleanup --run ID`` or ``--include-live``, a human's decision) heals
    those too but leaves the journal in place for its owner to keep writing. ``run_id`` limits all of this to
    that run's journal.
    """
    lines: list[str] = []

    def say(line: str) -> None:
        lines.append(line)
        log(line)

    journals = all_journals(state_dir)
    if run_id is not None:
        journals = [path for path in journals if path.stem == run_id]
        if not journals:
            say(f"run {run_id}: no journal with faults left to heal (a finished run's is archived)")
    for path in journals:
        with Journal(path, owner=False) as journal:
            owner_alive = not journal.try_lock_exclusive()
            if owner_alive and only_dead_owners:
                if journal.unhealed():
                    say(f"run {journal.run_id}: still running, its faults are left to it")
                continue
            if owner_alive and journal.unhealed():
                say(f"run {journal.run_id}: still running, healing its faults anyway")
            pending = journal.unhealed()
            for problem in journal.unreadable:
                say(f"run {journal.run_id}: unreadable journal line {problem}")
            local_switches = journal.deadman_pids()
            for applied in pending:
                what = f"run {journal.run_id}: {applied.op_id} ({applied.description or applied.injector})"
                on_host = applied.host != LOCAL and applied.op_id not in local_switches  # its switch is the host's
                try:
                    host_transport = _transport_for(transport, applied.host)
                    status = remote_deadman.fired(host_transport, applied.op_id) if on_host else None
                    if status is not None:  # the host's own switch reverted it: record that, heal nothing twice
                        journal.healed(applied.op_id, HEALED_BY_DEADMAN)
                        say(f"{what}: already healed by its dead-man on {applied.host} (revert exit {status})")
                        continue
                    registry.injector(applied.injector).heal(InjectionContext(host_transport), applied)
                except Exception as exc:  # noqa: BLE001 - any failure is reported and kept, never aborts the rest
                    journal.failed(applied.op_id, f"cleanup heal failed: {type(exc).__name__}: {exc}")
                    say(f"{what}: heal FAILED, left for the next cleanup: {type(exc).__name__}: {exc}")
                    continue
                journal.healed(applied.op_id, HEALED_BY_CLEANUP)
                say(f"{what}: healed")
                if on_host and remote_deadman.disarm(host_transport, remote_deadman.marker(applied.op_id)):
                    say(f"run {journal.run_id}: {applied.op_id}: dead-man on {applied.host} stopped")
            still_pending = {a.op_id for a in journal.unhealed()}
            for op_id, pid in journal.deadman_pids().items():
                # A pending op keeps its dead-man: it may still succeed where cleanup failed.
                if op_id not in still_pending and deadman.disarm(pid, op_id):
                    say(f"run {journal.run_id}: {op_id}: dead-man {pid} disarmed")
            if not still_pending and not journal.unreadable and not owner_alive:
                done = path.parent / "done"
                done.mkdir(exist_ok=True)
                os.replace(path, done / path.name)
    return lines


def _transport_for(transport: Transport | Mapping[str, Transport], host: str) -> Transport:
    if isinstance(transport, Mapping):
        try:
            return transport[host]
        except KeyError:
            raise LookupError(f"no transport for host {host!r}; cannot reach it to heal") from None
    return transport
