"""The cross-rank consistency guard on real gloo ranks, through the in-job agent (``Agent``/``attach``), and the
misuse errors at attach.

The distributed tests run 2 or 3 fresh ranks (``run_group``: spawn, a deadline, results back) training a small
DDP model with the agent attached; a "script" corrupts rank 1 between its optimizer step and ``end_step`` (the
guard's check point) at chosen steps, as a fault outside the gradient all-reduce would.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from support import Recorder
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from chaos.agent import Agent, Guards, attach
from chaos.guards._dist import Report, run_group
from chaos.plan.agent_plan import ENV_PLAN, InJobOp, InJobPlan, write_plan

TIMEOUT_S = 180.0


def _model(hidden: int = 32) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, hidden), nn.Tanh(), nn.Linear(hidden, 1))


def _corrupt(action: str, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    weight = model[2].weight  # type: ignore[index]
    with torch.no_grad():
        if action == "flip":  # a mantissa bit: finite, and a different model for good (a 1-ulp change can be
            # rounded away by the next updates, when both ranks' values round to the same result)
            weight.view(-1).view(torch.int32)[3] ^= 1 << 20
        elif action == "nan":
            weight.view(-1)[5] = float("nan")
        elif action == "momentum":  # the optimizer state only; the weights stay equal at this check
            optimizer.state[weight]["momentum_buffer"].view(-1).view(torch.int32)[0] ^= 1 << 4
        elif action == "resync":  # every rank takes rank 0's parameters and momentum again
            for p in model.parameters():
                dist.broadcast(p, src=0)
                dist.broadcast(optimizer.state[p]["momentum_buffer"], src=0)


def _train(
    rank: int,
    world: int,
    report: Report,
    steps: int,
    every: int,
    script: dict[int, str],
    optimizer_state: bool,
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    options = dict(options or {})
    # "wide": 5.6 MB of parameters, the last layer's and a bias over DDP's 1 MiB first bucket: two buckets a step
    wide = options.pop("wide", False)
    model = _model(140_000 if wide else 32)
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-5 if wide else 0.05, momentum=0.9)  # wide: stays finite
    recorder = Recorder()
    agent = Agent(
        model,
        optimizer=optimizer,
        ddp=ddp,
        consistency_every=every,
        consistency_optimizer=optimizer_state,
        plan=options.pop("plan", InJobPlan()),
        emit=recorder,
        **options,
    )
    gen = torch.Generator().manual_seed(100 + rank)
    for step in range(1, steps + 1):
        agent.begin_step(step)
        x = torch.randn(16, 8, generator=gen)
        loss = nn.functional.mse_loss(ddp(x), x.sum(1, keepdim=True).tanh())
        optimizer.zero_grad()
        loss.backward()
        agent.after_backward(loss)
        if agent.allow_optimizer_step():
            optimizer.step()
        action = script.get(step)
        if action == "resync" or (action is not None and rank == 1):
            _corrupt(action, model, optimizer)
        agent.end_step()
    agent.close()
    state = b"".join(p.detach().numpy().tobytes() for p in model.parameters())
    guard = agent.consistency
    exchanges = None if guard is None else dict(guard.exchanges)
    buckets = len(str(ddp._get_ddp_logging_data().get("rebuilt_bucket_sizes", "")).split(","))
    return {
        "events": recorder.events,
        "state": state,
        "guarded": guard is not None,
        "exchanges": exchanges,
        "buckets": buckets,
        "comm_hook": ddp._get_ddp_logging_data().get("comm_hook"),
    }


def _of(events: list[tuple[str, int | None, dict[str, Any]]], kind: str) -> list[tuple[int | None, dict[str, Any]]]:
    return [(rank, data) for k, rank, data in events if k == kind]


def test_clean_training_agrees_at_every_check_and_is_bit_identical_to_the_guard_off() -> None:
    guarded = run_group(_train, 2, 20, 1, {}, True, timeout_s=TIMEOUT_S)
    unguarded = run_group(_train, 2, 20, 0, {}, False, timeout_s=TIMEOUT_S)
    assert all(r["guarded"] for r in guarded) and not any(r["guarded"] for r in unguarded)
    # hashing only reads: the same numerics with the guard on every step and off
    assert [r["state"] for r in guarded] == [r["state"] for r in unguarded]
    assert guarded[0]["state"] == guarded[1]["state"]
    checks = _of(guarded[0]["events"], "guard.consistency")
    assert [d["step"] for _, d in checks] == list(range(1, 21))
    assert all(d["agree"] and d["odd_ranks"] == [] and d["tensors"] == 4 + 4 for _, d in checks)  # params + momenta
    assert _of(guarded[1]["events"], "guard.consistency") == []  # the reporter (rank 0) reports, once
    assert not any(k.startswith("detect.") for r in guarded for k, _, _ in r["events"])
    # nothing of the agent's reduces the gradients here: DDP keeps its default reduction (no Python comm hook
    # for the digest to ride in: it would cost every step more than the guard's own exchange every N steps)
    assert all(r["exchanges"] == {"carried": 0, "own": 20} and r["comm_hook"] is None for r in guarded)


def test_a_diverged_rank_is_named_once_per_onset_and_again_after_a_resync() -> None:
    # rank 1 of 3 drifts at step 7 (checks at 10 and 15 see it), all ranks resync at 17 (20 agrees),
    # rank 1 drifts again at 22 (25 sees a new onset)
    script = {7: "flip", 17: "resync", 22: "flip"}
    results = run_group(_train, 3, 25, 5, script, False, timeout_s=TIMEOUT_S)
    reporter = results[0]["events"]
    checks = [(d["step"], d["agree"], d["odd_ranks"]) for _, d in _of(reporter, "guard.consistency")]
    assert checks == [(5, True, []), (10, False, [1]), (15, False, [1]), (20, True, []), (25, False, [1])]
    detections = _of(reporter, "detect.divergence")
    assert [(rank, d["step"], d["culprit_rank"], d["odd_ranks"]) for rank, d in detections] == [
        (1, 10, 1, [1]),
        (1, 25, 1, [1]),
    ]
    first = detections[0][1]
    assert first["groups"] == [[0, 2], [1]] and first["tensors"] == ["2.weight"] and first["reporter"] == 0
    assert first["digests"][0] == first["digests"][2] == first["digest"] != first["digests"][1]
    assert "rank 1 diverged from rank(s) 0, 2 at step 10 in 2.weight" in first["message"]
    for other in results[1:]:  # the verdict is emitted once, by the reporter
        assert _of(other["events"], "detect.divergence") == []
    # 3 ranks: the guard's own exchange (the digest rides in the gradient all-reduce in 2-rank groups only,
    # where that keeps the gradients bit-identical: chaos.guards.digest_carrier)
    assert all(r["exchanges"] == {"carried": 0, "own": 5} for r in results)


def test_non_finite_weights_are_a_detection_and_name_the_rank_among_two() -> None:
    results = run_group(_train, 2, 10, 5, {10: "nan"}, False, timeout_s=TIMEOUT_S)
    [(rank, nonfinite)] = _of(results[1]["events"], "detect.nonfinite")
    assert rank == 1 and nonfinite["step"] == 10 and nonfinite["tensors"] == ["2.weight"] and nonfinite["count"] == 1
    assert _of(results[0]["events"], "detect.nonfinite") == []
    # two ranks, no majority: the finite rank is the reference, so the non-finite one is named
    [(blamed, divergence)] = _of(results[0]["events"], "detect.divergence")
    assert blamed == 1 and divergence["culprit_rank"] == 1 and "(non-finite)" in divergence["message"]
    [*_, (_, last)] = _of(results[0]["events"], "guard.consistency")
    assert last["nonfinite_ranks"] == [1] and last["odd_ranks"] == [1]


def test_a_non_finite_rank_is_named_from_the_digest_carried_in_the_gradient_all_reduce() -> None:
    # checks at 5 and 10; step 10's digest rides in step 11's gradient all-reduce (the agent's plain hook, there
    # for the anomaly guard), and close takes that verdict
    results = run_group(_train, 2, 12, 5, {10: "nan"}, False, {"anomaly": True}, timeout_s=TIMEOUT_S)
    assert all(r["exchanges"] == {"carried": 2, "own": 0} for r in results)
    [(blamed, divergence)] = _of(results[0]["events"], "detect.divergence")
    assert blamed == 1 and divergence["culprit_rank"] == 1 and divergence["step"] == 10
    assert divergence["tensors"] == ["2.weight"] and "(non-finite)" in divergence["message"]
    [(rank, _)] = _of(results[1]["events"], "detect.nonfinite")
    assert rank == 1


def test_the_digest_rides_in_the_agents_plain_hook_and_training_is_bit_identical() -> None:
    # the anomaly guard needs the agent's plain hook (DDP's reduction with the fault sites); the digest rides there
    on = run_group(_train, 2, 12, 2, {}, False, {"anomaly": True}, timeout_s=TIMEOUT_S)
    off = run_group(_train, 2, 12, 0, {}, False, {"anomaly": True}, timeout_s=TIMEOUT_S)
    assert [r["state"] for r in on] == [r["state"] for r in off] and on[0]["state"] == on[1]["state"]
    assert all(r["exchanges"] == {"carried": 5, "own": 1} and r["comm_hook"] == "_plain_hook" for r in on)


def test_the_digest_rides_in_the_first_of_several_buckets_and_training_is_bit_identical() -> None:
    options = {"wide": True, "anomaly": True}
    on = run_group(_train, 2, 12, 2, {}, False, options, timeout_s=TIMEOUT_S)
    off = run_group(_train, 2, 12, 0, {}, False, options, timeout_s=TIMEOUT_S)
    assert on[0]["buckets"] > 1  # bucket 0, which carries, is then reduced asynchronously
    assert [r["state"] for r in on] == [r["state"] for r in off] and on[0]["state"] == on[1]["state"]
    assert all(r["exchanges"] == {"carried": 5, "own": 1} for r in on)
    nan = run_group(_train, 2, 12, 5, {10: "nan"}, False, options, timeout_s=TIMEOUT_S)
    [(blamed, divergence)] = _of(nan[0]["events"], "detect.divergence")
    assert blamed == 1 and divergence["step"] == 10 and nan[0]["exchanges"] == {"carried": 2, "own": 0}


def test_a_fault_planned_on_one_rank_puts_every_rank_on_the_same_hook_and_exchange() -> None:
    # Only rank 1 corrupts its gradients (in transit, step 3), but every rank must reduce through the agent's
    # plain hook: the digest rides there, and a rank on DDP's default reduction would exchange on its own while
    # the other carried, and the job would hang at the next check (found in the sdc-in-transit scenario).
    grad = InJobOp(
        op_id="flip#1",
        fault="flip",
        injector="grad_corrupt",
        at_step=3,
        params={"site": "in_transit", "rank": 1, "kind": "bitflip", "bit": "mantissa"},
    )
    results = run_group(_train, 2, 12, 5, {}, False, {"plan": InJobPlan(seed=7, ops=[grad])}, timeout_s=TIMEOUT_S)
    assert [r["comm_hook"] for r in results] == ["_plain_hook", "_plain_hook"]
    assert all(r["exchanges"] == {"carried": 2, "own": 0} for r in results)
    assert [rank for k, rank, _ in results[1]["events"] if k == "fault.applied"] == [1]


def test_under_the_checksum_guards_hook_the_guard_keeps_its_own_exchange() -> None:
    results = run_group(_train, 3, 10, 5, {7: "flip"}, False, {"guard": "checksum"}, timeout_s=TIMEOUT_S)
    assert all(r["exchanges"] == {"carried": 0, "own": 2} for r in results)
    [(blamed, divergence)] = _of(results[0]["events"], "detect.divergence")
    assert blamed == 1 and divergence["step"] == 10


def test_two_finite_ranks_that_differ_are_reported_with_no_culprit() -> None:
    results = run_group(_train, 2, 10, 5, {10: "flip"}, False, timeout_s=TIMEOUT_S)
    [(blamed, divergence)] = _of(results[0]["events"], "detect.divergence")
    assert blamed == 0 and divergence["culprit_rank"] is None and divergence["odd_ranks"] == []
    assert divergence["groups"] == [[0], [1]] and "no majority" in divergence["message"]


@pytest.mark.parametrize("optimizer_state", [True, False])
def test_optimizer_state_is_hashed_only_when_asked(optimizer_state: bool) -> None:
    results = run_group(_train, 3, 10, 5, {10: "momentum"}, optimizer_state, timeout_s=TIMEOUT_S)
    detections = _of(results[0]["events"], "detect.divergence")
    if optimizer_state:
        [(_, divergence)] = detections
        assert divergence["culprit_rank"] == 1 and divergence["tensors"] == ["optimizer.2.weight.momentum_buffer"]
    else:
        assert detections == []  # the weights are still equal at step 10


def test_off_in_a_single_process_job() -> None:
    model = _model()
    agent = attach(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    assert agent.consistency is None  # no peers to compare with (and no process group)


# ---------------------------------------------------------------------------------------------------------
# misuse at attach


def test_checksum_guard_without_ddp_raises_with_what_to_pass() -> None:
    model = _model()
    with pytest.raises(ValueError, match=r"guard='checksum'.*ddp=ddp_model"):
        attach(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), guard="checksum")


def test_a_planned_gradient_fault_without_ddp_raises_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = tmp_path / "chaos-plan.json"
    grad = InJobOp(op_id="scale#1", fault="scale-local", injector="grad_corrupt", params={"site": "local"}, at_step=3)
    write_plan(plan, 7, [grad])
    monkeypatch.setenv(ENV_PLAN, str(plan))
    model = _model()
    with pytest.raises(ValueError, match=r"grad_corrupt fault\(s\) scale-local.*ddp=ddp_model"):
        attach(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    # a tensor fault needs no DDP: the same attach with a bitflip plan is fine
    flip = InJobOp(op_id="w#1", fault="w", injector="bitflip", params={"where": "weights"}, at_step=3)
    write_plan(plan, 7, [flip])
    attach(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))


def test_bad_consistency_settings_raise() -> None:
    model = _model()
    with pytest.raises(ValueError, match="consistency_every=-1"):
        attach(model, guard=Guards(consistency_every=-1))
    with pytest.raises(ValueError, match="pass optimizer="):
        attach(model, guard=Guards(consistency_optimizer=True))
    with pytest.raises(ValueError, match="guard='checksums': pass 'checksum', 'none' or Guards"):
        attach(model, guard="checksums")  # type: ignore[arg-type]
    with pytest.raises(
        ValueError, match=r"unknown forwards \(choose from forward, optimizer, commit, atexit, excepthook\)"
    ):
        attach(model, torch.optim.SGD(model.parameters(), lr=0.1), hooks=["forwards"])
