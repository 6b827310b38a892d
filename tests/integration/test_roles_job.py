"""The ``roles`` target with real processes: each role starts (after the roles it waits for are ready), a
killed replica is restarted by its policy with no supervisor of ours, a replica's whole process tree is what a
fault selects, every event carries its replica, and stop() leaves nothing behind."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from pathlib import Path

from support import wait_for

from chaos.cluster.local import LocalTransport
from chaos.history.timeline import Event
from chaos.spec.roles import RolesTarget
from chaos.targets.roles import ROLE_EXIT, ROLE_READY, ROLE_RESTART, ROLE_START, RolesJob

# A worker that reports a step every 0.1 s through chaos.events, with a child process (like torchrun's worker).
WORKER = (
    "import os, subprocess, sys, time\n"
    "from chaos.events import emit\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
    "emit('target.start', pid=os.getpid(), child=child.pid)\n"
    "for step in range(1, int(sys.argv[1]) + 1):\n"
    "    emit('target.step', step=step)\n"
    "    time.sleep(0.1)\n"
    "child.kill()\n"
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class Collector:
    def __init__(self, job: RolesJob) -> None:
        self.job = job
        self.events: list[Event] = []

    def poll(self) -> list[Event]:
        self.events += self.job.poll_events()
        return self.events

    def of(self, kind: str, replica: str | None = None) -> list[Event]:
        self.poll()
        return [e for e in self.events if e.kind == kind and (replica is None or e.get_str("replica") == replica)]


def test_roles_start_in_order_restart_on_failure_and_stop_clean(tmp_path: Path) -> None:
    port = _free_port()
    server = f"import socket, time\ns = socket.socket(); s.bind(('127.0.0.1', {port})); s.listen()\ntime.sleep(600)"
    spec = RolesTarget.model_validate(
        {
            "type": "roles",
            "roles": {
                "server": {"command": [sys.executable, "-c", server], "port": port, "restart": {"policy": "never"}},
                "worker": {
                    "command": [sys.executable, "-c", WORKER, "40"],
                    "replicas": 2,
                    "after": ["server"],
                    "restart": {"policy": "on-failure", "delay": 0.2},
                },
            },
            "until": ["worker"],
        }
    )
    job = RolesJob(spec, LocalTransport(), tmp_path, seed=0)
    seen = Collector(job)
    job.start()
    try:
        assert wait_for(lambda: len(seen.of(ROLE_START)) == 3, timeout=30)
        ready = seen.of(ROLE_READY)
        starts = seen.of(ROLE_START)
        assert ready and ready[0].get_str("replica") == "server"
        worker_starts = [e for e in starts if e.get_str("role") == "worker"]
        assert all(e.ts_ns >= ready[0].ts_ns for e in worker_starts), "a worker started before the server was ready"
        assert job.replicas() == ["server", "worker.0", "worker.1"]

        # a replica is its whole process tree: the worker and the child it started
        assert wait_for(lambda: len(job.pids_for_replica("worker.1")) == 2, timeout=20)
        pids = job.pids_for_replica("worker.1")
        tree = job.job_tree("local")
        assert pids[0] in tree.launchers and set(pids[1:]) <= tree.members  # name: selectors match only these
        assert os.getpid() not in tree.launchers | tree.members
        assert not job.job_tree("elsewhere").members
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        assert wait_for(lambda: seen.of(ROLE_RESTART, "worker.1"), timeout=20)
        died = seen.of(ROLE_EXIT, "worker.1")[0]
        assert died.get_int("code") == -signal.SIGKILL and died.data["expected"] is False
        assert wait_for(lambda: len(seen.of(ROLE_START, "worker.1")) == 2, timeout=20)
        assert seen.of(ROLE_START, "worker.1")[1].get_int("attempt") == 1

        # the job ends when both workers finished cleanly; the server (not in `until`) keeps running
        assert wait_for(lambda: job.exit_code() is not None, timeout=60)
        assert job.exit_code() == 0
        steps = [e for e in seen.poll() if e.kind == "target.step"]
        assert {e.get_str("replica") for e in steps} == {"worker.0", "worker.1"}
        assert all(e.get_str("role") == "worker" for e in steps)
        assert any(e.kind == "target.exit" for e in seen.poll())
        server = job.pids_for_replica("server")
        assert server and all(_alive(pid) for pid in server)
    finally:
        job.stop(grace=2)
    seen.poll()
    assert not any(_alive(pid) for pid in server), "stop() left the server running"
    assert not any(_alive(pid) for pid in pids)
    # every process ever seen in a replica's tree is gone (the workers' sleeping children included)
    children = [e.get_int("child") for e in seen.events if e.kind == "target.start"]
    assert children and not any(_alive(pid) for pid in children if pid is not None)


def test_a_replica_that_keeps_failing_stops_at_max_restarts(tmp_path: Path) -> None:
    spec = RolesTarget.model_validate(
        {
            "type": "roles",
            "roles": {
                "bad": {
                    "command": [sys.executable, "-c", "raise SystemExit(3)"],
                    "restart": {"policy": "on-failure", "delay": 0.1, "max_restarts": 2},
                }
            },
        }
    )
    job = RolesJob(spec, LocalTransport(), tmp_path, seed=0)
    seen = Collector(job)
    job.start()
    try:
        assert wait_for(lambda: job.exit_code() is not None, timeout=30)
    finally:
        job.stop(grace=2)
    assert job.exit_code() == 3
    assert len(seen.of(ROLE_START)) == 3  # the first start and two restarts
    assert [e.get_int("code") for e in seen.of(ROLE_EXIT)] == [3, 3, 3]
    time.sleep(0.3)
    assert len(seen.of(ROLE_START)) == 3
