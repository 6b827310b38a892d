"""A torchrun-launched job on this host, with its rank -> pid table from the launcher's process tree.

The table is fed by two sources, the latest word per rank winning: the workers found below the launcher
(their ``RANK``/``LOCAL_RANK``/``TORCHELASTIC_RESTART_COUNT`` environment, :mod:`chaos.targets.rank_discovery`:
works for any script, and records ``target.worker`` and ``target.restart`` events), and the ranks' own
``target.start`` events (the reference trainer's).

Defaults that matter (and why):
- ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: with torch's shared rendezvous store, restarts after a killed
  worker are flaky (workers fail ``Gloo connectFullMesh ... Connection refused`` or hang; pytorch issues
  135712 and 167288). Setting it made restarts reliable here. A scenario's ``env`` may override it.
- ``--monitor-interval`` 0.5 s: how often the agent notices a dead worker (part of detection latency).
- gloo has no watchdog: a frozen rank is noticed only at the process-group timeout, and the agent then waits
  a fixed 30 s SIGTERM grace before SIGKILLing a worker that does not exit (a stopped one cannot).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path

from chaos.cluster.base import Transport
from chaos.cluster.local import process_start_time
from chaos.event_kinds import TARGET_EXIT, TARGET_START
from chaos.history.timeline import Event, LineMatcher
from chaos.plugins.injector import InjectionError, JobTree
from chaos.spec.scenario import TorchrunTarget
from chaos.targets.base import SpawnedJob, output_matchers, with_step_reporter
from chaos.targets.command import expand
from chaos.targets.interpreter import describe_python, torchrun_launcher, torchrun_log_dir, torchrun_python
from chaos.targets.rank_discovery import Discovery, ScanError, Worker, scan_local

LOCAL_HOST = "local"  # the host name of this machine in rank tables (chaos.cluster.hosts.LOCAL)

DEFAULT_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "OMP_NUM_THREADS": "1"}


class RankTable:
    """Which process (host, pid) runs each rank, from the ranks' own ``target.start`` events and the workers
    discovered in the launcher's process tree (the latest word wins: attempt counters are per node, so they do
    not order starts across hosts), and every worker pid ever reported or found with its start time (so
    stop() can reap workers and never a stranger). Thread-safe (discovery scans on threads of its own)."""

    def __init__(self) -> None:
        self._latest: dict[int, tuple[int, int, str]] = {}  # rank -> (ts_ns, pid, host)
        self.workers: dict[str, dict[int, int | None]] = {}  # host -> pid -> start time
        self._lock = threading.Lock()

    def observe(self, event: Event, host: str, start_time: Callable[[int], int | None]) -> None:
        """Record a ``target.start`` event of a rank running on ``host``; other events are ignored."""
        if event.kind != TARGET_START or event.rank is None:
            return
        pid = event.get_int("pid")
        if pid is None:
            return
        self._record(event.rank, pid, host, start_time(pid), event.ts_ns)

    def observe_worker(self, worker: Worker, ts_ns: int) -> None:
        """Record a worker found in the launcher's tree at ``ts_ns``."""
        self._record(worker.rank, worker.pid, worker.host, worker.start_time, ts_ns)

    def _record(self, rank: int, pid: int, host: str, started: int | None, ts_ns: int) -> None:
        with self._lock:
            self.workers.setdefault(host, {})[pid] = started
            if ts_ns >= self._latest.get(rank, (-1, 0, ""))[0]:
                self._latest[rank] = (ts_ns, pid, host)

    def workers_on(self, host: str) -> dict[int, int | None]:
        """Every worker pid ever seen on ``host``, with its start time (a copy)."""
        with self._lock:
            return dict(self.workers.get(host, {}))

    def pids_for_rank(self, rank: int) -> list[int]:
        with self._lock:
            entry = self._latest.get(rank)
        return [entry[1]] if entry is not None else []

    def host_for_rank(self, rank: int) -> str | None:
        with self._lock:
            entry = self._latest.get(rank)
        return entry[2] if entry is not None else None

    def ranks(self) -> list[int]:
        with self._lock:
            return sorted(self._latest)


def torchrun_tail(spec: TorchrunTarget, values: dict[str, str], python: str | None = None) -> list[str]:
    """The part of a torchrun command line after the launcher options: restarts, monitor, then the job
    (preceded by ``python`` when the launcher runs with ``--no-python``: see chaos.targets.interpreter)."""
    argv = ["--max-restarts", str(spec.max_restarts), "--monitor-interval", f"{spec.monitor_interval:g}"]
    argv += [] if python is None else [python]
    argv += ["-m", spec.module] if spec.module is not None else [expand(spec.script or "", values)]
    return argv + [expand(arg, values) for arg in spec.args]


