"""Ranks of a torchrun job without its cooperation, against the real kernel.

- The process-tree scan (``/proc`` read here, and the one-command snippet run through a transport) finds the
  workers of a launcher-shaped process tree by the environment torchrun gives them, and nothing else.
- ``name:`` selectors match only below the target's launcher (never the launcher, whose command line names
  the script too, nor a stranger elsewhere on the machine); ``rank:`` resolves through the discovered table.
- Through the whole harness: ``tests/jobs/user_ddp_adam.py`` (a user's DDP script: it reports only
  ``target.step``, and whatever its agent line adds) under torchrun with ``max_restarts: 1``; ``kill {rank: 1}``
  at step 3 lands on rank 1's discovered pid, the history holds ``target.worker`` for both ranks in rounds 0 and 1 and a ``target.restart``
  with the launcher's logged cause, ``restarts_at_most`` fails at 0 and passes at 1, and the restarts used are
  in run.json, report.html and the CLI's verdict table.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from support import ROOT, scenario_yaml, wait_for

from chaos.cluster.base import host_python, kill_if_same
from chaos.cluster.local import LocalTransport
from chaos.plugins.injector import InjectionContext, InjectionError
from chaos.targets.rank_discovery import Discovery, scan_local, scan_remote, workers_in
from chaos.targets.torchrun import RankLookup, RankTable
from injectors.process.faults import ProcessSelector, resolve_processes

pytestmark = pytest.mark.usefixtures("isolated_state_dir")

LAUNCHER_CODE = textwrap.dedent(
    """
    import os, subprocess, sys, time
    mark = sys.argv[1]
    worker = (
        "import subprocess, sys, time\\n"
        "if sys.argv[1] == '1':\\n"
        "    subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', sys.argv[2] + '-loader'])\\n"
        "time.sleep(60)\\n"
    )
    for rank in (0, 1):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), GROUP_RANK="0", WORLD_SIZE="2",
                   TORCHELASTIC_RESTART_COUNT="0", TORCHELASTIC_RUN_ID="fake")
        subprocess.Popen([sys.executable, "-c", worker, str(rank), mark], env=env, start_new_session=True)
    time.sleep(60)
    """
)


@contextmanager
def fake_launcher(mark: str) -> Iterator[subprocess.Popen[bytes]]:
    """A launcher-shaped tree: the launcher (its command line names ``mark`` and ``launcher-<mark>``), two workers
    in sessions of their own with torchrun's environment (ranks 0 and 1, command lines naming ``mark``), and a
    child of rank 1 (``<mark>-loader``, its environment inherited). Everything is killed on exit."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK")}
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER_CODE, mark, f"launcher-{mark}"], env=env)
    seen: dict[int, int] = {}
    try:
        assert wait_for(lambda: len(scan_local(launcher.pid)) == 4, timeout=20), scan_local(launcher.pid)
        seen = {p.pid: p.start_time for p in scan_local(launcher.pid)}
        yield launcher
    finally:
        for pid in seen:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        launcher.wait()


class TreeJob(RankLookup):
    """The discovery half of a torchrun job, over a tree this test started."""

    def __init__(self, root: int) -> None:
        self.table = RankTable()
        self.discovery = Discovery(self.table.observe_worker)
        self.discovery.start("local", root, scan_local, restart_is_attempt=True)


def test_the_scan_finds_the_workers_here_and_through_a_transport() -> None:
    with fake_launcher("disc-scan") as launcher:
        here = scan_local(launcher.pid)
        there = scan_remote(LocalTransport(), launcher.pid)  # the one-command path remote hosts take
        assert sorted(here, key=lambda p: p.pid) == sorted(there, key=lambda p: p.pid)
        workers = workers_in(there, launcher.pid, "local")
        assert [(w.rank, w.local_rank, w.restart, w.world_size, w.run_id) for w in workers] == [
            (0, 0, 0, 2, "fake"),
            (1, 1, 0, 2, "fake"),
        ]
        loader = [p for p in there if p.pid not in {launcher.pid, *(w.pid for w in workers)}]
        assert len(loader) == 1 and loader[0].env["RANK"] == "1"  # found, inherited rank 1, and not a worker
    assert scan_local(launcher.pid) == []  # a launcher that is gone has no tree


