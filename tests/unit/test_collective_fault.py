"""The ``collective_fault`` fault: its params (the YAML schema) and the agent-side firing. Its way into the job's
plan file, as every in-job one-shot fault's, is pinned in test_in_job_one_shot_faults.py.

Pinned here: the params' defaults and refusals; a target without training ranks is refused; in the agent (a real
flight recorder), it fires once, at its (step, index) only, after its ``fault.applied`` and the fire-once
marker, never again after a restart finds the marker, and the failed call is not recorded as started; the abort
finds this process's TCP connections and shuts them down without closing their fds. And in two real gloo
processes: ``error`` fails exactly one all-reduce of rank 1 while rank 0 waits in it, and the retry pairs with
it; ``abort`` makes rank 1's all-reduce and rank 0's fail with gloo's own error, both processes living on.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
from pydantic import ValidationError
from support import COLLECTIVE_FAULT, ROOT, TORCHRUN, AgentRank

from chaos.injob.collective_faults import COLLECTIVE_KINDS, CollectiveFaults
from chaos.injob.fault_specs import CollectiveFaultSpec
from chaos.injob.flight_recorder import Recorder, flight_path, read_state
from chaos.injob.pg_abort import established_tcp, shut_down
from chaos.plan.agent_plan import InJobOp
from chaos.spec.preflight import preflight
from chaos.spec.scenario import parse_scenario
from injectors.collective import CollectiveFaultParams


def _op(kind: str = "error", index: int = 1, rank: int = 1, step: int = 4) -> InJobOp:
    params: dict[str, Any] = {"kind": kind, "index": index, "rank": rank}
    return InJobOp(op_id="cf#1", fault="cf", injector="collective_fault", params=params, at_step=step, rank=rank)


class _Rank(AgentRank):
    def faults(self, *ops: InJobOp) -> CollectiveFaults:
        return CollectiveFaults(ops, self.rules(has_ddp=False))


# -- the params and the plan -----------------------------------------------------------------------------------


def test_the_params_default_to_an_error_of_the_steps_first_collective_and_refuse_what_they_do_not_know() -> None:
    assert CollectiveFaultParams().model_dump() == {"kind": "error", "index": 0, "rank": None}
    for bad in ({"kind": "timeout"}, {"index": -1}, {"rank": -1}, {"phase": "backward"}):
        with pytest.raises(ValidationError):
            CollectiveFaultParams.model_validate(bad)
    assert tuple(CollectiveFaultParams.model_fields["kind"].annotation.__args__) == COLLECTIVE_KINDS  # type: ignore[union-attr]
    validated = CollectiveFaultParams.model_validate({"kind": "abort", "index": 2, "rank": 0})
    assert CollectiveFaultSpec.from_params(validated.model_dump(mode="json")) == CollectiveFaultSpec("abort", 2, 0)


def test_a_target_without_training_ranks_is_refused() -> None:
    serving = TORCHRUN.replace(
        "  type: torchrun\n  module: chaos.reference.trainer\n  nproc_per_node: 2\n",
        "  type: serving\n  fallback: null\n  port: 0\n",
    ).replace("FAULTS", COLLECTIVE_FAULT.replace("rank: 1", "rank: 0"))
    problems = [str(problem) for problem in preflight(parse_scenario(serving))]
    assert any("fired by the agent of a training rank" in problem for problem in problems), problems


# -- the agent side ------------------------------------------------------------------------------------------------


def _recorder(tmp_path: Path) -> Recorder:
    return Recorder(flight_path(tmp_path, 1), rank=1, world=2)


def test_an_error_fails_exactly_its_collective_once_after_its_event_and_marker(tmp_path: Path) -> None:
    rank = _Rank()
    faults = rank.faults(_op(), _op(rank=0))  # rank 0's op is not this rank's
    assert faults.wanted
    recorder = _recorder(tmp_path)
    faults.arm(recorder)
    for step in (3, 4):
        rank.step = step
        recorder.begin_step(step)
        seq, _ = recorder.started_one("all_reduce", 16, 0)  # index 0: not the op's
        recorder.completed_one(seq)
        if step == 3:
            recorder.started_one("barrier", 0, 0)  # index 1 of step 3: not its step
    assert rank.events == [] and rank.markers == set()
    with pytest.raises(dist.DistBackendError, match=r"barrier failed on rank 1, collective 1 of step 4 \(barrier\)"):
        recorder.started_one("barrier", 0, 0)
    [(kind, data)] = rank.events
    assert kind == "fault.applied" and rank.markers == {"cf#1"}
    assert {
        k: data[k] for k in ("fault", "op", "injector", "rank", "step", "index", "collective", "collective_kind")
    } == {
        "fault": "cf",
        "op": "cf#1",
        "injector": "collective_fault",
        "rank": 1,
        "step": 4,
        "index": 1,
        "collective": "barrier",
        "collective_kind": "error",
    }
    assert data["pid"] == os.getpid()
    # The failed call never ran: not recorded as started; the retry is the step's next call and runs.
    state = read_state(flight_path(tmp_path, 1))
    assert state is not None and (state.started, state.next_index) == (3, 2), state  # 2 + 1 ran
    recorder.started_one("barrier", 0, 0)
    assert len(rank.events) == 1
    # A restarted rank (new agent, same markers) recomputing step 4 arms nothing.
    restarted = _Rank(markers=rank.markers)
    assert not restarted.faults(_op()).wanted


def test_an_unknown_kind_is_refused_at_attach() -> None:
    with pytest.raises(ValueError, match="collective_fault kind 'timeout' is not one of error, abort"):
        _Rank().faults(_op(kind="timeout"))


def test_the_abort_shuts_down_this_processs_tcp_connections_but_leaves_their_fds_open() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
        with client, accepted:
            ports = {client.fileno(): client.getsockname()[1], accepted.fileno(): accepted.getsockname()[1]}
            found = {fd: local for fd, local, _ in established_tcp()}
            assert {fd: found.get(fd) for fd in ports} == ports
            shut_down((client.fileno(),))
            assert accepted.recv(1) == b""  # the peer sees the connection closed
            os.fstat(client.fileno())  # the fd is still open (it stays its owner's)
            assert client.fileno() not in {fd for fd, _, _ in established_tcp()}


PAIR = """
import sys, datetime
import torch, torch.distributed as dist
from torch import nn
from chaos.agent import Agent
from chaos.plan.agent_plan import InJobOp, InJobPlan
rank, kind, init = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2, timeout=datetime.timedelta(seconds=20))
op = InJobOp(op_id="cf#1", fault="cf", injector="collective_fault", params={"kind": kind, "rank": 1, "index": 0},
             at_step=2, rank=1)
