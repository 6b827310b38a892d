"""A torchft replica group, written like torchft's own ``train_ddp.py``: a Manager, torchft's
DistributedDataParallel and Optimizer wrapper, gloo on CPU, a small MLP on seeded synthetic data.

Run one per replica group (``REPLICA_GROUP_ID`` 0..N-1) under torchrun, with a lighthouse running::

    torchft_lighthouse --min_replicas 1 --quorum_tick_ms 100 --join_timeout_ms 10000 --bind [::]:29510
    TORCHFT_LIGHTHOUSE=http://localhost:29510 REPLICA_GROUP_ID=0 torchrun --standalone --nproc-per-node 1 \\
        tests/jobs/torchft_train.py --steps 200

Reports through ``chaos.events`` (a no-op outside a chaos run): ``target.start`` {pid, replica_group},
``target.step`` {step, loss, committed, participants} after every optimizer step (``step``: torchft's global
step, ``manager.current_step()``, which a healed replica takes over from its peer), ``target.digest``
{step, digest} of the parameters after each committed step (``--digest-every``), and ``target.heal``
{step, from_step} when the manager loaded a peer's state (the step jumped without this group committing).

``--agent``: attach mlchaos's in-job agent (``chaos.agent.attach(..., manager=manager, ddp=ddp)``), which fires the
plan's faults inside torchft's gradient all-reduce (e.g. a kill at phase ``allreduce``) and, with
``--guard checksum``, verifies each bucket and reports a mismatch to torchft. The job keeps reporting its own
events (``job_emits="all"``).
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import time
from datetime import timedelta

import torch
from torch import nn
from torchft import DistributedDataParallel, Manager, Optimizer, ProcessGroupGloo

from chaos.events import emit

REPLICA_GROUP_ID = int(os.environ.get("REPLICA_GROUP_ID", 0))


def digest(model: nn.Module) -> str:
    """sha256 over the parameters by name: equal digests are bitwise-equal models."""
    h = hashlib.sha256()
    for name, value in sorted(model.state_dict().items()):
        t = value.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}\n".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200, help="stop once torchft's global step reaches this")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--step-time", type=float, default=0.05, help="extra seconds per step (a slower model)")
    parser.add_argument("--digest-every", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=10.0, help="torchft's collective/commit timeout (s)")
    # Misbehaviours, for the tests that show the replica checks failing a broken job (off by default):
    parser.add_argument("--stale-group", type=int, default=-1, help="this group never loads a peer's state")
    parser.add_argument("--crash-alone-group", type=int, default=-1, help="this group dies once it trains alone")
    parser.add_argument("--agent", action="store_true", help="attach mlchaos's in-job agent (faults at a phase)")
    parser.add_argument("--guard", choices=["none", "checksum"], default="none", help="the agent's guard")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)

    torch.manual_seed(args.seed)  # every group starts from the same weights (torchft syncs step 0 anyway)
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 4))
    inner = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def load_state_dict(state: dict[str, object]) -> None:
        if args.stale_group == REPLICA_GROUP_ID:
            return  # a broken replica: it takes the peer's step but keeps its own parameters
        model.load_state_dict(state["model"])  # type: ignore[arg-type]
        inner.load_state_dict(state["optim"])  # type: ignore[arg-type]

    def state_dict() -> dict[str, object]:
        return {"model": model.state_dict(), "optim": inner.state_dict()}

    timeout = timedelta(seconds=args.timeout)  # the process group's and the manager's alike
    manager = Manager(
        pg=ProcessGroupGloo(timeout=timeout),
        min_replica_size=1,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        replica_id=f"torchft_train_{REPLICA_GROUP_ID}",
        timeout=timeout,
    )
    ddp = DistributedDataParallel(manager, model)
    optimizer = Optimizer(manager, inner)
    loss_fn = nn.MSELoss()
    emit("target.start", pid=os.getpid(), replica_group=REPLICA_GROUP_ID)
    agent = None
    if args.agent:
        import chaos.agent

        agent = chaos.agent.attach(model, optimizer=inner, manager=manager, ddp=ddp, guard=args.guard, job_emits="all")

    peers = 0  # the most participants seen in a step
    while manager.current_step() < args.steps:
        before = manager.current_step()
        gen = torch.Generator().manual_seed(args.seed * 1_000_003 + before * 97 + REPLICA_GROUP_ID)
        x = torch.randn(32, 16, generator=gen)
        y = torch.randn(32, 4, generator=gen)
        optimizer.zero_grad()  # starts the quorum; a recovering group loads a peer's state here
        if agent is not None:
            agent.begin_step(before + 1)
        loss = loss_fn(ddp(x), y)
        loss.backward()  # the gradient all-reduce across replica groups
        if agent is not None:
            agent.after_backward(loss)
            agent.allow_optimizer_step()  # always True under torchft (phase optimizer_step faults fire here)
        optimizer.step()  # commits only when every participant's all-reduce succeeded
        if agent is not None:
            agent.end_step()
        after = manager.current_step()
        committed = after > before
        if committed and after - before > 1 or (not committed and after != before):
            emit("target.heal", step=after, from_step=before)
        emit(
            "target.step",
            step=after,
            loss=float(loss.item()),
            committed=committed,
            participants=manager.num_participants(),
        )
        if committed and args.digest_every > 0 and after % args.digest_every == 0:
            emit("target.digest", step=after, digest=digest(model))
        peers = max(peers, manager.num_participants())
        if args.crash_alone_group == REPLICA_GROUP_ID and committed and peers > 1 and manager.num_participants() == 1:
            os._exit(1)  # a survivor that cannot go on once its peer is gone
        time.sleep(args.step_time)
    if agent is not None:
        agent.close()
    manager.shutdown()


if __name__ == "__main__":
    main()
