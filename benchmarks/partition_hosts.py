"""Apply + heal of one partition fault on 1, 4, 16 and 64 testbed hosts, through the runner's own path.

Each host gets what the runner does for it (:meth:`chaos.run.orchestrator.Execution._fire_on` and ``_heal``):
prepare, journal intent (fsync), the remote dead-man armed and the iptables chains applied, journal applied;
then heal, the switch cancelled, journal healed. Every host issued at once (a thread per host), the switch armed
and the fault applied in ONE command, heal and cancel in one more, host facts asked once; each command goes
through the host's long-lived command channel (one ``sh`` per host reading framed requests: no SSH session per
command). ``--before`` also measures, in the same run and rounds interleaved with these, the previous path: the
same two commands, each in an SSH session of its own (``SshTransport(command_channel=False)``).

Wall time is the median of 5 rounds; ratios are to 1 host, within one run. CPU is measured apart from the wall
time, per host and round: the harness's own (``getrusage``: every thread, paramiko's included) and the hosts'
(a cpuacct cgroup around the testbed's sshd, so every session, command and dead-man below it counts). On a
testbed every host shares this machine's cores, so past a few hosts the wall time is total CPU / cores; on a
real cluster each host's share runs on that host, and only the harness's share adds up in one place: the
projection to 1,000 hosts (``projected_ms_1000``) is the 1-host wall time + 999 x the harness CPU per host.
Needs root (network namespaces + sshd). ``--json``: the figures as one JSON object on the last line.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import paramiko

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from chaos.cluster.base import Completed  # noqa: E402
from chaos.cluster.inventory import Host, Inventory  # noqa: E402
from chaos.cluster.ssh import SshTransport  # noqa: E402
from chaos.plugins.injector import Applied, FaultOp, InjectionContext  # noqa: E402
from chaos.run.lifecycle import heal_and_disarm, parallel  # noqa: E402
from chaos.run.switch import DeadMan, one_command  # noqa: E402
from chaos.safety.journal import Journal  # noqa: E402
from chaos.spec.scenario import SafetySpec  # noqa: E402
from chaos.testbed import namespaces as tb  # noqa: E402
from injectors.network.faults import PartitionInjector, PartitionParams  # noqa: E402

SIZES = (1, 4, 16, 64)
REPS = 5
CGROUP_ROOT = Path("/sys/fs/cgroup/cpuacct")


class _Counted(SshTransport):
    """The SSH transport, counting its round trips (remote commands, ``run``; file writes, ``put``) and the SSH
    sessions it opens for them (the long-lived command channel not counted)."""

    calls = 0
    sessions = 0

    def run(self, argv: list[str], *, timeout: float = 30.0, check: bool = False) -> Completed:
        self.calls += 1
        return super().run(argv, timeout=timeout, check=check)

    def put(self, data: bytes, path: str) -> None:
        self.calls += 1
        super().put(data, path)

    def _open_channel(self) -> paramiko.Channel:
        self.sessions += 1
        return super()._open_channel()


class _HostCpu:
    """CPU seconds spent below the testbed's sshd processes (a cpuacct cgroup they, and so every session,
    command and detached dead-man they start, belong to). ``seconds()`` is None where no cgroup can be made."""

    def __init__(self, pids: Sequence[int]) -> None:
        self.path: Path | None = CGROUP_ROOT / f"mlchaos-bench-{os.getpid()}"
        try:
            self.path.mkdir(exist_ok=True)
            for pid in pids:
                (self.path / "cgroup.procs").write_text(str(pid))
        except OSError:
            self.path = None

    def seconds(self) -> float | None:
        return int((self.path / "cpuacct.usage").read_text()) / 1e9 if self.path is not None else None

    def remove(self) -> None:
        """Hand what is still in the group (a testbed left up) back to the root group, then remove it."""
        if self.path is not None:
            try:
                for pid in (self.path / "cgroup.procs").read_text().split():
                    (CGROUP_ROOT / "cgroup.procs").write_text(pid)
                self.path.rmdir()
            except OSError:
                pass


def _touch(transport: SshTransport) -> None:
    transport.run(["true"])


def _harness_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class _Bench:
    def __init__(self, inventory: Inventory, transports: dict[str, _Counted], journal: Journal) -> None:
        self.inventory, self.transports, self.journal = inventory, transports, journal
        self.injector, self.safety, self.k = PartitionInjector(), SafetySpec(), 0

    def _prepare(self, host: str, k: int) -> tuple[InjectionContext, Applied]:
        ctx = InjectionContext(self.transports[host], extras={"host": host, "inventory": self.inventory})
        params = PartitionParams(peers=["group:all"])
        op = FaultOp(op_id=f"bench#{k}@{host}", fault="bench", injector="partition", params=params, duration_s=60)
        applied = self.injector.prepare(ctx, op).model_copy(update={"host": host})
        self.journal.intent(applied)
        return ctx, applied

    def round_now(self, hosts: list[str]) -> float:
        """The runner's path: all hosts at once, one round trip per host per action."""
        self.k += 1
        k, injector, journal = self.k, self.injector, self.journal
        done: list[tuple[InjectionContext, Applied, DeadMan | None]] = []
        start = time.perf_counter()

        def fire(host: str) -> None:
            ctx, applied = self._prepare(host, k)
            revert = injector.revert_command(applied)
            then = one_command(injector, applied, "apply")
            switch = DeadMan.arm(ctx, journal.path, applied.op_id, revert, 60, self.safety, local=False, then=then)
            if switch is None or not switch.applied_with_arm:
                injector.apply(ctx, applied)
            journal.applied(applied.op_id, applied.state)
            done.append((ctx, applied, switch))

        parallel([partial(fire, h) for h in hosts])

        def heal(item: tuple[InjectionContext, Applied, DeadMan | None]) -> None:
            ctx, applied, switch = item
            heal_and_disarm(injector, ctx, applied, switch)
            journal.healed(applied.op_id, "harness")

        parallel([partial(heal, i) for i in done])
        return time.perf_counter() - start