def torchrun_env(spec: TorchrunTarget, values: dict[str, str], extra_env: dict[str, str] | None) -> dict[str, str]:
    return {**DEFAULT_ENV, **(extra_env or {}), **{k: expand(v, values) for k, v in spec.env.items()}}


def torchrun_matchers(spec: TorchrunTarget) -> list[LineMatcher]:
    """torch's failure signatures (torchrun's failure and restart lines among them) and the scenario's own."""
    return output_matchers(spec.signatures, spec.matchers)


class RankLookup:
    """The RankResolver and ProcessTreeResolver half of a torchrun job, answered from its :class:`RankTable`
    (``self.table``) and its launchers' process trees (``self.discovery``). A rank is looked up after a fresh
    scan, so a fault hits the worker running now, not the one of the last background scan."""

    table: RankTable
    discovery: Discovery

    def pids_for_rank(self, rank: int) -> list[int]:
        """The pid of ``rank`` now (on :meth:`host_for_rank`); empty before it was found or reported."""
        self.discovery.refresh()
        return self.table.pids_for_rank(rank)

    def host_for_rank(self, rank: int) -> str | None:
        self.discovery.refresh()
        return self.table.host_for_rank(rank)

    def ranks(self) -> list[int]:
        return self.table.ranks()

    def job_tree(self, host: str) -> JobTree:
        """The launcher on ``host`` and every process below it now (``name:`` selectors match only there)."""
        try:
            return self.discovery.tree(host)
        except ScanError as exc:
            raise InjectionError(f"cannot read the job's processes on {host}: {exc}") from None

    def restarts_seen(self) -> dict[str, int]:
        """Per host, the launcher's restart count as its workers' environment says (0 before any restart)."""
        return self.discovery.restarts()


def job_what(spec: TorchrunTarget) -> str:
    """What a torchrun job runs, for :meth:`describe`: its module or script."""
    return spec.module or spec.script or ""


class TorchrunJob(RankLookup):
    """``<python> -m torch.distributed.run --standalone`` (or the target's ``torchrun:``) with the scenario's
    ranks and restarts; the interpreter is chosen by :func:`chaos.targets.interpreter.torchrun_python`."""

    def __init__(
        self,
        spec: TorchrunTarget,
        transport: Transport,
        run_dir: Path,
        seed: int,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        values = {"run_dir": str(run_dir), "seed": str(seed)}
        self.interpreter = torchrun_python(spec)  # the user's python3, a python: given, or mlchaos's own
        launcher, job_python = torchrun_launcher(spec, self.interpreter.command)
        argv = [*launcher, *torchrun_log_dir(launcher, str(run_dir)), "--standalone", "--nnodes", "1"]
        argv += ["--nproc-per-node", str(spec.nproc_per_node), *torchrun_tail(spec, values, job_python)]
        self.spec = spec
        env = with_step_reporter(
            torchrun_env(spec, values, extra_env),
            wanted=spec.optimizer_steps,
            matchers=spec.matchers,
            transport=transport,
        )
        self.job = SpawnedJob(transport, argv, env=env, run_dir=run_dir, matchers=torchrun_matchers(spec))
        self.table = RankTable()
        self.discovery = Discovery(self.table.observe_worker)

    def start(self) -> None:
        self.job.start()
        self.discovery.start(LOCAL_HOST, self.job.pid, scan_local, restart_is_attempt=True)

    def poll_events(self) -> list[Event]:
        events = self.job.poll_events()
        for event in events:
            self.table.observe(event, LOCAL_HOST, process_start_time)
            self.discovery.note(LOCAL_HOST, event)
            if event.kind == TARGET_EXIT:
                self.discovery.finish()
        # Discovered first: they were found before this poll, and the launcher's target.exit stays last.
        return [*self.discovery.drain(), *events]

    def exit_code(self) -> int | None:
        return self.job.exit_code()

    def stop(self, grace: float = 10.0) -> None:
        self.discovery.refresh()  # the workers of right now, so none escapes the reaping below
        self.discovery.finish()
        self.job.stop(grace)
        # torchrun starts each worker in a session of its own, so the launcher's process group does not
        # cover them: reap every worker pid found or reported (unless the pid now belongs to someone else).
        for pid, started in self.table.workers_on(LOCAL_HOST).items():
            if started is not None and process_start_time(pid) == started:
                for signum in (signal.SIGCONT, signal.SIGKILL):
                    try:
                        os.kill(pid, signum)
                    except ProcessLookupError:
                        break

    def describe(self) -> str:
        return f"torchrun {self.spec.nproc_per_node} ranks: {job_what(self.spec)}{describe_python(self.interpreter)}"