agent = Agent(nn.Linear(1, 1), plan=InJobPlan(ops=[op]), consistency_every=0)
for step in (1, 2, 3):
    agent.begin_step(step)
    for attempt in (1, 2):
        x = torch.full((4,), float(rank + 1))
        try:
            dist.all_reduce(x)
            print(f"step {step} try {attempt}: {x[0].item():g}", flush=True)
            break
        except RuntimeError as exc:
            print(f"step {step} try {attempt}: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
print("alive", flush=True)
dist.destroy_process_group()  # a gloo group left to the interpreter's exit may abort its process
"""


def _pair(tmp_path: Path, kind: str) -> tuple[list[str], list[str], list[dict[str, Any]]]:
    """Ranks 0 and 1 of a real 2-process gloo group running :data:`PAIR`: each one's output, rank 1's events."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        init = f"tcp://127.0.0.1:{sock.getsockname()[1]}"
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "PYTHONPATH": str(ROOT), "CHAOS_RUN_DIR": str(tmp_path)}
        env["CHAOS_EVENTS"] = str(tmp_path / f"events-{rank}.jsonl")
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", PAIR, str(rank), kind, init],
                env=env,
                text=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
        )
    outs = []
    for proc in procs:
        out, _ = proc.communicate(timeout=90)
        assert proc.returncode == 0, out[-3000:]
        outs.append([line for line in out.splitlines() if line.startswith(("step", "alive"))])
    records = [json.loads(line) for line in (tmp_path / "events-1.jsonl").read_text().splitlines()]
    return outs[0], outs[1], [r for r in records if r["kind"].startswith("fault.")]


def test_in_a_real_gloo_pair_an_error_fails_one_call_and_the_retry_pairs_with_the_waiting_peer(tmp_path: Path) -> None:
    rank0, rank1, faults = _pair(tmp_path, "error")
    assert rank0 == ["step 1 try 1: 3", "step 2 try 1: 3", "step 3 try 1: 3", "alive"]  # it waited, then paired
    assert rank1[0] == "step 1 try 1: 3" and rank1[2:] == ["step 2 try 2: 3", "step 3 try 1: 3", "alive"]
    assert rank1[1].startswith("step 2 try 1: DistBackendError: collective_fault 'cf' (op cf#1): all_reduce failed")
    assert [(f["kind"], f["data"]["step"], f["data"]["collective_kind"]) for f in faults] == [
        ("fault.applied", 2, "error")
    ]


def test_in_a_real_gloo_pair_an_abort_fails_both_ranks_collectives_with_gloos_own_error(tmp_path: Path) -> None:
    rank0, rank1, faults = _pair(tmp_path, "abort")
    for out in (rank0, rank1):
        assert out[0] == "step 1 try 1: 3" and out[-1] == "alive", out  # the process lives on
        assert len(out) == 6 and all(
            "RuntimeError: [" in line and "Connection closed by peer" in line for line in out[1:5]
        ), out
    [applied] = faults
    assert (applied["data"]["collective_kind"], applied["data"]["groups"], applied["data"]["connections"]) == (
        "abort",
        1,
        1,
    )
