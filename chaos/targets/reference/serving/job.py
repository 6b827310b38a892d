"""The serving stack as a target: model server processes (primary, fallback) and a gateway, supervised.

Contracts:

- :meth:`ServingJob.start` spawns every process at once (each model server imports torch, ~2 s) and returns;
  the stack is ready when the gateway reports :attr:`ServingJob.ready_event` (``serving.ready``), which the
  runner waits for before it starts load and the fault clock.
- Each process is a :class:`~chaos.targets.base.SpawnedJob` with its own log (``<name>.log``, appended
  across restarts) and event file (``events-<name>.jsonl``; a restarted replica's k-th attempt writes
  ``events-<name>.<k>.jsonl``, so a fresh reader never replays the previous attempt's events).
- Model servers get ``RANK`` = ``REPLICA_RANKS[name]`` (in-job faults select a replica by rank),
  ``WORLD_SIZE=2``, ``CHAOS_RUN_DIR``, the runner's ``extra_env`` (``CHAOS_PLAN``) and ``spec.env``.
- Supervisor (a background thread, so restarts do not depend on how often anyone polls): when a replica
  exits, ``serving.replica_exit`` {replica, code, attempt, expected} (source runner) is reported instead
  of ``target.exit``; with ``restart`` on, after ``restart_delay`` a new process takes its place (same port)
  and ``serving.replica_restart`` {replica, attempt} is reported. Nothing restarts once :meth:`stop` began.
- Only the gateway's exit is the target's exit (``target.exit``, :meth:`exit_code`).
- :meth:`stop` ends the gateway and every replica (SIGTERM, then SIGKILL after ``grace``), in parallel.
"""

from __future__ import annotations

import os
import queue
import socket
import sys
import threading
import time
from pathlib import Path

from chaos.cluster.local import LocalTransport
from chaos.history.timeline import TARGET_EXIT, Event, now_ns
from chaos.spec.serving import FALLBACK, PRIMARY, REPLICA_RANKS, ReplicaSettings, ServingTarget
from chaos.targets.base import SpawnedJob
from chaos.targets.reference.serving.gateway import READY, GatewayConfig, ReplicaEndpoint

REPLICA_EXIT = "serving.replica_exit"
REPLICA_RESTART = "serving.replica_restart"
GATEWAY = "gateway"
_SUPERVISE_EVERY = 0.05  # seconds between looks at the replicas: bounds the restart's reaction time
_ROOT = str(Path(__file__).resolve().parents[4])  # the folder holding the chaos package


def _free_port() -> int:
    # The port is free now; a race with another process binding it before the server does is possible but
    # rare on a test box, and shows up as the server's exit (then a restart), not as silence.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class _Replica:
    """One replica's settings, port and current process (attempt 0 first, then one per restart)."""

    def __init__(self, name: str, settings: ReplicaSettings, port: int) -> None:
        self.name = name
        self.settings = settings
        self.port = port
        self.attempt = 0
        self.job: SpawnedJob | None = None
        self.restart_at: float | None = None  # monotonic time of a pending restart


