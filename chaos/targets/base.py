"""A job the harness starts on a host and listens to: its output, its event file, its exit.

Targets report through two channels that both end up as Events: the JSONL file named by ``CHAOS_EVENTS``
(written by :mod:`chaos.events` inside the job) and regex matchers over the job's combined stdout/stderr.
A job on another host gets ``CHAOS_EVENTS=stdout``: its events arrive as prefixed lines in its output, over the
SSH channel that started it, are moved onto the harness clock (the host's clock offset) and tagged with the
host's name (``data.host``).
"""

from __future__ import annotations

import os
import queue
import signal
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Protocol, runtime_checkable

from pydantic import JsonValue

from chaos.cluster.base import HostProcess, Transport
from chaos.cluster.local import LocalTransport
from chaos.cluster.ports import NoFreePort, free_port
from chaos.event_kinds import TARGET_EXIT, TARGET_PORTS
from chaos.events import ENV_EVENTS, STDOUT_PREFIX, STDOUT_SINK
from chaos.history.timeline import Event, EventFileTail, LineMatcher, LogMatcher, now_ns, parse_event_line
from chaos.history.torch_signatures import SignatureChoice, signature_matcher
from chaos.injob.bootstrap import BOOTSTRAP_DIR
from chaos.spec.matchers import LogMatcherSpec, reports_steps


class Target(Protocol):
    """What the runner needs from a job: start it, hear from it, know when it ended, stop it."""

    def start(self) -> None: ...

    def poll_events(self) -> list[Event]:
        """Events that arrived since the last call (never blocks)."""
        ...

    def exit_code(self) -> int | None:
        """None while running; the job's exit code once it ended."""
        ...

    def stop(self, grace: float = 10.0) -> None:
        """End the job (and everything it started): SIGTERM, then SIGKILL after ``grace`` seconds."""
        ...

    def describe(self) -> str: ...


# Optional abilities: the runner asks a target for one with ``isinstance(target, Ability)``, never for its type,
# so a new kind of target adds a file (and a line in the factory), not a branch in the orchestrator.


class TargetUnusable(Exception):
    """A target cannot run here (a node does not answer); raised before anything was started or applied."""


def port_for(transport: Transport, what: str) -> int:
    """A port free on ``transport``'s host now (:func:`chaos.cluster.ports.free_port`) for ``what`` (a
    ``port: auto`` role, a rendezvous); :class:`TargetUnusable` naming ``what`` when there is none."""
    try:
        return free_port(transport)
    except NoFreePort as exc:
        raise TargetUnusable(f"{what}: {exc}") from exc


def ports_event(ports: dict[str, int], chosen: list[str]) -> Event:
    """``target.ports`` {ports: {name: port}, chosen: [names whose port was chosen at start, not pinned]}."""
    data: dict[str, JsonValue] = {"ports": dict[str, JsonValue](ports), "chosen": list[JsonValue](chosen)}
    return Event(ts_ns=now_ns(), kind=TARGET_PORTS, source="runner", data=data)


@runtime_checkable
class Preflight(Protocol):
    """A target that can tell, before the run starts, that it cannot run (e.g. a job node is unreachable)."""

    def preflight(self) -> None:
        """Raise :class:`TargetUnusable` naming what is not usable; return when everything answers."""
        ...


@runtime_checkable
class AwaitsReady(Protocol):
    """A target that is not ready when ``start`` returns (a serving stack, an endpoint someone else runs): the
    runner holds the fault clock, the load and the progress watch until an event of kind ``ready_event``."""

    ready_event: str


@runtime_checkable
class Serves(Protocol):
    """A target that answers requests at ``url`` once ready (where the load goes unless it names a URL).
    Only ask a started target that reported ready: ``url`` may not exist before then."""

    @property
    def url(self) -> str: ...


@runtime_checkable
class ReplicaPlacement(Protocol):
    """A job whose replicas run on several hosts (a roles target with ``host:``): a process fault on a replica
    lands on the host that runs it."""

    def host_for_replica(self, name: str) -> str | None: ...


@runtime_checkable
class RankPlacement(Protocol):
    """A job whose ranks run on several hosts (multi-node torchrun): a fault aimed at a rank lands on the host
    that runs that rank when it fires, and may land on any of :meth:`node_names` (checked before the run)."""

    def node_names(self) -> list[str]: ...

    def host_for_rank(self, rank: int) -> str | None:
        """The host running ``rank`` now; None before that rank reported its start."""
        ...


def output_matchers(signatures: SignatureChoice, matchers: Sequence[LogMatcherSpec]) -> list[LineMatcher]:
    """What a target reads from its job's output: torch's failure signatures (``signatures:``; at most one
    event per line, :mod:`chaos.history.torch_signatures`) and each of the scenario's ``matchers:``."""
    found: list[LineMatcher] = [signature_matcher(signatures)] if signatures != "none" else []
    return found + [LogMatcher(m.pattern, m.event) for m in matchers]