class _Answers:
    """A root host with nf_tables iptables that answers every question at once (no SSH): what is left of a
    fault's cost is the harness's own Python work, for :func:`_python_ms`."""

    host = "h1"

    def run(self, argv: list[str], *, timeout: float = 30.0, check: bool = False) -> Completed:
        out = {"id": "0\n", "ip": "10.0.0.1 dev eth0 src 10.0.0.1\n"}.get(argv[0], "iptables v1.8.9 (nf_tables)\n")
        return Completed(tuple(argv), 0, out, "")


def _python_ms(peers: int, journal: Journal, reps: int = 20) -> float:
    """The harness's Python work per host for one partition from ``peers`` other hosts (prepare, 3 journal
    records, the revert, the apply and heal batches): CPU ms, no SSH. It grows with the peers (the rules)."""
    hosts = [Host(name=f"h{i}", address=f"10.{i // 250}.{i % 250}.1") for i in range(1, peers + 2)]
    ctx = InjectionContext(_Answers(), extras={"host": "h1", "inventory": Inventory(hosts=hosts)})  # type: ignore[arg-type]
    injector, params = PartitionInjector(), PartitionParams(peers=["group:all"])
    start = time.process_time()
    for k in range(reps):
        op = FaultOp(op_id=f"py{peers}#{k}@h1", fault="bench", injector="partition", params=params, duration_s=60)
        applied = injector.prepare(ctx, op).model_copy(update={"host": "h1"})
        journal.intent(applied)
        injector.revert_command(applied)
        one_command(injector, applied, "apply")
        journal.applied(applied.op_id, applied.state)
        one_command(injector, applied, "heal")
        journal.healed(applied.op_id, "harness")
    return (time.process_time() - start) / reps * 1e3


class _Mode:
    """One way of reaching the hosts, measured: the transports' ``command_channel`` setting, and per size the
    wall time of each round and the CPU and round trips summed over its rounds."""

    def __init__(self, channel: bool) -> None:
        self.channel = channel
        self.walls: dict[int, list[float]] = {}
        self.sums: dict[int, dict[str, float | None]] = {}

    def row(self, n: int) -> dict[str, float | None]:
        per = len(self.walls[n]) * n
        sums = self.sums[n]
        host = sums["host_cpu_s"]
        return {
            "wall_ms": statistics.median(self.walls[n]) * 1e3,
            "harness_cpu_ms": (sums["harness_cpu_s"] or 0.0) / per * 1e3,
            "host_cpu_ms": host / per * 1e3 if host is not None else None,
            "round_trips": (sums["calls"] or 0.0) / per,
            "sessions": (sums["sessions"] or 0.0) / per,
        }


