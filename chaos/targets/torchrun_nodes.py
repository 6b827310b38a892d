"""A torchrun job across inventory hosts: one torchrun agent per host over SSH, joined by a c10d rendezvous.

Node 0 (the first selected host) hosts the rendezvous store at ``address:rdzv_port`` (``is_host=1``), or, with
``rdzv_backend: etcd-v2``, the agents meet in the etcd the user runs on ``rdzv_host`` at ``rdzv_port``: that
host is the store's (``hosts: {role: rdzv_store}``) and ``rdzv`` names its port (:meth:`port_named`). Every
agent is told its own inventory address with ``--local-addr``, so nothing depends on the hosts' names
resolving (testbed hosts' do not, and staging hosts' often resolve to the wrong interface). c10d orders
nodes by that address, so on a fresh rendezvous the lowest address gets ranks ``0..nproc_per_node-1``.

``GLOO_SOCKET_IFNAME`` is set per host to the interface that carries its inventory address (found with
``ip -o -4 addr show``) unless the scenario's ``env`` sets it. Ranks report with ``CHAOS_EVENTS=stdout``:
events come back over each agent's SSH channel, moved onto the harness clock and tagged with the host, so
the rank -> host mapping is in the history (``target.start`` events carry ``data.host``). The agents log at INFO
(``LOGLEVEL=INFO`` unless ``env`` sets it), so their rendezvous rounds and restarts are read from their output
(``target.rendezvous``, ``target.agent_restart``: :mod:`chaos.history.torch_signatures`). Whatever the job
reports, each host's launcher tree is scanned (one command per scan per host,
:mod:`chaos.targets.rank_discovery`): every worker's global rank, local rank, group rank and restart count
become ``target.worker`` events {host, ...} and the rank table's entries, and a host's rising restart count a
``target.restart`` {host, restart, cause} (no ``attempt``: job-wide attempts are counted by
:class:`JobAttempts`, a node's restarts are its own).

Paths in ``args`` (``{run_dir}``, checkpoint dirs) must mean the same on every host: a shared filesystem,
as real clusters have for checkpoints (testbed hosts share this machine's). The job is over when every
agent exited; when one agent fails for good the others are stopped, so a run never waits on an orphaned
rendezvous.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from chaos.cluster.base import Transport, TransportError, host_python, kill_if_same, pid_start_time
from chaos.event_kinds import TARGET_EXIT, TARGET_START
from chaos.event_kinds import TARGET_NODE_EXIT as NODE_EXIT
from chaos.history.timeline import Event, now_ns
from chaos.plugins.injector import RDZV_PORT
from chaos.spec.scenario import TorchrunTarget
from chaos.targets.base import SpawnedJob, TargetUnusable, port_for, ports_event
from chaos.targets.interpreter import torchrun_launcher, torchrun_log_dir
from chaos.targets.rank_discovery import Discovery, scan_local, scan_remote
from chaos.targets.torchrun import RankLookup, RankTable, job_what, torchrun_env, torchrun_matchers, torchrun_tail


@dataclass(frozen=True)
class Node:
    """One host of the job: its inventory name and address, and how to reach it."""

    name: str
    address: str
    transport: Transport


def interface_of(transport: Transport, address: str) -> str | None:
    """The network interface on the host that carries ``address`` (for GLOO_SOCKET_IFNAME), or None."""
    try:
        wanted = str(ipaddress.ip_address(address))
    except ValueError:
        try:
            wanted = socket.gethostbyname(address)
        except OSError:
            return None
    try:
        done = transport.run(["ip", "-o", "-4", "addr", "show"], timeout=15)
    except TransportError:
        return None
    for line in done.stdout.splitlines():
        fields = line.split()
        # "2: eth0    inet 10.213.5.11/24 brd ... scope global eth0"
        if len(fields) >= 4 and fields[2] == "inet" and fields[3].split("/")[0] == wanted:
            return fields[1].split("@")[0]
    return None


class JobAttempts:
    """Job-wide attempt numbers for a multi-node job.

    Ranks report ``attempt`` from torchrun's ``TORCHELASTIC_RESTART_COUNT``, which counts restarts of ONE
    agent: when a node fails, its agent counts a restart but the others re-join the new round with their
    count unchanged. A new job-wide attempt begins when a rank starts again that already started in the
    current one; every later event of that rank carries it (the node's own count stays as ``node_attempt``).
    """

    def __init__(self) -> None:
        self.current = 0
        self._started: set[int] = set()
        self._of_rank: dict[int, int] = {}

    def rewrite(self, event: Event) -> Event:
        if event.rank is None:
            return event
        if event.kind == TARGET_START:
            if event.rank in self._started:
                self.current += 1
                self._started = set()
            self._started.add(event.rank)
            self._of_rank[event.rank] = self.current
        attempt = self._of_rank.get(event.rank)
        if attempt is None or "attempt" not in event.data:
            return event
        data = {**event.data, "attempt": attempt, "node_attempt": event.data["attempt"]}
        return event.model_copy(update={"data": data})


class MultiNodeTorchrunJob(RankLookup):
    """``torchrun --nnodes N --rdzv-backend c10d|etcd-v2`` on each of ``nodes``; RankResolver with hosts,
    RankPlacement, NamedPorts (``rdzv``) and Preflight (every node must answer before the run starts)."""

    def __init__(
        self,
        spec: TorchrunTarget,
        nodes: list[Node],
        run_dir: Path,
        seed: int,
        extra_env: dict[str, str] | None = None,
        store: Node | None = None,
    ) -> None:
        if not nodes:
            raise ValueError("a multi-node torchrun target needs at least one node")
        if (store is None) != (spec.rdzv_backend == "c10d"):
            raise ValueError("the store's host is given for etcd-v2 (the user's etcd), and only then")
        self.spec = spec
        self.nodes = nodes
        self.store = store or nodes[0]  # the host of the rendezvous store: node 0 hosts c10d's
        self.run_dir = run_dir
        self._values = {"run_dir": str(run_dir), "seed": str(seed)}
        self._env = {"LOGLEVEL": "INFO", **torchrun_env(spec, self._values, extra_env)}
        self._jobs: dict[str, SpawnedJob] = {}
        self.table = RankTable()
        self.discovery = Discovery(self.table.observe_worker)
        self._exits: dict[str, int] = {}
        self._attempts = JobAttempts()
        self._exit_reported = False
        self._stopping = False
        self._rdzv_port = spec.rdzv_port if spec.rdzv_port != "auto" else None
        self._announced: list[Event] = []  # target.ports, reported by the first poll

    @property
    def rdzv_endpoint(self) -> str:
        """``address:port`` of the rendezvous store (``rdzv_port: auto`` is chosen by :meth:`start`)."""
        if self._rdzv_port is None:
            raise RuntimeError("rdzv_port: auto is chosen when the job starts")
        return f"{self.store.address}:{self._rdzv_port}"

    def port_named(self, name: str) -> int | None:
        """``rdzv``: the rendezvous store's port (NamedPorts); None before ``rdzv_port: auto`` is chosen."""
        return self._rdzv_port if name == RDZV_PORT else None

    def argv(self, index: int) -> list[str]:
        """The torchrun command line of node ``index``."""
        node = self.nodes[index]
        # Each host's own interpreter (the inventory's python) unless the target names one (python:/torchrun:).
        launcher, job_python = torchrun_launcher(self.spec, self.spec.python or host_python(node.transport))
        return [
            *launcher,
            *torchrun_log_dir(launcher, str(self.run_dir)),
            "--nnodes",
            str(len(self.nodes)),
            "--nproc-per-node",
            str(self.spec.nproc_per_node),
            "--rdzv-backend",
            self.spec.rdzv_backend,
            "--rdzv-endpoint",
            self.rdzv_endpoint,
            "--rdzv-id",
            self.run_dir.name,
            *(["--rdzv-conf", f"is_host={1 if index == 0 else 0}"] if self.spec.rdzv_backend == "c10d" else []),
            "--local-addr",
            node.address,
            *torchrun_tail(self.spec, self._values, job_python),
        ]

    def start(self) -> None:
        if self._rdzv_port is None:
            self._rdzv_port = port_for(self.nodes[0].transport, "rdzv_port: auto")
        chosen = ["rdzv"] if self.spec.rdzv_port == "auto" else []
        self._announced.append(ports_event({"rdzv": self._rdzv_port}, chosen))
        # Node 0 first: it binds the rendezvous store the others connect to (they retry until it is up).
        for index, node in enumerate(self.nodes):
            env = dict(self._env)
            if "GLOO_SOCKET_IFNAME" not in env and (ifname := interface_of(node.transport, node.address)):
                env["GLOO_SOCKET_IFNAME"] = ifname
            job = SpawnedJob(
                node.transport,
                self.argv(index),
                env=env,
                run_dir=self.run_dir,
                matchers=torchrun_matchers(self.spec),
                log_name=f"target-{node.name}.log",
                host=node.name,
            )
            job.start()
            self._jobs[node.name] = job
            scan = scan_local if job.local else partial(scan_remote, node.transport)
            self.discovery.start(node.name, job.pid, scan, restart_is_attempt=False)

    def poll_events(self) -> list[Event]:
        events, self._announced = self._announced, []
        for name, job in self._jobs.items():
            for event in job.poll_events():
                if event.kind == TARGET_EXIT:
                    code = event.get_int("code")
                    self._exits[name] = code if code is not None else -1
                    event = event.model_copy(update={"kind": NODE_EXIT})
                    self.discovery.finish(name)
                else:
                    event = self._attempts.rewrite(self._tagged(event, name))
                    self.table.observe(event, name, partial(pid_start_time, job.transport))
                    self.discovery.note(name, event)
                events.append(event)
        events[:0] = self.discovery.drain()  # found before this poll; node exits and target.exit stay last
        failed = [name for name, code in self._exits.items() if code != 0]
        if failed and not self._stopping and len(self._exits) < len(self._jobs):
            # One agent gave up (restarts exhausted): the others would wait for it at the rendezvous.
            self._stopping = True
            threading.Thread(target=self.stop, kwargs={"grace": 10.0}, daemon=True).start()
        if len(self._exits) == len(self._jobs) and not self._exit_reported:
            self._exit_reported = True
            code = self._code()
            events.append(Event(ts_ns=now_ns(), kind=TARGET_EXIT, source="runner", data={"code": code}))
        return events

    @staticmethod
    def _tagged(event: Event, host: str) -> Event:
        """Tag ``event`` with its host. The launcher's own log names LOCAL ranks: on node k local rank 0 is
        not global rank 0, so such events keep it as ``data.local_rank`` instead of the rank field."""
        data = dict(event.data)
        data.setdefault("host", host)
        update: dict[str, object] = {"data": data}
        if event.source == "torchrun" and event.rank is not None:
            data["local_rank"] = event.rank
            update["rank"] = None
        return event.model_copy(update=update)

    def _code(self) -> int:
        return next((code for code in self._exits.values() if code != 0), 0)

    def exit_code(self) -> int | None:
        if not self._jobs or any(job.exit_code() is None for job in self._jobs.values()):
            return None
        codes = [job.exit_code() or 0 for job in self._jobs.values()]
        return next((code for code in codes if code != 0), 0)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM every agent (they stop their workers), SIGKILL after ``grace``, then reap any worker
        still alive by pid on its host (an agent SIGKILLed cannot take its workers down)."""
        self.discovery.refresh()  # the workers of right now, so none escapes the reaping below
        self.discovery.finish()
        threads = [threading.Thread(target=job.stop, args=(grace,), daemon=True) for job in self._jobs.values()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=grace + 30)
        for node in self.nodes:
            workers = self.table.workers_on(node.name)
            if workers:
                kill_if_same(node.transport, workers)

    def describe(self) -> str:
        hosts = ", ".join(self.node_names())
        store = f" (etcd-v2 rendezvous on {self.store.name})" if self.spec.rdzv_backend != "c10d" else ""
        what = f"{self.spec.nproc_per_node} ranks on {hosts}{store}: {job_what(self.spec)}"
        return f"torchrun {len(self.nodes)} nodes x {what}"

    def node_names(self) -> list[str]:
        """Every host a rank may run on (RankPlacement)."""
        return [node.name for node in self.nodes]

    def preflight(self) -> None:
        """Run ``true`` on every node; :class:`TargetUnusable` names the first that cannot (Preflight)."""
        for node in self.nodes:
            try:
                node.transport.run(["true"], timeout=30, check=True)
            except TransportError as exc:
                raise TargetUnusable(f"target node {node.name!r} is not usable: {exc}") from None
            if self.spec.rdzv_backend == "etcd-v2":
                self._etcd_client(node)

    def _etcd_client(self, node: Node) -> None:
        """TargetUnusable unless the node's job interpreter imports python-etcd (torch's etcd-v2 rendezvous does)."""
        python = self.spec.python or host_python(node.transport)
        try:
            done = node.transport.run([python, "-c", "import etcd"], timeout=60)
        except TransportError as exc:
            raise TargetUnusable(f"target node {node.name!r} is not usable: {exc}") from None
        if not done.ok:
            raise TargetUnusable(
                f"{python} on {node.name!r} cannot import etcd: torch's etcd-v2 rendezvous needs python-etcd there "
                "(pip install python-etcd, or mlchaos[etcd])"
            )