def with_step_reporter(
    env: dict[str, str], *, wanted: bool, matchers: Sequence[LogMatcherSpec], transport: Transport
) -> dict[str, str]:
    """``env`` with the zero-line step reporter first on ``PYTHONPATH`` (:mod:`chaos.injob.bootstrap`) when the
    target wants it (``optimizer_steps``), no matcher reports ``target.step`` and the job runs on this host."""
    if not wanted or not isinstance(transport, LocalTransport) or reports_steps(list(matchers)):
        return env
    rest = env.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    return {**env, "PYTHONPATH": os.pathsep.join(p for p in (str(BOOTSTRAP_DIR), rest) if p)}


class SpawnedJob:
    """A process tree started through a transport, with its output logged and matched line by line."""

    def __init__(
        self,
        transport: Transport,
        argv: list[str],
        *,
        env: dict[str, str],
        run_dir: Path,
        matchers: Sequence[LineMatcher],
        log_name: str = "target.log",
        host: str | None = None,
        events_name: str = "events.jsonl",
    ) -> None:
        self.transport = transport
        self.local = isinstance(transport, LocalTransport)
        self.host = host  # tagged onto every event of a remote job (data.host)
        self._offset_ns = 0
        self.argv = argv
        self.env = env
        self.run_dir = run_dir
        self.events_path = run_dir / events_name  # one file per job when several share a run_dir
        self.log_path = run_dir / log_name
        self.matchers = list(matchers)
        self._tail = EventFileTail(self.events_path)
        self._lines: queue.Queue[Event] = queue.Queue()
        self._proc: HostProcess | None = None
        self._reader: threading.Thread | None = None
        self._exit_reported = False

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self) -> None:
        if self.local:
            env = {**os.environ, **self.env, ENV_EVENTS: str(self.events_path), "CHAOS_RUN_DIR": str(self.run_dir)}
        else:
            # The harness's own environment means nothing on another host: send only what the job needs.
            env = {**self.env, ENV_EVENTS: STDOUT_SINK, "CHAOS_RUN_DIR": str(self.run_dir)}
            self._offset_ns = int(self.transport.clock_offset() * 1e9)
        env.setdefault("PYTHONUNBUFFERED", "1")
        # SIGTERM (not SIGKILL) on harness death lets launchers such as torchrun take their workers down too.
        self._proc = self.transport.spawn(self.argv, env=env, cwd=None, kill_with_parent=signal.SIGTERM)
        self._reader = threading.Thread(target=self._read_output, args=(self._proc.stdout,), daemon=True)
        self._reader.start()

    def _read_output(self, stream: IO[bytes] | None) -> None:
        if stream is None:
            return
        with open(self.log_path, "ab") as log:
            for raw in iter(stream.readline, b""):
                log.write(raw)
                log.flush()
                line = raw.decode(errors="replace")
                stamp = now_ns()
                if line.startswith(STDOUT_PREFIX):
                    self._lines.put(self._remote_event(line[len(STDOUT_PREFIX) :]))
                    continue
                for matcher in self.matchers:
                    event = matcher.match(line, stamp)
                    if event is not None:
                        self._lines.put(event)

    def _remote_event(self, text: str) -> Event:
        event = parse_event_line(text)
        if event.source == "runner":  # runner.bad_event: already on the harness clock
            return event
        data = event.data if self.host is None or "host" in event.data else {**event.data, "host": self.host}
        return event.model_copy(update={"ts_ns": event.ts_ns + self._offset_ns, "data": data})

    def poll_events(self) -> list[Event]:
        events = self._tail.poll()
        while True:
            try:
                events.append(self._lines.get_nowait())
            except queue.Empty:
                break
        code = self._proc.poll() if self._proc is not None else None
        if code is not None and not self._exit_reported:
            # Drain what the job wrote before it died, so its last events precede target.exit.
            if self._reader is not None:
                self._reader.join(timeout=5)
            events.extend(self._tail.poll())
            while not self._lines.empty():
                events.append(self._lines.get_nowait())
            self._exit_reported = True
            data: dict[str, JsonValue] = {"code": code}
            if self.host is not None:
                data["host"] = self.host
            events.append(Event(ts_ns=now_ns(), kind=TARGET_EXIT, source="runner", data=data))
        return events

    def exit_code(self) -> int | None:
        return self._proc.poll() if self._proc is not None else None

    def stop(self, grace: float = 10.0) -> None:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            self._reap_group()
            return
        self._signal_group(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        self._reap_group()
        proc.wait(timeout=10)

    def _signal_group(self, signum: int) -> None:
        if self._proc is None:
            return
        if not self.local:
            # Remote: the login shell exec'd the command, which leads its own session; signal that pid (a
            # launcher such as torchrun takes its workers down on SIGTERM; callers reap stragglers by pid).
            try:
                self._proc.send_signal(signum)
            except Exception:  # noqa: BLE001  (connection lost: the host-side watcher signals it instead)
                pass
            return
        try:
            os.killpg(self._proc.pid, signum)  # spawn() starts a new session: its pgid is its pid
        except ProcessLookupError:
            pass

    def _reap_group(self) -> None:
        """SIGKILL whatever is left of the job's process group (workers that ignored SIGTERM)."""
        self._signal_group(signal.SIGCONT)  # a stopped member cannot die of SIGTERM until continued
        self._signal_group(signal.SIGKILL)