def _measure(
    bench: _Bench, modes: Sequence[_Mode], names: list[str], host_cpu: _HostCpu, sizes: Sequence[int]
) -> list[dict[int, dict[str, float | None]]]:
    """REPS rounds per size and mode, the modes' rounds interleaved (so a slow spell of the machine hits both)."""
    transports = bench.transports.values()
    for n in sizes:
        for mode in modes:
            mode.walls[n] = []
            mode.sums[n] = {"harness_cpu_s": 0.0, "host_cpu_s": 0.0, "calls": 0.0, "sessions": 0.0}
        for _ in range(REPS):
            for mode in modes:
                for transport in transports:
                    transport.command_channel = mode.channel
                    transport.calls = transport.sessions = 0
                cpu0, remote0 = _harness_cpu(), host_cpu.seconds()
                mode.walls[n].append(bench.round_now(names[:n]))
                cpu, remote = _harness_cpu() - cpu0, host_cpu.seconds()
                sums = mode.sums[n]
                sums["harness_cpu_s"] = (sums["harness_cpu_s"] or 0.0) + cpu
                if remote is None or remote0 is None or sums["host_cpu_s"] is None:
                    sums["host_cpu_s"] = None
                else:
                    sums["host_cpu_s"] += remote - remote0
                sums["calls"] = (sums["calls"] or 0.0) + sum(t.calls for t in transports)
                sums["sessions"] = (sums["sessions"] or 0.0) + sum(t.sessions for t in transports)
    for transport in transports:
        transport.command_channel = True
    return [{n: mode.row(n) for n in sizes} for mode in modes]


def _print(title: str, rows: dict[int, dict[str, float | None]]) -> None:
    print(title)
    print("  hosts    wall  ratio  harness CPU/host  hosts' CPU/host  round trips/host  SSH sessions/host")
    base = rows[min(rows)]["wall_ms"] or 1.0
    for n, row in rows.items():
        wall, host = row["wall_ms"] or 0.0, row["host_cpu_ms"]
        on_host = f"{host:10.1f} ms" if host is not None else "         n/a"
        print(
            f"  {n:5d} {wall:6.0f} ms {wall / base:5.2f}x  {row['harness_cpu_ms'] or 0:11.1f} ms  {on_host}"
            f"  {row['round_trips'] or 0:10g}  {row['sessions'] or 0:10g}"
        )


def _figures(rows: dict[int, dict[str, float | None]], prefix: str = "") -> dict[str, Any]:
    sizes = sorted(rows)
    base = rows[sizes[0]]["wall_ms"] or 1.0
    big = rows[sizes[-1]]
    harness, host = big["harness_cpu_ms"] or 0.0, big["host_cpu_ms"]
    figures: dict[str, Any] = {
        f"{prefix}ratio_{n}_over_1": round((rows[n]["wall_ms"] or 0) / base, 3) for n in sizes[1:]
    }
    figures[f"{prefix}wall_ms"] = {str(n): round(rows[n]["wall_ms"] or 0, 1) for n in sizes}
    figures[f"{prefix}cpu_ms_per_host"] = round(harness + (host or 0.0), 2)
    figures[f"{prefix}harness_cpu_ms_per_host"] = round(harness, 2)
    figures[f"{prefix}host_cpu_ms_per_host"] = round(host, 2) if host is not None else None
    figures[f"{prefix}round_trips_per_host"] = round(big["round_trips"] or 0, 2)
    figures[f"{prefix}ssh_sessions_per_host"] = round(big["sessions"] or 0, 2)
    figures[f"{prefix}projected_ms_1000"] = round(base + 999 * harness, 0)
    # Every testbed host's work shares this machine's cores: N hosts take at least N x CPU per host / cores,
    # so the 16/1 ratio cannot go below this here, however the hosts are scheduled.
    cores = os.cpu_count() or 1
    figures[f"{prefix}cpu_bound_ratio_16_over_1"] = round(16 * (harness + (host or 0.0)) / cores / base, 2)
    return figures


