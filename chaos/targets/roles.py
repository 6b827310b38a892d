"""The ``roles`` target: several roles (commands or one-node torchrun jobs), each replica supervised.

:meth:`RolesJob.start` starts the roles that wait for nobody; a supervisor thread starts the others once the
roles in their ``after`` are ready, restarts an exited replica as its policy says, and reports ``target.role_*``
events; the job ends (``target.exit``) when every replica of the ``until`` roles is done. A replica's processes
get ``CHAOS_ROLE`` and ``CHAOS_REPLICA``, their events ``data.role`` and ``data.replica``; :meth:`RolesJob.stop`
ends every replica and what outlived it. The whole contract (ports, events, serving fleets, roles on other
hosts): ``docs/design/roles-target.md``.
"""

from __future__ import annotations

import os
import queue
import shutil
import socket
import threading
import time
from pathlib import Path

from pydantic import JsonValue

from chaos.cluster.base import Transport
from chaos.event_kinds import SERVING_REPLICA_START as REPLICA_START
from chaos.event_kinds import TARGET_EXIT, TARGET_READY
from chaos.event_kinds import TARGET_ROLE_EXIT as ROLE_EXIT
from chaos.event_kinds import TARGET_ROLE_READY as ROLE_READY
from chaos.event_kinds import TARGET_ROLE_RESTART as ROLE_RESTART
from chaos.event_kinds import TARGET_ROLE_START as ROLE_START
from chaos.event_kinds import TARGET_ROLE_UNREADY as ROLE_UNREADY
from chaos.event_kinds import TARGET_TORCHFT_REPLICA as TORCHFT_REPLICA
from chaos.history.timeline import Event, LineMatcher, now_ns
from chaos.plugins.injector import JobTree
from chaos.spec.roles import RoleSpec, RolesTarget, replica_names_of
from chaos.targets.balancers import balancer_matchers
from chaos.targets.base import (
    SpawnedJob,
    TargetUnusable,
    output_matchers,
    port_for,
    ports_event,
    with_step_reporter,
)
from chaos.targets.command import expand
from chaos.targets.interpreter import torchrun_log_dir
from chaos.targets.process_tree import trees
from chaos.targets.role_hosts import RoleHost, installed, kill_seen, local_host, process_tree, python_on

_SUPERVISE_EVERY = 0.05  # seconds between looks at the replicas: bounds a restart's reaction time
_TREE_EVERY = 1.0  # seconds between scans of /proc for the replicas' processes (a scan reads every process)


class _Replica:
    """One replica of a role: its settings and its current attempt (0 first, then one per restart)."""

    def __init__(self, role: str, name: str, index: int, spec: RoleSpec, host: RoleHost) -> None:
        self.role = role
        self.host = host
        self.name = name
        self.index = index
        self.spec = spec
        self.attempt = 0
        self.job: SpawnedJob | None = None
        self.restart_at: float | None = None  # monotonic time of a pending restart
        self.done = False  # exited and not to be started again
        self.last_code: int | None = None
        self.seen: dict[int, int] = {}  # every process ever seen in its tree: pid -> start time
        self.ready_attempt: int | None = None  # the attempt whose port last accepted a connection

    def tag(self) -> dict[str, JsonValue]:
        return {"role": self.role, "replica": self.name}