class ServingJob:
    """The reference serving stack (see the module docstring for its contracts)."""

    ready_event: str = READY

    def __init__(
        self, spec: ServingTarget, transport: LocalTransport, run_dir: Path, seed: int, extra_env: dict[str, str]
    ) -> None:
        self.spec = spec
        self.transport = transport
        self.run_dir = run_dir
        self.seed = seed
        self.extra_env = dict(extra_env)
        self._replicas: dict[str, _Replica] = {}
        self._gateway: SpawnedJob | None = None
        self._port: int | None = None
        self._events: queue.Queue[Event] = queue.Queue()
        self._lock = threading.Lock()  # guards starting processes against stop()
        self._stopping = threading.Event()
        self._supervisor: threading.Thread | None = None

    # -- the Target protocol
    def start(self) -> None:
        if self._gateway is not None:
            raise RuntimeError("this ServingJob was already started")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        settings: dict[str, ReplicaSettings] = {PRIMARY: self.spec.primary}
        if self.spec.fallback is not None:
            settings[FALLBACK] = self.spec.fallback
        for name, replica_settings in settings.items():
            self._replicas[name] = _Replica(name, replica_settings, replica_settings.port or _free_port())
        self._port = self.spec.port or _free_port()
        config = GatewayConfig(
            target=self.spec,
            port=self._port,
            run_dir=self.run_dir,
            replicas={r.name: ReplicaEndpoint(model=r.settings.model, port=r.port) for r in self._replicas.values()},
        )
        config_path = self.run_dir / "gateway-config.json"
        config_path.write_text(config.model_dump_json(indent=1), encoding="utf-8")
        with self._lock:
            for replica in self._replicas.values():
                self._spawn(replica)
            argv = [sys.executable, "-m", "chaos.targets.reference.serving.gateway", "--config-file", str(config_path)]
            self._gateway = SpawnedJob(
                self.transport,
                argv,
                env=self._env(self.spec.env),
                run_dir=self.run_dir,
                matchers=[],
                log_name=f"{GATEWAY}.log",
                events_name=f"events-{GATEWAY}.jsonl",
            )
            self._gateway.start()
        self._supervisor = threading.Thread(target=self._supervise, name="serving-supervisor", daemon=True)
        self._supervisor.start()

    def poll_events(self) -> list[Event]:
        out: list[Event] = []
        while True:
            try:
                out.append(self._events.get_nowait())
            except queue.Empty:
                break
        if self._gateway is not None:
            out.extend(self._gateway.poll_events())
        # Two streams (replicas via the supervisor, the gateway here): merge them in time order. Stable, so
        # the gateway's target.exit (stamped last) stays after its final events.
        out.sort(key=lambda event: event.ts_ns)
        return out

    def exit_code(self) -> int | None:
        return self._gateway.exit_code() if self._gateway is not None else None

    def stop(self, grace: float = 10.0) -> None:
        with self._lock:
            self._stopping.set()  # from here on, no process is started
        if self._supervisor is not None:
            self._supervisor.join(timeout=5)
        jobs = [r.job for r in self._replicas.values() if r.job is not None]
        if self._gateway is not None:
            jobs.append(self._gateway)
        stoppers = [threading.Thread(target=job.stop, args=(grace,), daemon=True) for job in jobs]
        for thread in stoppers:
            thread.start()
        for thread in stoppers:
            thread.join(timeout=grace + 15)
        for replica in self._replicas.values():
            self._collect(replica)  # their exits, reported as expected ones

    def describe(self) -> str:
        names = ", ".join(f"{r.name} ({r.settings.model}) :{r.port}" for r in self._replicas.values())
        return f"serving stack: gateway {self.url if self._port else '(not started)'} -> {names or 'replicas'}"

    # -- what the runner and process faults need
    @property
    def url(self) -> str:
        if self._port is None:
            raise RuntimeError("the serving stack has not been started")
        return f"http://127.0.0.1:{self._port}"

    def replicas(self) -> list[str]:
        """The replica names, in ladder order (``primary``, then ``fallback`` when configured)."""
        if self._replicas:
            return list(self._replicas)
        return [PRIMARY] + ([FALLBACK] if self.spec.fallback is not None else [])

    def pids_for_replica(self, name: str) -> list[int]:
        """The live process of replica ``name`` now (empty while it is down or between restarts)."""
        replica = self._replicas.get(name)
        job = replica.job if replica is not None else None
        if job is None or job.pid is None or job.exit_code() is not None:
            return []
        return [job.pid]

    # -- internals
    def _env(self, base: dict[str, str]) -> dict[str, str]:
        path = os.pathsep.join(p for p in (_ROOT, os.environ.get("PYTHONPATH")) if p)
        return {**base, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}

    def _spawn(self, replica: _Replica) -> None:
        """Start the replica's next attempt (caller holds the lock and has checked ``_stopping``)."""
        s = replica.settings
        argv = [
            sys.executable, "-m", "chaos.targets.reference.serving.model_server",
            "--replica", replica.name, "--model", s.model, "--port", str(replica.port), "--seed", str(self.seed),
            "--delay", repr(s.delay), "--workers", str(s.workers), "--run-dir", str(self.run_dir),
        ]  # fmt: skip
        env = self._env({**self.extra_env, **self.spec.env})
        # Last, so no scenario env can make a replica impersonate another rank.
        env.update({"RANK": str(REPLICA_RANKS[replica.name]), "WORLD_SIZE": str(len(REPLICA_RANKS))})
        suffix = "" if replica.attempt == 0 else f".{replica.attempt}"
        replica.job = SpawnedJob(
            self.transport,
            argv,
            env=env,
            run_dir=self.run_dir,
            matchers=[],
            log_name=f"{replica.name}.log",
            events_name=f"events-{replica.name}{suffix}.jsonl",
        )
        replica.job.start()

    def _collect(self, replica: _Replica) -> bool:
        """Queue the replica's new events, its exit translated; True when its process has exited."""
        if replica.job is None:
            return False
        exited = False
        for event in replica.job.poll_events():
            if event.kind != TARGET_EXIT:
                self._events.put(event)
                continue
            exited = True
            self._events.put(
                Event(
                    ts_ns=event.ts_ns,
                    kind=REPLICA_EXIT,
                    source="runner",
                    rank=REPLICA_RANKS[replica.name],
                    data={
                        "replica": replica.name,
                        "code": event.data.get("code"),
                        "attempt": replica.attempt,
                        "expected": self._stopping.is_set(),
                    },
                )
            )
        return exited

    def _supervise(self) -> None:
        while not self._stopping.wait(_SUPERVISE_EVERY):
            for replica in self._replicas.values():
                if replica.restart_at is None:
                    if self._collect(replica) and replica.settings.restart:
                        replica.restart_at = time.monotonic() + replica.settings.restart_delay
                    continue
                if time.monotonic() < replica.restart_at:
                    continue
                with self._lock:
                    if self._stopping.is_set():
                        return
                    replica.attempt += 1
                    replica.restart_at = None
                    self._spawn(replica)
                self._events.put(
                    Event(
                        ts_ns=now_ns(),
                        kind=REPLICA_RESTART,
                        source="runner",
                        rank=REPLICA_RANKS[replica.name],
                        data={"replica": replica.name, "attempt": replica.attempt},
                    )
                )
