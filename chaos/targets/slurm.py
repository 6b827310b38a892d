"""The ``slurm`` target: a batch job submitted with ``sbatch`` and followed through Slurm's own eyes.

``start`` submits the scenario's script (``sbatch --parsable --nodes N --ntasks-per-node T --requeue
--output <run dir>/target.log --open-mode=append``) through a :class:`~chaos.slurm.client.SlurmClient`
of the scenario's cluster (:mod:`chaos.slurm.locate`), with ``CHAOS_EVENTS`` naming
``<run dir>/events.jsonl``: every task of every attempt appends its events there (a shared filesystem: the
testbed's hosts share this machine's; an existing cluster's run dir must be on one its nodes mount at the same
path). A background thread polls ``scontrol show job`` and ``scontrol show node`` every ``poll_interval`` and
turns each observed change into ``slurm.job`` / ``slurm.node`` events (:mod:`chaos.targets.slurm_watch`).

Rank -> node comes from Slurm itself: a rank's ``target.start`` {pid} is looked up in that process's
environment (``SLURMD_NODENAME``, ``SLURM_JOB_ID``, ``SLURM_PROCID``, and ``RANK`` when a launcher set one),
read on this machine for the testbed (one pid namespace) or on the allocated nodes over their inventory
transports; the event then carries ``host`` (the inventory host) and ``node`` (Slurm's name), and a rank the
job did not name gets ``RANK``, else ``SLURM_PROCID``.

The job is over (``target.exit`` {code, job_id, state}) when it has held a final state (COMPLETED, FAILED,
CANCELLED, TIMEOUT, NODE_FAIL ...) for a second: a requeued job comes back PENDING under the same id and is
not over. ``stop`` scancels it and waits for that.

Abilities: Preflight (the cluster answers, the partition has the nodes, the script exists), RankPlacement
and RankResolver (process faults by rank land on the node that runs the rank), and the allocation the
``hosts: {slurm: allocated|spare}`` selector reads (:class:`chaos.cluster.hosts.SlurmPlacement`).
"""

from __future__ import annotations

import queue
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from pydantic import JsonValue

from chaos.cluster.base import Transport, TransportError
from chaos.cluster.hosts import host_of_node
from chaos.cluster.inventory import Inventory
from chaos.event_kinds import SLURM_POLL_FAILED as POLL_FAILED
from chaos.event_kinds import TARGET_EXIT, TARGET_START
from chaos.events import ENV_EVENTS
from chaos.history.timeline import Event, EventFileTail, LineTail, now_ns
from chaos.slurm.client import JobNotFound, SlurmClient, SlurmError
from chaos.slurm.locate import ClusterNotFound, SlurmCluster
from chaos.spec.slurm import SlurmTarget
from chaos.targets.base import TargetUnusable, output_matchers
from chaos.targets.command import expand
from chaos.targets.interpreter import torchrun_log_env
from chaos.targets.slurm_watch import SOURCE, JobView, JobWatch, NodeWatch, exit_code_of
from chaos.targets.torchrun import RankTable

_ENV_KEYS = ("SLURM_JOB_ID", "SLURMD_NODENAME", "SLURM_PROCID", "RANK")
_STOP_WAIT_S = 30.0  # after scancel: KillWait and the epilog, then the final state shows