class RolesJob:
    """A ``roles`` target (see the module docstring for its contracts)."""

    def __init__(
        self,
        spec: RolesTarget,
        transport: Transport,
        run_dir: Path,
        seed: int,
        extra_env: dict[str, str] | None = None,
        placement: dict[str, RoleHost] | None = None,
        scenario_dir: Path | None = None,
    ) -> None:
        self.spec = spec
        self.scenario_dir = scenario_dir if scenario_dir is not None else Path.cwd()
        self.transport = transport
        self.run_dir = run_dir
        self.seed = seed
        self.extra_env = dict(extra_env or {})
        here = local_host(transport)
        hosts = dict(placement or {})
        unplaced = [host for host in spec.hosts() if host not in hosts]
        if unplaced:
            raise ValueError(f"roles run on {', '.join(unplaced)}, but no placement was given for it")

        def host_of(role: str, index: int) -> RoleHost:
            name = spec.roles[role].host_of(index)
            return here if name is None else hosts[name]

        self._first_host = {role: host_of(role, 0) for role in spec.roles}
        self._replicas = [
            _Replica(role, name, index, spec.roles[role], host_of(role, index))
            for role in spec.start_order()
            for index, name in enumerate(replica_names_of(role, spec.roles[role].replicas))
        ]
        self._ready: set[str] = set()  # roles that are ready
        self._given_up: set[str] = set()  # roles whose `after` never became ready
        self._started_at = 0.0
        self._events: queue.Queue[Event] = queue.Queue()
        self._lock = threading.Lock()  # guards starting processes against stop()
        self._stopping = threading.Event()
        self._supervisor: threading.Thread | None = None
        self._exit: int | None = None
        self._exit_reported = False
        self._all_ready = False  # target.ready was reported
        self._ports: dict[str, int] = {}  # role -> its port (a pinned one, or the one chosen for `auto`)
        self._torchft_ids: dict[str, str] = {}  # torchft replica id -> the replica whose output announced it

    # -- the Target protocol
    def start(self) -> None:
        if self._supervisor is not None:
            raise RuntimeError("this RolesJob was already started")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._choose_ports()
        self._started_at = time.monotonic()
        with self._lock:
            for replica in self._replicas:
                if not replica.spec.after:
                    self._spawn(replica)
        self._supervisor = threading.Thread(target=self._supervise, name="roles-supervisor", daemon=True)
        self._supervisor.start()

    def poll_events(self) -> list[Event]:
        ended = self._exit  # read first: every event before the end was queued before it was set
        out: list[Event] = []
        while True:
            try:
                out.append(self._events.get_nowait())
            except queue.Empty:
                break
        out.sort(key=lambda event: event.ts_ns)
        if ended is not None and not self._exit_reported:
            self._exit_reported = True
            out.append(Event(ts_ns=now_ns(), kind=TARGET_EXIT, source="runner", data={"code": ended}))
        return out

    def exit_code(self) -> int | None:
        return self._exit

    def port_named(self, name: str) -> int | None:
        """The port role ``name`` serves on (NamedPorts): a fault's ``ports: [primary]``; None before it is chosen."""
        return self._ports.get(name)

    def stop(self, grace: float = 10.0) -> None:
        with self._lock:
            self._stopping.set()  # from here on, nothing is started
        if self._supervisor is not None:
            self._supervisor.join(timeout=5)
        self._remember_trees()
        jobs = [r.job for r in self._replicas if r.job is not None]
        stoppers = [threading.Thread(target=job.stop, args=(grace,), daemon=True) for job in jobs]
        for thread in stoppers:
            thread.start()
        for thread in stoppers:
            thread.join(timeout=grace + 15)
        for replica in self._replicas:
            kill_seen(replica.host, replica.seen)  # workers in sessions of their own that outlived their launcher
            self._collect(replica)  # their exits, reported as expected ones

    def describe(self) -> str:
        parts = [f"{role} x{spec.replicas}" if spec.replicas > 1 else role for role, spec in self.spec.roles.items()]
        return "roles: " + ", ".join(parts)

    def preflight(self) -> None:
        """Refuse (:class:`TargetUnusable`) roles whose program is not installed here, before anything starts
        (e.g. ``haproxy`` without the Debian package), instead of replicas that die at every restart."""
        missing: list[str] = []
        asked: set[tuple[str, str, str]] = set()  # (role, host, program): replicas of a role share an answer
        for replica in self._replicas:
            role, spec, host = replica.role, replica.spec, replica.host
            if spec.command is None:
                program = spec.python or python_on(host)
            else:
                program = expand(spec.command[0], self._values(replica))
            if (role, host.name, program) in asked:
                continue
            asked.add((role, host.name, program))
            if not installed(host, program):
                hint = " (Debian: apt-get install haproxy, or `make setup` as root)" if program == "haproxy" else ""
                where = "here" if host.local else f"on host {host.name!r} (or the host does not answer)"
                missing.append(f"role {role!r} runs {program!r}, which is not installed {where}{hint}")
        if missing:
            raise TargetUnusable("; ".join(missing))

    # -- what process faults need (ReplicaResolver)
    def replicas(self) -> list[str]:
        """Every replica's name, in start order."""
        return [replica.name for replica in self._replicas]

    def pids_for_replica(self, name: str) -> list[int]:
        """The replica's launcher and every process below it now; empty while it is down."""
        for replica in self._replicas:
            if replica.name == name:
                job = replica.job
                if job is None or job.pid is None or job.exit_code() is not None:
                    return []
                return list(self._remember_tree(replica))
        return []

    def host_for_replica(self, name: str) -> str | None:
        """The host replica ``name`` runs on (``local`` for this machine); None for no such replica."""
        return next((r.host.name for r in self._replicas if r.name == name), None)

    def job_tree(self, host: str) -> JobTree:
        """The launchers of the replicas on ``host`` and the processes below them now (``name:`` selectors match
        only inside it); ``here`` False on a host no replica runs on."""
        here = [replica for replica in self._replicas if replica.host.name == host]
        if not here:
            return JobTree(frozenset(), frozenset(), here=False)
        launchers: set[int] = set()
        members: set[int] = set()
        for pid, now in self._remember(here).values():
            if pid in now:
                launchers.add(pid)
                members |= set(now) - {pid}
        return JobTree(frozenset(launchers), frozenset(members))

    # -- internals
    def _remember(self, replicas: list[_Replica]) -> dict[str, tuple[int, dict[int, int]]]:
        """The live ones of ``replicas``: name -> (launcher pid, its process tree now), each tree also noted in
        the replica's ``seen``. The local ones come from one read of /proc, a remote one from one command."""
        live = [
            (r, r.job.pid)
            for r in replicas
            if r.job is not None and r.job.pid is not None and r.job.exit_code() is None
        ]
        local = trees([pid for r, pid in live if r.host.local])
        found: dict[str, tuple[int, dict[int, int]]] = {}
        for replica, pid in live:
            now = local[pid] if replica.host.local else process_tree(replica.host, pid)
            replica.seen.update(now)
            found[replica.name] = (pid, now)
        return found

    def _remember_tree(self, replica: _Replica) -> dict[int, int]:
        return self._remember([replica]).get(replica.name, (0, {}))[1]

    def _remember_trees(self) -> None:
        """Note every replica's processes, so stop() can reap workers that outlive a killed launcher."""
        self._remember(self._replicas)

    def _argv(self, replica: _Replica, values: dict[str, str]) -> tuple[list[str], list[LineMatcher]]:
        spec = replica.spec
        matchers = output_matchers(spec.signatures, spec.matchers)
        if spec.command is not None:
            return [expand(part, values) for part in spec.command], matchers
        run = spec.torchrun
        if run is None:  # the model guarantees one of them
            raise AssertionError("a role without command or torchrun")
        launcher = [values["python"], "-m", "torch.distributed.run"]
        argv = [*launcher, *torchrun_log_dir(launcher, values["run_dir"]), "--standalone", "--nnodes", "1"]
        argv += ["--nproc-per-node", str(run.nproc_per_node), "--max-restarts", str(run.max_restarts)]
        argv += ["--monitor-interval", f"{run.monitor_interval:g}"]
        argv += ["-m", run.module] if run.module is not None else [expand(run.script or "", values)]
        return argv + [expand(arg, values) for arg in run.args], matchers

    def _values(self, replica: _Replica) -> dict[str, str]:
        """The placeholders of a replica's command, args and env (see :class:`chaos.spec.roles.RoleSpec`)."""
        python = replica.spec.python or python_on(replica.host)
        values = {
            "run_dir": str(self.run_dir),
            "seed": str(self.seed),
            "role": replica.role,
            "replica": replica.name,
            "index": str(replica.index),
            "python": python,
            "bin": os.path.dirname(
                python if os.sep in python or not replica.host.local else shutil.which(python) or ""
            ),
            "scenario_dir": str(self.scenario_dir),
        }
        values.update(self._address_values())
        return values

    def _address_values(self) -> dict[str, str]:
        """``{port:ROLE}`` and ``{host:ROLE}``: the placeholders every replica and the fleet ``url`` share."""
        values = {f"port:{name}": str(port) for name, port in self._ports.items()}
        return values | {f"host:{name}": host.address for name, host in self._first_host.items()}

    def _choose_ports(self) -> None:
        """Each port role's port: a pinned one as it is, ``auto`` a free one on the role's host now; recorded
        as ``target.ports``."""
        chosen: list[str] = []
        for role, spec in self.spec.roles.items():
            if spec.port == "auto":
                self._ports[role] = port_for(self._first_host[role].transport, f"role {role!r} (port: auto)")
                chosen.append(role)
            elif spec.port is not None:
                self._ports[role] = spec.port
        if self._ports:
            self._events.put(ports_event(self._ports, chosen))

    def _spawn(self, replica: _Replica) -> None:
        """Start the replica's current attempt (caller holds the lock and has checked ``_stopping``)."""
        values = self._values(replica)
        argv, matchers = self._argv(replica, values)
        if replica.spec.balancer is not None:
            matchers += balancer_matchers(replica.spec.balancer)
        # Not the torchrun target's TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: torchft's Manager connects to the store
        # torchrun shares at MASTER_PORT (is_master=False) and waits forever without it. A role restarts as a
        # whole (torchrun's own --max-restarts 0 by default), so the flaky in-place restarts it avoids do not arise.
        env = {"OMP_NUM_THREADS": "1"}
        env.update(self.extra_env)
        env.update({k: expand(v, values) for k, v in replica.spec.env.items()})
        env.update(
            {"CHAOS_ROLE": replica.role, "CHAOS_REPLICA": replica.name, "CHAOS_REPLICA_INDEX": str(replica.index)}
        )
        spec = replica.spec
        env = with_step_reporter(
            env, wanted=spec.optimizer_steps, matchers=spec.matchers, transport=replica.host.transport
        )
        replica.job = SpawnedJob(
            replica.host.transport,
            argv,
            env=env,
            run_dir=self.run_dir,
            matchers=matchers,
            log_name=f"{replica.name}.log",
            host=None if replica.host.local else replica.host.name,
            events_name=f"events-{replica.name}.{replica.attempt}.jsonl",
        )
        replica.job.start()
        data: dict[str, JsonValue] = {**replica.tag(), "index": replica.index, "pid": replica.job.pid}
        data["attempt"] = replica.attempt
        self._events.put(Event(ts_ns=now_ns(), kind=ROLE_START, source="runner", data=data))
        if replica.spec.backend is not None:
            serving: dict[str, JsonValue] = {**data, "backend": replica.spec.backend}
            self._events.put(Event(ts_ns=now_ns(), kind=REPLICA_START, source="runner", data=serving))
        if replica.spec.port is None and replica.index == replica.spec.replicas - 1:
            self._ready.add(replica.role)  # no port to wait on: started is as ready as it gets

    def _collect(self, replica: _Replica) -> bool:
        """Queue the replica's new events (tagged), its exit translated; True when its process has exited."""
        job = replica.job
        if job is None:
            return False
        exited = False
        for event in job.poll_events():
            if event.kind != TARGET_EXIT:
                if "replica" not in event.data:
                    event = event.model_copy(update={"data": {**event.data, **self._about(replica, event)}})
                self._events.put(event)
                continue
            exited = True
            code = event.get_int("code")
            replica.last_code = code
            data: dict[str, JsonValue] = {**replica.tag(), "index": replica.index, "pid": job.pid, "code": code}
            data.update({"attempt": replica.attempt, "expected": self._stopping.is_set()})
            self._events.put(Event(ts_ns=event.ts_ns, kind=ROLE_EXIT, source="runner", data=data))
        return exited

    def _about(self, replica: _Replica, event: Event) -> dict[str, JsonValue]:
        """The replica an event of ``replica``'s output is about: a backend's (a load balancer's or a gateway's
        event), the torchft groups a survivor saw leave its quorum (``lost``: torchft replica ids, named by each
        group's own ``target.torchft_replica``; the survivor is the ``reporter``), else the reporting replica."""
        if event.kind == TORCHFT_REPLICA:
            self._torchft_ids[str(event.data.get("replica_id"))] = replica.name
        backend, lost = event.data.get("backend"), event.data.get("lost")
        if isinstance(lost, list):
            named = sorted({self._torchft_ids[i] for i in lost if isinstance(i, str) and i in self._torchft_ids})
            about: dict[str, JsonValue] = {"role": replica.role, "reporter": replica.name}
            return about | ({"replica": named[0]} if len(named) == 1 else {"replicas": list(named)})
        return {"role": replica.role, "replica": backend if isinstance(backend, str) else replica.name}

    def _restarts(self, replica: _Replica) -> bool:
        restart = replica.spec.restart
        if restart.policy == "never" or (restart.policy == "on-failure" and replica.last_code == 0):
            return False
        return restart.max_restarts is None or replica.attempt < restart.max_restarts

    def _check_ready(self) -> None:
        """Probe the port of each running replica whose current attempt was not ready yet (a restarted server
        is ready again only once it accepts); report ``target.ready`` when every port role was ready once."""
        for replica in self._replicas:
            port = self._ports.get(replica.role)
            job = replica.job
            if (
                port is None
                or job is None
                or replica.ready_attempt == replica.attempt
                or replica.restart_at is not None
            ):
                continue
            if job.exit_code() is not None:
                continue
            try:
                with socket.create_connection((replica.host.address, port), timeout=0.2):
                    pass
            except OSError:
                continue
            replica.ready_attempt = replica.attempt
            self._ready.add(replica.role)
            data: dict[str, JsonValue] = {**replica.tag(), "port": port, "attempt": replica.attempt}
            self._events.put(Event(ts_ns=now_ns(), kind=ROLE_READY, source="runner", data=data))
        ported = {role for role, spec in self.spec.roles.items() if spec.port is not None}
        started = all(replica.job is not None for replica in self._replicas)
        if not self._all_ready and started and ported <= self._ready:
            self._all_ready = True
            self._events.put(Event(ts_ns=now_ns(), kind=TARGET_READY, source="runner", data={}))

    def _start_waiting(self) -> None:
        """Start the replicas whose ``after`` roles are ready; give up on those that waited too long."""
        waited = time.monotonic() - self._started_at
        for replica in self._replicas:
            if replica.job is not None or replica.done or replica.role in self._given_up:
                continue
            missing = [other for other in replica.spec.after if other not in self._ready]
            if not missing:
                with self._lock:
                    if self._stopping.is_set():
                        return
                    self._spawn(replica)
            elif waited > self.spec.ready_timeout:
                self._given_up.add(replica.role)
                data: dict[str, JsonValue] = {"role": replica.role, "waiting_for": list(missing)}
                self._events.put(Event(ts_ns=now_ns(), kind=ROLE_UNREADY, source="runner", data=data))
        for replica in self._replicas:
            if replica.role in self._given_up and not replica.done:
                replica.done, replica.last_code = True, None

    def _supervise(self) -> None:
        looked = 0.0
        while not self._stopping.wait(_SUPERVISE_EVERY):
            self._check_ready()
            self._start_waiting()
            if time.monotonic() - looked > _TREE_EVERY:
                looked = time.monotonic()
                self._remember_trees()
            for replica in self._replicas:
                if replica.done or replica.job is None:
                    continue
                if replica.restart_at is None:
                    if self._collect(replica):
                        if self._restarts(replica):
                            replica.restart_at = time.monotonic() + replica.spec.restart.delay
                        else:
                            replica.done = True
                    continue
                if time.monotonic() < replica.restart_at:
                    continue
                with self._lock:
                    if self._stopping.is_set():
                        return
                    replica.attempt += 1
                    replica.restart_at = None
                    data: dict[str, JsonValue] = {**replica.tag(), "attempt": replica.attempt}
                    data["delay"] = replica.spec.restart.delay
                    self._events.put(Event(ts_ns=now_ns(), kind=ROLE_RESTART, source="runner", data=data))
                    self._spawn(replica)
            self._maybe_ended()

    def _maybe_ended(self) -> None:
        if self._exit is not None:
            return
        until = set(self.spec.until or self.spec.roles)
        final = [r for r in self._replicas if r.role in until]
        if all(r.done for r in final):
            codes = [r.last_code for r in final]
            self._exit = next((c if c is not None else 1 for c in codes if c != 0), 0)


class ServingRolesJob(RolesJob):
    """A roles target with a ``url`` (a serving fleet): the runner holds the faults, the load and the progress
    watch until ``target.ready`` (every role with a port accepted once), then sends the load's requests to
    ``url``."""

    ready_event = TARGET_READY

    @property
    def url(self) -> str:
        if self.spec.url is None:  # the factory makes this class only for a target with a url
            raise AssertionError("a ServingRolesJob without a url")
        return expand(self.spec.url, self._address_values())