def test_selectors_resolve_in_the_targets_own_tree() -> None:
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "disc-sel", "stranger-only"])
    try:
        with fake_launcher("disc-sel") as launcher:
            job = TreeJob(launcher.pid)
            try:
                workers = {w.rank: w.pid for w in workers_in(scan_local(launcher.pid), launcher.pid, "local")}
                ctx = InjectionContext(LocalTransport(), target=job)
                # rank: through the discovered table (the workers reported nothing themselves)
                pids, _, label = resolve_processes(ctx, ProcessSelector(rank=1))
                assert pids == [workers[1]], label
                # name: the workers and the loader below the launcher; not the launcher, not the stranger
                pids, _, label = resolve_processes(ctx, ProcessSelector(name="disc-sel"))
                below = {p.pid for p in scan_local(launcher.pid)} - {launcher.pid}
                assert set(pids) == below and stranger.pid not in pids and launcher.pid not in pids, label
                # a pattern only the launcher matches selects the launcher
                pids, _, _ = resolve_processes(ctx, ProcessSelector(name="launcher-disc-sel"))
                assert pids == [launcher.pid]
                # a pattern only the stranger matches finds nothing in this target
                with pytest.raises(InjectionError, match="no running process"):
                    resolve_processes(ctx, ProcessSelector(name="stranger-only"))
                # without a process tree (a plain target), name matches across the machine, stranger included
                pids, _, _ = resolve_processes(InjectionContext(LocalTransport()), ProcessSelector(name="disc-sel"))
                assert stranger.pid in pids and launcher.pid in pids
            finally:
                job.discovery.finish()
    finally:
        stranger.kill()
        stranger.wait()


@pytest.mark.slow
def test_the_scan_is_one_command_over_ssh_on_a_testbed_host(testbed_transports: dict[str, Any]) -> None:
    """A testbed host (a network namespace with its own sshd; this machine's pid space): the launcher is
    started over SSH, its tree read with the snippet over SSH, and a name selector resolves inside it there."""
    transport = testbed_transports["h2"]
    python = host_python(transport)
    launcher = transport.spawn(
        [python, "-c", LAUNCHER_CODE, "disc-ssh", "launcher-disc-ssh"],
        env={"PATH": os.environ["PATH"]},
        kill_with_parent=signal.SIGTERM,
    )
    seen: dict[int, int | None] = {}
    try:
        # launcher, 2 workers, the loader (and, over SSH, the transport's kill-with-parent watcher: no rank)
        assert wait_for(lambda: len([p for p in scan_remote(transport, launcher.pid) if "RANK" in p.env]) == 3, 30)
        procs = scan_remote(transport, launcher.pid)
        seen = {p.pid: p.start_time for p in procs}
        workers = workers_in(procs, launcher.pid, "h2")
        assert [(w.rank, w.local_rank, w.host) for w in workers] == [(0, 0, "h2"), (1, 1, "h2")]
        ranked = {p.pid for p in procs if "RANK" in p.env}  # the workers and the loader
        job = RankLookup()
        job.table = RankTable()
        job.discovery = Discovery(job.table.observe_worker)
        job.discovery.start("h2", launcher.pid, partial(scan_remote, transport), restart_is_attempt=False)
        try:
            ctx = InjectionContext(transport, target=job, extras={"host": "h2"})
            assert resolve_processes(ctx, ProcessSelector(rank=1))[0] == [workers[1].pid]
            assert job.host_for_rank(1) == "h2"
            pids, _, _ = resolve_processes(ctx, ProcessSelector(name="disc-ssh"))
            assert set(pids) == ranked  # not the launcher, nor the SSH spawn's watcher below it (a helper)
        finally:
            job.discovery.finish()
    finally:
        kill_if_same(transport, seen)
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(timeout=15)


