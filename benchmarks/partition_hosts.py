"""Apply + heal of one partition fault on 1, 4, 8 and 16 testbed hosts, through the runner's own path.

Each host gets what the runner does for it: prepare, journal intent (fsync), a remote dead-man armed over
SSH, the iptables chains applied, then heal and disarm. The runner applies one fault's hosts in parallel
(up to 8 threads). Ratios are to 1 host, in one run. On a testbed every host shares this machine's cores, so
once the cores are busy the ratio tracks the CPU work per host (mostly SSH commands), not the latency; the
remote commands per host (SSH command channels + SFTP writes) are printed too, as a count that no load skews.
Needs root (network namespaces + sshd); run with ``make bench`` or ``.venv/bin/python benchmarks/partition_hosts.py``.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from chaos.cluster.base import Completed  # noqa: E402
from chaos.cluster.ssh import SshTransport  # noqa: E402
from chaos.cluster.testbed import namespaces as tb  # noqa: E402
from chaos.plugins.injector import FaultOp, InjectionContext  # noqa: E402
from chaos.run.faults import parallel  # noqa: E402
from chaos.safety import remote_deadman  # noqa: E402
from chaos.safety.journal import Journal  # noqa: E402
from injectors.network.faults import PartitionInjector, PartitionParams  # noqa: E402

SIZES = (1, 4, 8, 16)
REPS = 5


class _Counted(SshTransport):
    """The SSH transport, counting the remote commands (``run``) and file writes (``put``) it makes."""

    calls = 0

    def run(self, argv: list[str], *, timeout: float = 30.0, check: bool = False) -> Completed:
        self.calls += 1
        return super().run(argv, timeout=timeout, check=check)

    def put(self, data: bytes, path: str) -> None:
        self.calls += 1
        super().put(data, path)


def _round(hosts: list[str], transports: dict[str, _Counted], inventory: object, journal: Journal, k: int) -> float:
    injector = PartitionInjector()
    params = PartitionParams(peers=["group:all"])
    start = time.perf_counter()
    applied_list = []

    def apply(host: str) -> None:
        ctx = InjectionContext(transports[host], extras={"host": host, "inventory": inventory})
        op = FaultOp(op_id=f"bench#{k}@{host}", fault="bench", injector="partition", params=params, duration_s=60)
        applied = injector.prepare(ctx, op).model_copy(update={"host": host})
        journal.intent(applied)
        mark = remote_deadman.arm(ctx.transport, op.op_id, injector.revert_command(applied) or [], 120)
        injector.apply(ctx, applied)
        applied_list.append((ctx, applied, mark))

    parallel([lambda h=h: apply(h) for h in hosts])

    def heal(item: tuple[InjectionContext, object, str]) -> None:
        ctx, applied, mark = item
        injector.heal(ctx, applied)  # type: ignore[arg-type]
        remote_deadman.disarm(ctx.transport, mark)

    parallel([lambda i=i: heal(i) for i in applied_list])
    return time.perf_counter() - start


def main() -> None:
    reason = tb.unsupported_reason()
    if reason is not None:
        print(f"skipped: {reason}")
        return
    with tempfile.TemporaryDirectory(prefix="mlchaos-bench-tb-") as tmp:
        state = Path(tmp)
        try:
            inventory = tb.up(max(SIZES), state / "tb")
            transports = {h.name: _Counted.for_host(inventory, h.name) for h in inventory.hosts}
            journal = Journal(state / "journal.jsonl")
            names = [h.name for h in inventory.hosts]
            results = {}
            k = 0
            # Warm-up, not measured: every SSH connection (as a runner's earlier check() opens it) and first use.
            parallel([lambda t=t: t.run(["true"]) and None for t in transports.values()])
            _round(names[:1], transports, inventory, journal, k)
            for transport in transports.values():
                transport.calls = 0
            for n in SIZES:
                times = []
                for _ in range(REPS):
                    k += 1
                    times.append(_round(names[:n], transports, inventory, journal, k))
                results[n] = statistics.median(times)
            per_host = sum(t.calls for t in transports.values()) / (REPS * sum(SIZES))
            journal.close()
            for transport in transports.values():
                transport.close()
        finally:
            tb.down(state / "tb")
    base = results[SIZES[0]]
    print(f"partition apply+heal (journal, remote dead-man, iptables over SSH), median of {REPS}")
    print(f"  remote commands per host: {per_host:g} (SSH command channels + SFTP writes)")
    for n in SIZES:
        print(f"  {n:2d} hosts  {results[n] * 1e3:8.1f} ms   ratio to 1 host {results[n] / base:5.2f}x")


if __name__ == "__main__":
    main()