def main(
    as_json: bool = False, before: bool = False, state_dir: Path | None = None, sizes: Sequence[int] = SIZES
) -> dict[str, Any]:
    """Measure; return the figures (``ratio_16_over_1``, ``ratio_64_over_1``, ``cpu_ms_per_host``, ...; with
    ``before`` the old path's too, prefixed ``before_``). ``state_dir``: a testbed to (re)use and leave up."""
    reason = tb.unsupported_reason()
    if reason is not None:
        print(f"skipped: {reason}")
        return {"skipped": reason}
    with tempfile.TemporaryDirectory(prefix="mlchaos-bench-tb-") as tmp:
        state = state_dir or Path(tmp) / "tb"
        host_cpu = _HostCpu([])
        try:
            inventory = tb.up(max(sizes), state)
            host_cpu = _HostCpu([h.sshd_pid for h in tb.status(state).hosts if h.sshd_pid is not None])
            transports = {
                h.name: _Counted(
                    h, known_hosts=inventory.known_hosts, accept_unknown=inventory.accept_unknown_host_keys
                )
                for h in inventory.hosts
            }
            journal = Journal(Path(tmp) / "journal.jsonl")
            bench = _Bench(inventory, transports, journal)
            names = [h.name for h in inventory.hosts]
            # Warm-up, not measured: every SSH connection (a runner's preflight check opens it) and first use.
            parallel([partial(_touch, t) for t in transports.values()])
            bench.round_now(names)  # and each host's facts, asked once per host (as by a run's first fault)
            if before:  # every host's per-action path warmed up too
                for transport in transports.values():
                    transport.command_channel = False
                bench.round_now(names)
            modes = [_Mode(channel=True)] + ([_Mode(channel=False)] if before else [])
            measured = _measure(bench, modes, names, host_cpu, sizes)
            now, old = measured[0], (measured[1] if before else None)
            python_ms = {peers: round(_python_ms(peers, journal), 2) for peers in (len(names) - 1, 999)}
            rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            journal.close()
            for transport in transports.values():
                transport.close()
        finally:
            if state_dir is None:
                tb.down(state)
            host_cpu.remove()
    print(f"partition apply+heal on N testbed hosts (journal, remote dead-man, iptables over SSH), median of {REPS}")
    _print("now: all hosts at once, arm+apply and heal+cancel one command each, on each host's command channel", now)
    figures = _figures(now)
    if old is not None:
        _print("before: the same two commands, each in an SSH session of its own (rounds interleaved)", old)
        figures.update(_figures(old, "before_"))
    figures["python_ms_per_host_by_peers"] = python_ms
    # Partitioned from all 999 others, each host's harness share grows by the Python work of the extra rules.
    peers = min(python_ms)  # what each testbed host was partitioned from: every other host
    extra = python_ms[999] - python_ms[peers]
    figures["projected_ms_1000_all_peers"] = round(figures["projected_ms_1000"] + 999 * extra, 0)
    figures["harness_max_rss_mb"] = round(rss_mb, 1)
    print(
        f"  harness Python per host, no SSH: {python_ms[peers]:.1f} ms ({peers} peers), {python_ms[999]:.1f} ms (999)"
    )
    print(f"  harness max RSS with {max(sizes)} SSH connections: {rss_mb:.0f} MiB")
    print(
        f"  floor of the 16/1 ratio on {os.cpu_count()} shared cores (16 x CPU per host / cores / 1-host wall): "
        f"{figures['cpu_bound_ratio_16_over_1']:.2f}x"
    )
    print(
        f"  projection, 1000 hosts (each host's own work on that host; the harness's CPU adds up): "
        f"{figures['projected_ms_1000']:.0f} ms ({peers} peers each), {figures['projected_ms_1000_all_peers']:.0f} ms (999)"
    )
    if as_json:
        print(json.dumps(figures, sort_keys=True))
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object on the last line")
    parser.add_argument(
        "--before", action="store_true", help="also measure one SSH session per command, interleaved in the same run"
    )
    parser.add_argument("--state-dir", type=Path, help="testbed state dir to (re)use and leave up")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="host counts, e.g. 1,4,16,64")
    args = parser.parse_args()
    main(args.json, args.before, args.state_dir, [int(n) for n in args.sizes.split(",")])