# -- through the whole harness -----------------------------------------------------------------------------------

JOB = ROOT / "tests" / "jobs" / "user_ddp_adam.py"
STEPS = 6
KILL_AT = 3


@pytest.mark.slow
def test_kill_rank_1_of_a_user_script_resolves_by_discovery_and_restarts_are_reported(tmp_path: Path) -> None:
    from chaos.cli import commands
    from chaos.report.restarts import restarts_row_of
    from chaos.run.orchestrator import RunOptions, execute
    from chaos.spec.scenario import load_scenario

    target = {
        "type": "torchrun",
        "script": str(JOB),
        "nproc_per_node": 2,
        "max_restarts": 1,
        "args": ["--steps", STEPS],
    }
    # An event trigger on rank 1's step KILL_AT: the HARNESS resolves and kills (an at_step kill of one rank is
    # fired by that rank's own agent, and this job attaches one).
    trigger = {"on_event": {"kind": "target.step", "nth": KILL_AT, "rank": 1}}
    fault = {"name": "kill-rank1", "type": "kill", "params": {"rank": 1}, "trigger": trigger}
    checks = [
        {"type": "restarts_at_most", "name": "restarts_at_most[0]", "params": {"restarts": 0}},
        {"type": "restarts_at_most", "name": "restarts_at_most[1]", "params": {"restarts": 1}},
        {"type": "completes"},
    ]
    text = scenario_yaml(
        "user-kill-rank1",
        5,
        target,
        faults=[fault],
        checks=checks,
        safety={"max_duration": "150s", "no_progress_timeout": "90s"},
    )
    source = tmp_path / "user-kill-rank1.yaml"
    source.write_text(text)
    result = execute(load_scenario(source), RunOptions(report_root=tmp_path / "reports", scenario_file=source))
    history = result.history
    # (Whether the agent's attach line also reports target.start or not, the discovered pid is the one hit;
    # test_selectors_resolve_in_the_targets_own_tree shows rank resolution with no report at all.)

    workers = history.of("target.worker")
    rounds = {(e.rank, e.get_int("restart")) for e in workers}
    assert rounds == {(0, 0), (1, 0), (0, 1), (1, 1)}, rounds
    first_rank1 = next(e for e in workers if e.rank == 1 and e.get_int("restart") == 0)
    pid = first_rank1.get_int("pid")

    [applied] = history.of("fault.applied")
    assert f"rank 1 (pid {pid})" in str(applied.data.get("description")), applied

    restarts = [e for e in history.of("target.restart") if e.source == "process_tree"]
    assert len(restarts) == 1, restarts
    restart = restarts[0]
    assert restart.get_int("restart") == 1 and restart.get_int("failed_rank") == 1
    assert restart.get_int("failed_pid") == pid and restart.get_int("exitcode") == -signal.SIGKILL
    assert "rank 1" in str(restart.data["cause"]) and "SIGKILL" in str(restart.data["cause"])
    assert restart.ts_ns > applied.ts_ns

    verdicts = {r.name: r.status for r in result.results}
    assert verdicts == {"restarts_at_most[0]": "fail", "restarts_at_most[1]": "pass", "completes": "pass"}, [
        (r.name, r.status, r.reason) for r in result.results
    ]

    # The restarts used, in every verdict table: run.json, report.html, the CLI's.
    document = json.loads((result.run_dir / "run.json").read_text())
    assert document["restarts"]["used"] == 1 and "SIGKILL" in document["restarts"]["causes"][0]
    assert "restarts used" in (result.run_dir / "report.html").read_text()
    row = restarts_row_of(result)
    assert row is not None and row.measured == "1"
    from rich.console import Console

    out = io.StringIO()
    saved = commands.console
    commands.console = Console(file=out, width=300)
    try:
        commands._print_results(result)
    finally:
        commands.console = saved
    line = next(line for line in out.getvalue().splitlines() if "restarts used" in line)
    assert " 1 " in line and "max_restarts 1" in line, out.getvalue()
