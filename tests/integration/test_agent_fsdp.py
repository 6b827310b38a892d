"""The agent on FSDP, 2 gloo ranks on CPU (``chaos.guards._dist.run_group``):

- FSDP1 (``FullyShardedDataParallel``, full shard): with the agent's comm hook installed and nothing firing, the
  trained parameters are bit-identical to FSDP's own reduction; a phase-``allreduce`` fault fires inside FSDP's
  reduce-scatter (site ``in_flight``; SIGCONT, which the process survives, so the test can read where it fired);
  a ``grad_corrupt`` in transit on rank 1 fires there and changes what both ranks train (it entered the reduction).
- Refused at attach, saying why: the checksum guard on FSDP1 (a reduce-scatter leaves each rank only its shard)
  and FSDP2's ``fully_shard`` (no communication hook).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from chaos.agent import Agent
from chaos.guards._dist import Report, run_group
from chaos.plan.agent_plan import InJobOp, InJobPlan

STEPS = 3


def _train(rank: int, world: int, report: Report, ops: list[dict[str, Any]] | None) -> dict[str, Any]:
    from torch.distributed.fsdp import FullyShardedDataParallel

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 4))
    wrapped = FullyShardedDataParallel(model, device_id=torch.device("cpu"))
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.1)
    seen: list[tuple[str, dict[str, Any]]] = []
    agent = None
    if ops is not None:
        plan = InJobPlan(seed=1, ops=[InJobOp.from_dict(op) for op in ops])
        emit = lambda kind, **data: seen.append((kind, data))  # noqa: E731
        agent = Agent(model, optimizer=optimizer, ddp=wrapped, plan=plan, emit=emit, consistency_every=0)
    for step in range(1, STEPS + 1):
        if agent is not None:
            agent.begin_step(step)
        x = torch.Generator().manual_seed(step * world + rank)
        loss = wrapped(torch.randn(4, 8, generator=x)).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    if agent is not None:
        agent.close()
    flat = torch.cat([p.detach().reshape(-1) for p in wrapped.parameters()])
    # A list, not a tensor: a tensor would travel as shared memory the exiting rank takes with it.
    return {
        "params": flat.tolist(),
        "events": [(k, d) for k, d in seen if k == "fault.applied"],
        "hooked": agent is not None,
    }


def _phase_op(rank: int) -> dict[str, Any]:
    return {
        "op_id": "k#1",
        "fault": "k",
        "injector": "kill",
        "at_step": 2,
        "rank": rank,
        "phase": "allreduce",
        "params": {"rank": rank, "signal": "SIGCONT"},
    }


SDC = {
    "op_id": "sdc#1",
    "fault": "sdc",
    "injector": "grad_corrupt",
    "at_step": 2,
    "rank": 1,
    "params": {"site": "in_transit", "rank": 1},
}


@pytest.mark.slow
def test_fsdp1_faults_fire_inside_its_reduce_scatter() -> None:
    plain = run_group(_train, 2, None, timeout_s=180)
    hooked = run_group(_train, 2, [_phase_op(1)], timeout_s=180)
    for rank in (0, 1):  # the agent's hook reduces exactly as FSDP's default does
        assert plain[rank]["params"] == hooked[rank]["params"], rank
    assert hooked[0]["events"] == []
    [(kind, data)] = hooked[1]["events"]
    assert (data["step"], data["phase"], data["site"], data["signal"]) == (2, "allreduce", "in_flight", "SIGCONT")
    corrupted = run_group(_train, 2, [SDC], timeout_s=180)
    assert [d["step"] for _, d in corrupted[1]["events"]] == [2]
    for rank in (0, 1):  # the flip entered the reduce-scatter: the model both ranks train on changed
        assert plain[rank]["params"] != corrupted[rank]["params"], rank


def _refused(rank: int, world: int, report: Report, which: str) -> str:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 4))
    if which == "fsdp1-checksum":
        from torch.distributed.fsdp import FullyShardedDataParallel

        wrapped: nn.Module = FullyShardedDataParallel(model, device_id=torch.device("cpu"))
        guard = "checksum"
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        wrapped = fully_shard(model, mesh=init_device_mesh("cpu", (world,)))
        guard = "none"
    try:
        Agent(model, ddp=wrapped, guard=guard, plan=InJobPlan(), emit=lambda *a, **k: None)  # type: ignore[arg-type]
    except ValueError as exc:
        return str(exc)
    return "accepted"


@pytest.mark.slow
def test_what_fsdp_cannot_host_is_refused_at_attach_with_the_reason() -> None:
    [checksum, _] = run_group(_refused, 2, "fsdp1-checksum", timeout_s=180)
    assert "FSDP reduce-scatters: each rank receives only its shard" in checksum, checksum
    [fsdp2, _] = run_group(_refused, 2, "fsdp2", timeout_s=180)
    assert "FSDP2 has no communication hook" in fsdp2, fsdp2
