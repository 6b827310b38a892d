"""Which process runs which rank, read from a launcher's process tree: torchrun workers found without their help.

A torchrun launcher (the elastic agent) starts one worker process per local rank and hands each its identity
in the environment: ``RANK``, ``LOCAL_RANK``, ``GROUP_RANK``, ``WORLD_SIZE``, ``TORCHELASTIC_RESTART_COUNT``
(the restarts that agent has used so far) and ``TORCHELASTIC_RUN_ID``. ``/proc/<pid>/environ`` keeps the
environment a process was started with, so the harness learns every worker's rank, local rank, restart count
and pid from the kernel, whatever the script does (it need not import anything of mlchaos).

A *worker* is a process below the launcher whose environment names a ``RANK`` and a ``LOCAL_RANK`` and whose
parent is not itself a process of that rank (a worker's dataloader or compile children inherit its
environment and are not workers); the launcher itself never is one.

Scanning reads ``/proc/*/stat`` (parent and start time of every process, a few ms for a few hundred
processes) and the environment of the launcher's descendants. On this machine the harness reads ``/proc``
itself; on another host it runs ONE command per scan: :data:`SCAN_SNIPPET` (the very source of
:func:`scan_proc`) through the host's python, which prints the rows as JSON. Scans run on a background thread
per host every :data:`SCAN_INTERVAL_S` (never in the runner's 50 ms loop, which must not wait on SSH), and on
demand when a fault resolves a rank or a name (a fault hits the tree as it is at that moment).

Events (source :data:`SOURCE`):

- ``target.worker`` (rank: the global rank) {``local_rank``, ``group_rank``, ``world_size``, ``pid``, ``host``,
  ``restart``, ``run_id``}: a worker process seen for the first time.
- ``target.restart`` {``restart``, ``host``, ``cause``, and when the launcher logged the failure ``exitcode``,
  ``failed_local_rank``, ``failed_rank``, ``failed_pid``; ``attempt`` too where the restart count is the
  job's attempt (single node)}: the restart count on ``host`` went up. The cause is the worker failure the
  launcher logged (``failed (exitcode: ...) local_rank: ... (pid: ...)``) since the previous restart.
- ``runner.discovery_failed`` {``host``, ``reason``}: a scan on ``host`` failed (once per host), so workers
  there may be missing from the history.
"""

from __future__ import annotations

import inspect
import json
import signal
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from pydantic import JsonValue

from chaos.cluster.base import Transport, TransportError, host_python
from chaos.event_kinds import DETECT_WORKER_EXIT as WORKER_FAILED
from chaos.event_kinds import RUNNER_DISCOVERY_FAILED as DISCOVERY_FAILED
from chaos.event_kinds import TARGET_AGENT_RESTART, TARGET_RESTART, TARGET_WORKER
from chaos.history.timeline import Event, now_ns
from chaos.plugins.injector import JobTree

SOURCE = "process_tree"
WORKER_ENV = (
    "RANK",
    "LOCAL_RANK",
    "GROUP_RANK",
    "WORLD_SIZE",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_RUN_ID",
)
SCAN_INTERVAL_S = 0.5
"""Time between background scans of one host. A worker lives seconds at the least (torch's import alone takes
one), so 0.5 s sees every generation; faults do not wait for it (they scan on demand)."""
SCAN_TIMEOUT_S = 15.0


class ScanError(RuntimeError):
    """A host's process tree could not be read (the command failed or printed something else)."""