class SlurmJob:
    """One ``sbatch`` job of a :class:`~chaos.spec.slurm.SlurmTarget` (see the module doc)."""

    def __init__(
        self,
        spec: SlurmTarget,
        cluster: SlurmCluster | str,
        run_dir: Path,
        seed: int,
        extra_env: dict[str, str] | None = None,
        *,
        inventory: Inventory | None = None,
        scenario_dir: Path | None = None,
        reach: Callable[[str], Transport] | None = None,
        run_bound_s: float | None = None,
    ) -> None:
        self.spec = spec
        self.run_bound_s = run_bound_s  # the job's time limit is at most this (see time_limit_minutes)
        self._cluster = cluster  # or why none could be found (preflight and start refuse with it)
        self.run_dir = run_dir
        self.inventory = inventory
        self.scenario_dir = scenario_dir
        self._reach = reach  # inventory host -> its transport (an existing cluster's nodes)
        # {python}: mlchaos's own interpreter (it has torch and the agent), for jobs on nodes that share this
        # machine's filesystem (the testbed's); on an existing cluster name the nodes' own interpreter instead.
        self._values = {"run_dir": str(run_dir), "seed": str(seed), "python": sys.executable}
        if scenario_dir is not None:
            self._values["scenario_dir"] = str(scenario_dir)
        self.events_path = run_dir / "events.jsonl"
        self.log_path = run_dir / "target.log"
        self.env = {
            **torchrun_log_env(str(run_dir)),  # an sbatch script's torchrun: its files under the run dir, not /tmp
            **(extra_env or {}),
            ENV_EVENTS: str(self.events_path),
            "CHAOS_RUN_DIR": str(run_dir),
            "PYTHONUNBUFFERED": "1",
            **{name: expand(value, self._values) for name, value in spec.env.items()},
        }
        self.matchers = output_matchers(spec.signatures, spec.matchers)
        self.job_id: int | None = None
        self.table = RankTable()
        self._client: SlurmClient | None = None
        self._tail = EventFileTail(self.events_path)
        self._log = LineTail(self.log_path)
        self._queue: queue.Queue[Event] = queue.Queue()
        self._lock = threading.Lock()
        self._allocation: tuple[str, ...] | None = None  # None until the first poll
        self._partition: list[str] | None = None
        self._exit: int | None = None
        self._exit_reported = False
        self._done = threading.Event()
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None
        self._environs: dict[int, dict[str, str]] = {}

    # -- the cluster ---------------------------------------------------------------------------------------

    @property
    def cluster(self) -> SlurmCluster:
        """The cluster the job runs on; TargetUnusable when none was found."""
        if isinstance(self._cluster, str):
            raise TargetUnusable(f"slurm target: {self._cluster}")
        return self._cluster

    @property
    def client(self) -> SlurmClient:
        if self._client is None:
            try:
                self._client = self.cluster.client(inventory=self.inventory)
            except ClusterNotFound as exc:
                raise TargetUnusable(f"slurm target: {exc}") from None
        return self._client

    def script_path(self) -> str:
        """The batch script as sbatch is given it: relative paths are the scenario folder's."""
        script = Path(self.spec.script)
        if not script.is_absolute() and self.scenario_dir is not None:
            script = self.scenario_dir / script
        return str(script)

    def preflight(self) -> None:
        """TargetUnusable unless the cluster answers, the partition has ``nodes`` nodes and (testbed) the script
        exists."""
        try:
            nodes = self.client.partition_nodes(self.spec.partition)
        except SlurmError as exc:
            raise TargetUnusable(f"slurm target: {self.cluster.describe()} does not answer: {exc}") from None
        if len(nodes) < self.spec.nodes:
            raise TargetUnusable(
                f"slurm target: partition {self.spec.partition or '(default)'} has {len(nodes)} node(s), the job asks "
                f"for {self.spec.nodes}"
            )
        with self._lock:
            self._partition = nodes
        if self.cluster.kind == "testbed" and not Path(self.script_path()).is_file():
            raise TargetUnusable(f"slurm target: no batch script at {self.script_path()}")

    def time_limit_minutes(self) -> int | None:
        """``sbatch --time`` in whole minutes, rounded up: the target's ``time_limit``, and never more than the
        run's own bound (``max_duration`` + ``heal_grace``). A harness that dies cannot scancel its job; Slurm
        then ends it at this limit instead of the cluster running it on for as long as it likes (a whole-minute
        bound: Slurm's unit)."""
        limits = [limit for limit in (self.spec.time_limit, self.run_bound_s) if limit is not None]
        return max(1, int(-(-min(limits) // 60))) if limits else None

    # -- Target ----------------------------------------------------------------------------------------------

    def start(self) -> None:
        spec = self.spec
        extra = ["--open-mode=append"]
        if (minutes := self.time_limit_minutes()) is not None:
            extra.append(f"--time={minutes}")
        try:
            self.job_id = self.client.submit(
                self.script_path(),
                nodes=spec.nodes,
                ntasks_per_node=spec.ntasks_per_node,
                job_name=spec.job_name or f"mlchaos-{self.run_dir.name}"[:128],
                output=self.log_path,
                requeue=spec.requeue,
                partition=spec.partition,
                extra=[*extra, *spec.sbatch],
                args=[expand(arg, self._values) for arg in spec.args],
                env=self.env,
            )
        except SlurmError as exc:
            raise TargetUnusable(f"sbatch failed: {exc}") from None
        if self._partition is None:
            try:
                self._partition = self.client.partition_nodes(spec.partition)
            except SlurmError:
                self._partition = None
        self._thread = threading.Thread(target=self._watch, args=(self.job_id,), daemon=True, name="slurm-watch")
        self._thread.start()

    def poll_events(self) -> list[Event]:
        finished = self._done.is_set()
        events = [self._placed(event) for event in self._tail.poll()]
        events += self._log_events()
        while True:
            try:
                event = self._queue.get_nowait()
            except queue.Empty:
                break
            if event.kind == TARGET_EXIT:
                if not finished:  # the job ended after the file was read: its last events go first
                    events += [self._placed(e) for e in self._tail.poll()] + self._log_events()
                self._exit_reported = True
            events.append(event)
        return events

    def exit_code(self) -> int | None:
        return self._exit if self._done.is_set() else None

    def stop(self, grace: float = 10.0) -> None:
        """``scancel`` the job (unless it is over) and wait until Slurm shows it ended; stop polling."""
        if self.job_id is not None and not self._done.is_set():
            try:
                self.client.cancel(self.job_id)
            except SlurmError:
                pass  # already gone: the poller sees the final state (or accounting does)
            self._done.wait(timeout=grace + _STOP_WAIT_S)
        self._halt.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def describe(self) -> str:
        job = f"slurm job {self.job_id}" if self.job_id is not None else "slurm job"
        args = " ".join(self.spec.args)
        shape = f"{self.spec.nodes} node(s) x {self.spec.ntasks_per_node} task(s)"
        where = self._cluster.describe() if isinstance(self._cluster, SlurmCluster) else "no cluster"
        return f"{job} ({shape}) on {where}: {self.spec.script} {args}".rstrip()

    # -- the poller -----------------------------------------------------------------------------------------

    def _watch(self, job_id: int) -> None:
        jobs, nodes = JobWatch(job_id), NodeWatch(self._partition)
        last_error = ""
        while not self._halt.is_set():
            ts = now_ns()
            try:
                view = self._observe(job_id)
                found = jobs.observe(view, ts, attempts=lambda: self.client.accounting(job_id))
                found += nodes.observe(self.client.nodes(), ts)
                last_error = ""
            except SlurmError as exc:
                if str(exc) != last_error:
                    last_error = str(exc)
                    self._queue.put(Event(ts_ns=ts, kind=POLL_FAILED, source=SOURCE, data={"error": last_error[:500]}))
                self._halt.wait(self.spec.poll_interval)
                continue
            with self._lock:
                self._allocation = _allocation(view)
            for event in found:
                self._queue.put(event)
            if jobs.settled(now_ns()):
                self._exit = exit_code_of(view)
                data: dict[str, JsonValue] = {"code": self._exit, "job_id": job_id, "state": view.state}
                self._queue.put(Event(ts_ns=now_ns(), kind=TARGET_EXIT, source="runner", data=data))
                self._done.set()
                return
            self._halt.wait(self.spec.poll_interval)

    def _observe(self, job_id: int) -> JobView:
        try:
            return JobView.of(self.client.job(job_id))
        except JobNotFound:
            # Aged out of the controller's memory (MinJobAge): its last attempt's record says how it ended.
            records = [r for r in self.client.accounting(job_id) if r.job_id == str(job_id) and r.end_time]
            if not records:
                raise
            last = max(records, key=lambda r: r.end_time.timestamp() if r.end_time else 0.0)
            code = f"{last.exit_code or 0}:{last.exit_signal or 0}"
            return JobView(last.state, None, last.nodes, max(0, len(records) - 1), code)

    # -- the job's own reports ---------------------------------------------------------------------------

    def _log_events(self) -> list[Event]:
        """Matcher events from lines the job's output file gained since the last call."""
        if not self.matchers:
            return []
        lines = self._log.new_lines()
        stamp, events = now_ns(), []
        for raw in lines:
            line = raw.decode(errors="replace")
            for matcher in self.matchers:
                event = matcher.match(line, stamp)
                if event is not None:
                    events.append(event)
        return events

    def _placed(self, event: Event) -> Event:
        """A ``target.start`` {pid} with its ``host``/``node`` (and rank, when the job named none) from the
        process's own Slurm environment; recorded in the rank table."""
        pid = event.get_int("pid")
        if event.kind != TARGET_START or pid is None or "host" in event.data:
            return event
        found = self._environ(pid)
        if found is None:
            return event
        node, environ = found
        host = host_of_node(self.inventory, node) if self.inventory is not None else None
        host = host or node
        data = {**event.data, "host": host, "node": node}
        rank = event.rank
        if rank is None:
            text = environ.get("RANK") or environ.get("SLURM_PROCID") or ""
            rank = int(text) if text.isdigit() else None
        placed = event.model_copy(update={"data": data, "rank": rank})
        if rank is not None:
            self.table.observe(placed, host, lambda _pid: None)
        return placed

    def _environ(self, pid: int) -> tuple[str, dict[str, str]] | None:
        """(Slurm node, Slurm environment) of this job's process ``pid``, or None when it cannot be told."""
        if self.job_id is None:
            return None
        if self.cluster.kind == "testbed":
            texts = [_read_local(pid)]  # one pid namespace: every node's processes are this machine's
        else:
            with self._lock:
                allocation = list(self._allocation or ())
            texts = (self._read_remote(node, pid) for node in allocation)  # type: ignore[assignment]
        for text in texts:
            environ = _slurm_environ(text)
            if environ.get("SLURM_JOB_ID") == str(self.job_id) and environ.get("SLURMD_NODENAME"):
                return environ["SLURMD_NODENAME"], environ
        return None

    def _read_remote(self, node: str, pid: int) -> str | None:
        host = host_of_node(self.inventory, node) if self.inventory is not None else None
        if host is None or self._reach is None:
            return None
        try:
            done = self._reach(host).run(["cat", f"/proc/{pid}/environ"], timeout=10)
        except TransportError:
            return None
        return done.stdout if done.ok else None

    # -- placement (RankPlacement, RankResolver, SlurmPlacement) --------------------------------------------

    def node_names(self) -> list[str]:
        """Every inventory host a rank may run on: the partition's nodes (RankPlacement)."""
        with self._lock:
            nodes = list(self._partition or ())
        return [self._host(node) for node in nodes]

    def host_for_rank(self, rank: int) -> str | None:
        return self.table.host_for_rank(rank)

    def pids_for_rank(self, rank: int) -> list[int]:
        return self.table.pids_for_rank(rank)

    def ranks(self) -> list[int]:
        return self.table.ranks()

    def slurm_nodes(self, which: str) -> list[str] | None:
        """The job's allocation (``allocated``) or the partition's other nodes (``spare``), as Slurm node names,
        asked of Slurm now (the last poll's when it does not answer); None before the job was submitted (the
        selector then may land on any node)."""
        if self.job_id is not None and not self._done.is_set():
            try:
                view = JobView.of(self.client.job(self.job_id))
                with self._lock:
                    self._allocation = _allocation(view)
            except SlurmError:
                pass
        with self._lock:
            allocation, partition = self._allocation, self._partition
        if allocation is None or partition is None:
            return None
        if which == "allocated":
            return list(allocation)
        return [node for node in partition if node not in allocation]

    def _host(self, node: str) -> str:
        found = host_of_node(self.inventory, node) if self.inventory is not None else None
        return found or node


def _allocation(view: JobView) -> tuple[str, ...]:
    """The nodes the job holds in ``view`` (none while pending or once over)."""
    return view.nodes if view.state in ("RUNNING", "COMPLETING", "SUSPENDED", "STOPPED") else ()


def _read_local(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    except OSError:
        return None


def _slurm_environ(text: str | None) -> dict[str, str]:
    """The Slurm variables (and RANK) of a ``/proc/<pid>/environ`` text."""
    found = {}
    for item in (text or "").split("\0"):
        name, sep, value = item.partition("=")
        if sep and name in _ENV_KEYS:
            found[name] = value
    return found
