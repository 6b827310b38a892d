"""A torchrun-launched job on this host, with rank -> pid mapping from the ranks' own start events.

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
import sys
from pathlib import Path

from chaos.cluster.base import Transport
from chaos.cluster.local import process_start_time
from chaos.history import TARGET_START, Event, LogMatcher
from chaos.scenario import TorchrunTarget
from chaos.targets.base import SpawnedJob
from chaos.targets.command import expand

TORCHRUN_MATCHERS = (
    # The elastic agent noticed a worker died: the launcher's own detection.
    LogMatcher(
        r"failed \(exitcode: (?P<exitcode>-?\d+)\) local_rank: (?P<rank>\d+) \(pid: (?P<pid>\d+)\)",
        "detect.worker_exit",
        source="torchrun",
    ),
    LogMatcher(
        r"Worker group (?P<state>FAILED|UNHEALTHY)\. (?P<attempts_left>\d+)/(?P<max_restarts>\d+) attempts left",
        "target.agent_restart",
        source="torchrun",
    ),
)

DEFAULT_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "OMP_NUM_THREADS": "1"}


class TorchrunJob:
    """``python -m torch.distributed.run --standalone`` with the scenario's ranks and restarts."""

    def __init__(
        self, spec: TorchrunTarget, transport: Transport, run_dir: Path, seed: int, extra_env: dict[str, str] | None = None
    ) -> None:
        values = {"run_dir": str(run_dir), "seed": str(seed)}
        argv = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nnodes",
            "1",
            "--nproc-per-node",
            str(spec.nproc_per_node),
            "--max-restarts",
            str(spec.max_restarts),
            "--monitor-interval",
            f"{spec.monitor_interval:g}",
        ]
        argv += ["-m", spec.module] if spec.module is not None else [expand(spec.script or "", values)]
        argv += [expand(arg, values) for arg in spec.args]
        env = {**DEFAULT_ENV, **(extra_env or {}), **{k: expand(v, values) for k, v in spec.env.items()}}
        matchers = [*TORCHRUN_MATCHERS, *(LogMatcher(m.pattern, m.event) for m in spec.matchers)]
        self.spec = spec
        self.job = SpawnedJob(transport, argv, env=env, run_dir=run_dir, matchers=matchers)
        self._rank_pids: dict[int, tuple[int, int]] = {}  # rank -> (attempt, pid)
        self._all_pids: dict[int, int | None] = {}  # every worker pid ever reported -> its start time

    def start(self) -> None:
        self.job.start()

    def poll_events(self) -> list[Event]:
        events = self.job.poll_events()
        for event in events:
            if event.kind == TARGET_START and event.rank is not None:
                pid, attempt = event.get_int("pid"), event.get_int("attempt") or 0
                if pid is not None:
                    self._all_pids[pid] = process_start_time(pid)
                if pid is not None and attempt >= self._rank_pids.get(event.rank, (-1, 0))[0]:
                    self._rank_pids[event.rank] = (attempt, pid)
        return events

    def exit_code(self) -> int | None:
        return self.job.exit_code()

    def stop(self, grace: float = 10.0) -> None:
        self.job.stop(grace)
        # torchrun starts each worker in a session of its own, so the launcher's process group does not
        # cover them: reap every worker pid the ranks reported (unless the pid now belongs to someone else).
        for pid, started in self._all_pids.items():
            if started is not None and process_start_time(pid) == started:
                for signum in (signal.SIGCONT, signal.SIGKILL):
                    try:
                        os.kill(pid, signum)
                    except ProcessLookupError:
                        break

    def describe(self) -> str:
        what = self.spec.module or self.spec.script
        return f"torchrun {self.spec.nproc_per_node} ranks: {what}"

    # RankResolver
    def pids_for_rank(self, rank: int) -> list[int]:
        """The pid of ``rank`` in its latest attempt; empty when that rank has not reported yet."""
        entry = self._rank_pids.get(rank)
        return [entry[1]] if entry is not None else []

    def ranks(self) -> list[int]:
        return sorted(self._rank_pids)