def scan_proc(root: int, wanted: tuple[str, ...]) -> list[tuple[int, int, int, dict[str, str]]]:
    """(pid, ppid, start time, {name: value for the ``wanted`` environment variables}) of ``root`` and every
    process below it, read from this machine's ``/proc``; empty when ``root`` is gone.

    Standard library only, no names from outside the function: its source is also :data:`SCAN_SNIPPET`, the
    command run on other hosts. A process that exits mid-scan is skipped (or kept with an empty environment).
    """
    import os

    parents: dict[int, int] = {}
    starts: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/" + entry + "/stat", "rb") as handle:
                stat = handle.read().decode("ascii", "replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # the command name may hold spaces and parentheses
        parents[int(entry)] = int(fields[1])
        starts[int(entry)] = int(fields[19])
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    found: list[tuple[int, int, int, dict[str, str]]] = []
    todo = [root] if root in parents else []
    while todo:
        pid = todo.pop()
        env: dict[str, str] = {}
        try:
            with open("/proc/" + str(pid) + "/environ", "rb") as handle:
                raw = handle.read()
        except OSError:
            raw = b""
        for item in raw.split(b"\0"):
            key, sep, value = item.partition(b"=")
            name = key.decode("utf-8", "replace")
            if sep and name in wanted:
                env[name] = value.decode("utf-8", "replace")
        found.append((pid, parents[pid], starts[pid], env))
        todo.extend(children.get(pid, ()))
    return found


SCAN_SNIPPET = (
    "from __future__ import annotations\n"
    + inspect.getsource(scan_proc)
    + "\nimport json, sys\nprint(json.dumps(scan_proc(int(sys.argv[1]), tuple(sys.argv[2:]))))\n"
)
"""``python3 -c SCAN_SNIPPET ROOT NAME...``: :func:`scan_proc` on the host, its rows printed as one JSON list."""


@dataclass(frozen=True)
class ProcInfo:
    """One process of a scanned tree: pid, parent, kernel start time (tells a pid from its reuse), and the
    wanted variables of its environment."""

    pid: int
    ppid: int
    start_time: int
    env: Mapping[str, str]


def parse_scan(text: str) -> list[ProcInfo]:
    """The rows :data:`SCAN_SNIPPET` printed; :class:`ScanError` when ``text`` is anything else."""
    try:
        rows = json.loads(text)
    except ValueError:
        raise ScanError(f"the process scan printed no JSON: {text.strip()[:200]!r}") from None
    if not isinstance(rows, list):
        raise ScanError(f"the process scan printed {type(rows).__name__}, not a list")
    found: list[ProcInfo] = []
    for row in rows:
        if not (
            isinstance(row, list)
            and len(row) == 4
            and all(isinstance(x, int) and not isinstance(x, bool) for x in row[:3])
            and isinstance(row[3], dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in row[3].items())
        ):
            raise ScanError(f"the process scan printed a malformed row: {str(row)[:200]}")
        found.append(ProcInfo(row[0], row[1], row[2], dict(row[3])))
    return found


def scan_local(root: int) -> list[ProcInfo]:
    """:func:`scan_proc` on this machine."""
    return [ProcInfo(pid, ppid, start, env) for pid, ppid, start, env in scan_proc(root, WORKER_ENV)]


def scan_remote(transport: Transport, root: int) -> list[ProcInfo]:
    """:func:`scan_proc` on the transport's host: one command (:data:`SCAN_SNIPPET` through its python)."""
    argv = [host_python(transport), "-c", SCAN_SNIPPET, str(root), *WORKER_ENV]
    try:
        done = transport.run(argv, timeout=SCAN_TIMEOUT_S)
    except TransportError as exc:
        raise ScanError(str(exc)) from None
    if not done.ok:
        raise ScanError(f"the process scan exited {done.returncode}: {done.stderr.strip()[-300:]}")
    return parse_scan(done.stdout)


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


@dataclass(frozen=True)
class Worker:
    """A torchrun worker found in a process tree, with the identity its launcher gave it."""

    host: str
    pid: int
    start_time: int
    rank: int
    local_rank: int
    group_rank: int | None = None
    world_size: int | None = None
    restart: int | None = None
    run_id: str | None = None

    def event(self, ts_ns: int) -> Event:
        """The ``target.worker`` event announcing this worker."""
        data: dict[str, JsonValue] = {"local_rank": self.local_rank, "pid": self.pid, "host": self.host}
        for key, value in (
            ("group_rank", self.group_rank),
            ("world_size", self.world_size),
            ("restart", self.restart),
            ("run_id", self.run_id),
        ):
            if value is not None:
                data[key] = value
        return Event(ts_ns=ts_ns, kind=TARGET_WORKER, source=SOURCE, rank=self.rank, data=data)


def workers_in(procs: Sequence[ProcInfo], root: int, host: str) -> list[Worker]:
    """The workers among ``procs`` (a scan of ``root``'s tree on ``host``), by rank: processes other than the
    launcher ``root`` with a ``RANK`` and a ``LOCAL_RANK``, whose parent is not a process of the same rank."""
    by_pid = {proc.pid: proc for proc in procs}
    found: list[Worker] = []
    for proc in procs:
        rank, local_rank = _int(proc.env.get("RANK")), _int(proc.env.get("LOCAL_RANK"))
        if proc.pid == root or rank is None or local_rank is None:
            continue
        parent = by_pid.get(proc.ppid)
        if parent is not None and parent.pid != root and _int(parent.env.get("RANK")) == rank:
            continue  # a child of the worker (dataloader, compile worker): it inherited the rank's environment
        found.append(
            Worker(
                host=host,
                pid=proc.pid,
                start_time=proc.start_time,
                rank=rank,
                local_rank=local_rank,
                group_rank=_int(proc.env.get("GROUP_RANK")),
                world_size=_int(proc.env.get("WORLD_SIZE")),
                restart=_int(proc.env.get("TORCHELASTIC_RESTART_COUNT")),
                run_id=proc.env.get("TORCHELASTIC_RUN_ID"),
            )
        )
    return sorted(found, key=lambda worker: (worker.rank, worker.pid))


@dataclass(frozen=True)
class Failure:
    """A worker failure the launcher logged: ``failed (exitcode: E) local_rank: L (pid: P)``."""

    local_rank: int | None
    pid: int | None
    exitcode: int | None

    @classmethod
    def of(cls, event: Event) -> Failure:
        """From a ``detect.worker_exit`` event of the launcher's log (its local rank is the event's rank, or
        ``data.local_rank`` once a multi-node job moved it there)."""
        local = event.get_int("local_rank")
        return cls(local if local is not None else event.rank, event.get_int("pid"), event.get_int("exitcode"))


def exit_text(exitcode: int) -> str:
    """``-9`` -> ``died of SIGKILL (exitcode -9)``; ``1`` -> ``exited with code 1``."""
    if exitcode < 0:
        try:
            return f"died of {signal.Signals(-exitcode).name} (exitcode {exitcode})"
        except ValueError:
            return f"died of signal {-exitcode} (exitcode {exitcode})"
    return f"exited with code {exitcode}"


class TreeWatch:
    """One host's view of a launcher's workers: every worker seen, the restart count, and the failures the
    launcher logged since its last restart (the cause of the next one). Thread-safe."""

    def __init__(self, host: str, scan: Callable[[int], list[ProcInfo]], *, restart_is_attempt: bool) -> None:
        self.host = host
        self.root: int | None = None
        self.restart = 0  # the launcher starts at 0; every increase is a restart it used
        self._scan = scan
        self._restart_is_attempt = restart_is_attempt
        self._lock = threading.Lock()
        self._known: dict[int, Worker] = {}  # pid -> every worker ever seen
        self._failures: list[Failure] = []
        self._group_state: str | None = None
        self._scan_failed = False
        self.gone = False  # the last scan found no launcher: it exited (nothing more will appear below it)

    def note(self, event: Event) -> None:
        """Remember what the launcher logged about its workers on this host: failures and group state."""
        with self._lock:
            if event.kind == WORKER_FAILED:
                self._failures.append(Failure.of(event))
            elif event.kind == TARGET_AGENT_RESTART:
                self._group_state = event.get_str("state")

    def tree(self) -> JobTree:
        """The launcher and every process below it now (a fresh scan); :class:`ScanError` when unreadable."""
        root = self.root
        if root is None:
            return JobTree(frozenset(), frozenset())
        pids = {proc.pid for proc in self._scan(root)}
        return JobTree(frozenset({root} & pids), frozenset(pids - {root}))

    def refresh(self) -> tuple[list[Event], list[Worker]]:
        """Scan once: events for restarts and new workers (in that order), and the new workers."""
        root = self.root
        if root is None:
            return [], []
        try:
            procs = self._scan(root)
        except ScanError as exc:
            with self._lock:
                if self._scan_failed:
                    return [], []
                self._scan_failed = True
            data: dict[str, JsonValue] = {"host": self.host, "reason": str(exc)[:500]}
            return [Event(ts_ns=now_ns(), kind=DISCOVERY_FAILED, source=SOURCE, data=data)], []
        self.gone = not procs
        return self.update(workers_in(procs, root, self.host), now_ns())

    def update(self, workers: Sequence[Worker], ts_ns: int) -> tuple[list[Event], list[Worker]]:
        """What ``workers`` (one scan) add to what was seen: see :meth:`refresh`."""
        events: list[Event] = []
        with self._lock:
            new = [w for w in workers if self._known.get(w.pid, None) != w]
            top = max((w.restart for w in new if w.restart is not None), default=self.restart)
            for restart in range(self.restart + 1, top + 1):
                events.append(self._restart_event(restart, ts_ns))
            self.restart = max(self.restart, top)
            for worker in new:
                self._known[worker.pid] = worker
                events.append(worker.event(ts_ns))
        return events, list(new)

    def _restart_event(self, restart: int, ts_ns: int) -> Event:
        """``target.restart`` for restart number ``restart``, caused by the failures logged since the last."""
        failures, self._failures = self._failures, []
        data: dict[str, JsonValue] = {"restart": restart, "host": self.host}
        if self._restart_is_attempt:
            data["attempt"] = restart
        causes = []
        for failure in failures:
            known = self._known.get(failure.pid) if failure.pid is not None else None
            who = f"rank {known.rank} (local_rank {known.local_rank}" if known else f"local_rank {failure.local_rank} ("
            who += f"{', ' if known else ''}pid {failure.pid})"
            causes.append(f"{who} {exit_text(failure.exitcode) if failure.exitcode is not None else 'failed'}")
        if failures:
            first = failures[0]
            known = self._known.get(first.pid) if first.pid is not None else None
            for key, value in (
                ("exitcode", first.exitcode),
                ("failed_local_rank", first.local_rank),
                ("failed_pid", first.pid),
                ("failed_rank", known.rank if known else None),
            ):
                if value is not None:
                    data[key] = value
            data["cause"] = "; ".join(causes)
        else:
            data["cause"] = (
                "no worker failure was logged on this host (the group restarted with the rest of the job, or "
                "the launcher's log was not matched)"
            )
        if self._group_state is not None:
            data["group_state"] = self._group_state
            self._group_state = None
        return Event(ts_ns=ts_ns, kind=TARGET_RESTART, source=SOURCE, data=data)


class Discovery:
    """The :class:`TreeWatch` of every host of one job, each scanned on a background thread (and on demand);
    new workers go to ``on_worker`` (the rank table) before their events are handed out by :meth:`drain`."""

    def __init__(self, on_worker: Callable[[Worker, int], None], interval_s: float = SCAN_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._on_worker = on_worker
        self._watches: dict[str, TreeWatch] = {}
        self._threads: dict[str, threading.Thread] = {}
        self._ended: dict[str, threading.Event] = {}
        self._pending: list[Event] = []
        self._lock = threading.Lock()

    def start(
        self, host: str, root: int | None, scan: Callable[[int], list[ProcInfo]], *, restart_is_attempt: bool
    ) -> None:
        """Watch the tree below ``root`` (the launcher's pid on ``host``); nothing when ``root`` is None."""
        watch = TreeWatch(host, scan, restart_is_attempt=restart_is_attempt)
        watch.root = root
        self._watches[host] = watch
        if root is None:
            return
        ended = threading.Event()
        thread = threading.Thread(target=self._loop, args=(watch, ended), daemon=True, name=f"discovery-{host}")
        self._ended[host], self._threads[host] = ended, thread
        thread.start()

    def _loop(self, watch: TreeWatch, ended: threading.Event) -> None:
        while not ended.wait(self.interval_s) and not watch.gone:  # (a caller that never stops us: no leak)
            self._collect(watch)

    def _collect(self, watch: TreeWatch) -> None:
        events, workers = watch.refresh()
        for worker in workers:
            self._on_worker(worker, events[0].ts_ns if events else now_ns())
        if events:
            with self._lock:
                self._pending.extend(events)

    def refresh(self, hosts: Sequence[str] | None = None) -> None:
        """Scan ``hosts`` (default: every watched one whose launcher runs) now, e.g. before a fault resolves a rank."""
        for host, watch in list(self._watches.items()):
            if (hosts is None or host in hosts) and host in self._threads and not self._ended[host].is_set():
                self._collect(watch)

    def note(self, host: str, event: Event) -> None:
        """Hand a launcher log event of ``host`` to its watch (failures become the next restart's cause)."""
        watch = self._watches.get(host)
        if watch is not None:
            watch.note(event)

    def drain(self) -> list[Event]:
        """The events found since the last call."""
        with self._lock:
            events, self._pending = self._pending, []
        return events

    def tree(self, host: str) -> JobTree:
        """The job's processes on ``host`` now (empty where it runs none); :class:`ScanError` when unreadable."""
        watch = self._watches.get(host)
        return watch.tree() if watch is not None else JobTree(frozenset(), frozenset(), here=False)

    def restarts(self) -> dict[str, int]:
        """The restart count seen per host."""
        return {host: watch.restart for host, watch in self._watches.items()}

    def finish(self, host: str | None = None) -> None:
        """Stop scanning ``host`` (default: every host): its launcher exited, or the job is being stopped."""
        for name, ended in self._ended.items():
            if host is None or name == host:
                ended.set()
        for name, thread in self._threads.items():
            if (host is None or name == host) and thread is not threading.current_thread():
                thread.join(timeout=SCAN_TIMEOUT_S + 1)
