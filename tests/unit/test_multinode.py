"""Pure logic of the multi-node torchrun target and of rank-resolved hosts: job-wide attempts, the rank
table, the torchrun command lines, interface discovery, remote event lines, and the detection check's
culprit and step bounds. The real multi-node runs are in test_e2e_multinode.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from support import ROOT
from test_checks import ev, judge

from chaos.cluster.base import Completed
from chaos.cluster.local import LocalTransport
from chaos.events import STDOUT_PREFIX
from chaos.history.timeline import Event
from chaos.run.orchestrator import RunOptions, execute
from chaos.run.result import EXIT_INVALID
from chaos.spec.scenario import HostSelector, ScenarioError, parse_scenario
from chaos.targets.base import SpawnedJob
from chaos.targets.torchrun import RankTable
from chaos.targets.torchrun_nodes import JobAttempts, MultiNodeTorchrunJob, Node, interface_of


def start_event(t: float, rank: int, pid: int, attempt: int) -> Event:
    return ev(t, "target.start", rank, pid=pid, attempt=attempt, world_size=3)


def test_job_attempts_count_rounds_not_one_agents_restarts() -> None:
    attempts = JobAttempts()
    # Round 0: all three ranks start with node-local attempt 0.
    for rank in range(3):
        assert attempts.rewrite(start_event(0, rank, 100 + rank, 0)).data["attempt"] == 0
    # Node of rank 1 failed: its agent counts 1, the others re-join still at 0. Job-wide, that is attempt 1.
    rewritten = [attempts.rewrite(start_event(5, rank, 200 + rank, 1 if rank == 1 else 0)) for rank in (2, 1, 0)]
    assert [e.data["attempt"] for e in rewritten] == [1, 1, 1]
    assert [e.data["node_attempt"] for e in rewritten] == [0, 1, 0]
    step = attempts.rewrite(ev(6, "target.step", 2, step=3, attempt=0))
    assert step.data["attempt"] == 1 and step.data["node_attempt"] == 0
    # Events without a rank or without an attempt pass through untouched.
    assert attempts.rewrite(ev(7, "detect.worker_exit", None, local_rank=0)).data == {"local_rank": 0}


def test_rank_table_latest_start_wins_across_hosts() -> None:
    table = RankTable()
    starts = {100: 11, 101: 12}
    table.observe(start_event(1, 1, 100, 3), "h2", starts.get)
    table.observe(start_event(2, 1, 101, 0), "h3", starts.get)  # lower node attempt, but later: it wins
    table.observe(ev(3, "target.step", 1, step=1), "h2", starts.get)  # ignored
    assert table.pids_for_rank(1) == [101] and table.host_for_rank(1) == "h3"
    assert table.workers == {"h2": {100: 11}, "h3": {101: 12}}
    assert table.host_for_rank(0) is None and table.ranks() == [1]


def _job(tmp_path: Path, nodes: int = 3, **target: Any) -> MultiNodeTorchrunJob:
    spec = parse_scenario(
        json.dumps(
            {
                "name": "mn",
                "target": {"type": "torchrun", "module": "m.train", "nodes": {"group": "all"}, **target},
                "faults": [],
                "checks": [],
                "allow_no_checks": True,
            }
        )
    ).target
    hosts = [Node(f"h{i}", f"10.0.0.{10 + i}", LocalTransport()) for i in range(1, nodes + 1)]
    return MultiNodeTorchrunJob(spec, hosts, tmp_path / "run-1", seed=3)  # type: ignore[arg-type]


def test_node_command_lines(tmp_path: Path) -> None:
    job = _job(tmp_path, nproc_per_node=2, rdzv_port=29555, args=["--seed", "{seed}"])
    first, second = job.argv(0), job.argv(1)
    assert first[:3] == [sys.executable, "-m", "torch.distributed.run"]
    for argv, is_host, addr in ((first, "1", "10.0.0.11"), (second, "0", "10.0.0.12")):
        text = " ".join(argv)
        assert "--nnodes 3 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint 10.0.0.11:29555" in text
        assert f"--rdzv-id run-1 --rdzv-conf is_host={is_host} --local-addr {addr}" in text
        assert argv[-4:] == ["-m", "m.train", "--seed", "3"]
    assert job.describe() == "torchrun 3 nodes x 2 ranks on h1, h2, h3: m.train"


def test_nodes_cannot_be_chosen_by_rank_and_host_selector_takes_one_kind() -> None:
    with pytest.raises(ScenarioError, match="not rank"):
        parse_scenario(
            '{"name": "x", "target": {"type": "torchrun", "module": "m", "nodes": {"rank": 1}}, "faults": []}'
        )
    with pytest.raises(ValidationError, match="one of host, rank, group, slurm or role"):
        HostSelector(rank=1, group="workers")
    with pytest.raises(ValidationError, match="count makes no sense"):
        HostSelector(rank=1, count=2)


class _FakeIp:
    """`ip -o -4 addr show` output of a host (pure parsing test; the real command runs in the e2e tests)."""

    host = "fake"

    def run(self, argv: list[str], *, timeout: float = 30.0, check: bool = False) -> Completed:
        out = (
            "1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever\n"
            "5: eth0@if6    inet 10.213.5.12/24 brd 10.213.5.255 scope global eth0\\       valid_lft forever\n"
        )
        return Completed(tuple(argv), 0, out, "")


def test_interface_of_finds_the_interface_carrying_the_address() -> None:
    assert interface_of(_FakeIp(), "10.213.5.12") == "eth0"  # type: ignore[arg-type]
    assert interface_of(_FakeIp(), "10.213.5.99") is None  # type: ignore[arg-type]
    assert interface_of(LocalTransport(), "127.0.0.1") == "lo"


def test_remote_events_arrive_in_the_output_shifted_and_tagged(tmp_path: Path) -> None:
    """A job given CHAOS_EVENTS=stdout (as remote jobs are) reports through its output lines."""

    class ShiftedLocal(LocalTransport):
        def clock_offset(self) -> float:
            return 2.0  # pretend the host's clock is 2 s behind ours

    # Only non-local transports switch to stdout events: force it on a local subclass for the test.
    job = SpawnedJob(
        ShiftedLocal(),
        [sys.executable, "-c", "from chaos.events import emit; print('hello'); emit('target.step', rank=1, step=4)"],
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT)},
        run_dir=tmp_path,
        matchers=[],
        host="h2",
    )
    job.local = False
    job.start()
    events: list[Event] = []
    for _ in range(200):
        events += job.poll_events()
        if any(e.kind == "target.exit" for e in events):
            break
        subprocess.run(["sleep", "0.05"], check=True)
    [step] = [e for e in events if e.kind == "target.step"]
    assert step.rank == 1 and step.data["step"] == 4 and step.data["host"] == "h2"
    assert step.ts_ns > 0
    log = (tmp_path / "target.log").read_text()
    assert "hello" in log and STDOUT_PREFIX in log


def test_multinode_target_without_inventory_is_refused(tmp_path: Path) -> None:
    scenario = parse_scenario((ROOT / "scenarios/partition-node.yaml").read_text())
    result = execute(scenario, RunOptions(report_root=tmp_path))
    assert result.exit_code == EXIT_INVALID and "no inventory was given" in result.error


# -- detected_within: culprit and step bounds ----------------------------------------------------------------


def _straggler_history(named: list[int]) -> list[Event]:
    events = [ev(0, "runner.start")] + [ev(i * 0.1, "target.step", 0, step=i) for i in range(1, 60)]
    # rank r runs on host h<r+1>, as a multi-node run records it: the fault on h2 hit rank 1
    events += [ev(0.05, "target.start", r, pid=100 + r, attempt=0, host=f"h{r + 1}") for r in range(3)]
    events.append(ev(1.0, "fault.applied", fault="slow", op="slow#1", host="h2"))
    for offset, rank in enumerate(named):
        events.append(ev(2.0 + offset, "detect.straggler", rank, step=20 + 10 * offset))
    return events


def test_detected_within_exclusive_rank_fails_when_another_rank_is_named_first() -> None:
    ok = judge(
        "detected_within",
        _straggler_history([1]),
        fault="slow",
        within="5s",
        event="detect.straggler",
        rank=1,
        exclusive=True,
    )
    assert ok.status == "pass", ok.reason
    wrong = judge(
        "detected_within",
        _straggler_history([2, 1]),
        fault="slow",
        within="5s",
        event="detect.straggler",
        rank=1,
        exclusive=True,
    )
    assert wrong.status == "fail" and "named rank 2, not 1" in wrong.reason
    lenient = judge(
        "detected_within", _straggler_history([2, 1]), fault="slow", within="5s", event="detect.straggler", rank=1
    )
    assert lenient.status == "pass"


def test_detected_within_steps_bound() -> None:
    # Fault at t=1.0 (step 10 reached), detection reports step 20: 10 steps.
    history = _straggler_history([1])
    assert judge("detected_within", history, fault="slow", within="5s", within_steps=10).status == "pass"
    slow = judge("detected_within", history, fault="slow", within="5s", within_steps=9)
    assert slow.status == "fail" and "10 steps later, over 9" in slow.reason
