"""Settings the in-job agent refuses at ``attach``: each would otherwise silently do nothing. Every refusal is a
``ValueError`` that says what to pass instead."""

from __future__ import annotations

from torch import nn

from chaos.injob import fsdp
from chaos.plan.agent_plan import InJobPlan


def refuse_misuse(
    plan: InJobPlan,
    *,
    ddp: nn.Module | None,
    torchft_ddp: bool,
    manager: object | None,
    guard: str,
    consistency_every: int,
) -> None:
    """Raise ValueError, saying what to pass, for settings that would otherwise silently do nothing
    (``torchft_ddp``: ``ddp`` is torchft's DistributedDataParallel)."""
    if guard not in ("checksum", "none"):
        raise ValueError(f"guard={guard!r} is not a guard: pass guard='checksum' (with ddp=) or guard='none'")
    if consistency_every < 0:
        raise ValueError(
            f"consistency_every={consistency_every}: pass N >= 1 to compare the ranks every N steps, 0 for off"
        )
    if torchft_ddp and manager is None:
        raise ValueError(
            "ddp= is torchft's DistributedDataParallel, whose own comm hook reduces through its Manager: pass the "
            "Manager too: attach(model, optimizer=optimizer, manager=manager, ddp=ddp_model)"
        )
    if manager is not None:
        return
    if ddp is not None:
        if fsdp.is_fsdp1(ddp) or fsdp.is_fsdp2(ddp):
            fsdp.refuse(ddp, guard=guard)  # FSDP1 without the checksum guard is fine (chaos.injob.fsdp)
        elif not isinstance(ddp, nn.parallel.DistributedDataParallel):
            refuse_other_wrapper(ddp)
        return
    if guard == "checksum":
        raise ValueError(
            "guard='checksum' checks DDP's gradient all-reduce, so it needs the DDP-wrapped model: "
            "attach(model, optimizer=optimizer, ddp=ddp_model, guard='checksum') with "
            "ddp_model = DistributedDataParallel(model); or pass guard='none'"
        )
    grad = sorted({op.fault for op in plan.ops if op.injector == "grad_corrupt"})
    if grad:
        raise ValueError(
            f"the plan has grad_corrupt fault(s) {', '.join(grad)}: they corrupt a gradient bucket inside DDP's "
            "all-reduce, so attach needs the DDP-wrapped model: attach(model, optimizer=optimizer, ddp=ddp_model) "
            "with ddp_model = DistributedDataParallel(model); without it they would never fire"
        )


def refuse_other_wrapper(ddp: nn.Module) -> None:
    """ValueError for a ``ddp=`` that is not DistributedDataParallel, saying why and what to pass instead."""
    raise ValueError(
        f"ddp= is a {type(ddp).__name__}, not DistributedDataParallel: the agent works inside DDP's gradient "
        "all-reduce (a DDP comm hook), or torchft's (pass manager=); pass the DDP-wrapped model, or leave ddp= out "
        "(no checksum guard, grad_corrupt or allreduce-phase faults then)"
    )
