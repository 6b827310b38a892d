"""The in-job agent: the part of mlchaos that lives inside the training process.

A training script opts in with one line after it builds its model and optimizer, and changes nothing in its
loop (the agent follows the loop through hooks on the module and the optimizer, :mod:`chaos.injob.loop_hooks`)::

    agent = chaos.agent.attach(model, optimizer, ddp=ddp_model)

A loop that needs to say where its steps are (gradient accumulation over several optimizers, a step that is
not one optimizer step) makes the calls itself; the first one removes the hooks::

    agent = chaos.agent.attach(model, optimizer=optimizer, ddp=ddp_model, guard="checksum", anomaly=True)
    for step in range(start, steps + 1):
        agent.begin_step(step)                      # weight/activation faults due now fire here
        loss = loss_fn(ddp_model(x), y)
        loss.backward()                             # DDP all-reduce: gradient faults + checksum guard here
        agent.after_backward(loss)                  # gradient-phase faults; anomaly guard
        if agent.allow_optimizer_step():            # False when the guards agreed to skip this step
            optimizer.step()
        agent.end_step()
    agent.close()                                   # heals every in-job fault (undoes only its change)

The harness hands the agent its faults in a JSON plan (env ``CHAOS_PLAN``) and reads what happened from the
event file (env ``CHAOS_EVENTS``). Without ``CHAOS_PLAN`` no fault is armed, but the guards still run, so a
golden run and a faulted run execute the same numerics. Faults fire at exact (rank, step, phase) points:
``forward`` (before the forward pass), the collective sites ``local`` / ``in_transit`` / ``post_reduce``
(inside the gradient all-reduce), ``backward`` (after it) and ``optimizer_step``. A ``kill`` with a
``trigger.phase`` fires on this rank's own process at ``forward``, ``allreduce`` (the bucket's all-reduce
started, not yet waited for), ``backward`` or ``optimizer_step`` (:mod:`chaos.injob.phase_faults`); so does a
``crash`` at its ``phase`` param: an exception, a SIGSEGV or a SIGABRT (:mod:`chaos.injob.crash_faults`). A
``collective_fault`` fails the step's ``index``-th collective this rank calls through ``torch.distributed``, or
aborts its process groups just before it, and the process lives on (:mod:`chaos.injob.collective_faults`).

With ``CHAOS_EVENTS`` set the agent also reports what the training checks need, with no other line in the loop
(:mod:`chaos.injob.progress`): ``target.start`` {pid, attempt} at attach, ``target.step`` {step, loss, samples}
at ``end_step``, ``target.checkpoint``/``target.resume`` from the ``torch.save``/``torch.load`` of the model's
state it sees (or ``agent.checkpoint_saved``/``agent.resumed``) and the loop's first step, ``target.digest`` at
``close``. Pass the DataLoader once (``attach(..., data=loader)``) for sample ids; a job that reports some of
these itself says which (``job_emits=``).

With ``CHAOS_FLIGHT_DIR`` set (a target's ``hang_watch:``) the agent keeps the collective flight recorder the
harness reads to name a hung job's culprit rank (:mod:`chaos.injob.flight_recorder`; it then runs DDP's
gradient all-reduce through its comm hook, DDP's default reduction), and fires the ``spin`` and
``skip_collective`` hang faults (:mod:`chaos.injob.hang_faults`).

A fault fires once per run even across torchrun restarts: the agent leaves a marker in ``CHAOS_RUN_DIR`` so a
recomputed step after a restart does not re-inject a transient fault.

The cross-rank consistency guard (:mod:`chaos.guards.consistency`) is on by default in a distributed job of
more than one rank: every ``consistency_every`` steps (10; 0 turns it off) ``end_step`` hashes the parameters
and compares the digests across the ranks (``detect.divergence``, ``detect.nonfinite``; the verdict arrives one
``end_step`` later, or at ``close``). It is a collective at the steps divisible by N and at ``close``, so every
rank must call ``end_step`` for the same steps and then ``close`` (lockstep data parallel); a loop whose ranks
run different numbers of steps (uneven inputs) must pass ``consistency_every=0``.

What it attaches to (``ddp=``, the data-parallel wrapper the loop calls):

- ``DistributedDataParallel``, on the default process group or any other (``process_group=`` of DDP): the
  comm hook, the checksum guard, the consistency guard and the anomaly guard's exchange all run on the DDP
  module's own group; events name global ranks.
- torchft: ``attach(model, optimizer=optimizer, manager=manager, ddp=ddp)`` with torchft's Manager and
  DistributedDataParallel. torchft's DDP owns the comm hook, so the agent sits in ``manager.allreduce``
  (:mod:`chaos.guards.torchft`); a detected SDC is reported with ``manager.report_error`` so this replica
  does not commit the step. The one line drives the loop through torchft's commit vote (:mod:`chaos.injob.loop_hooks`);
  explicit calls: ``begin_step(manager.current_step() + 1)``, ``optimizer.step()`` every step (under torchft the agent
  never vetoes a step, it reports an error instead). ``target.step`` carries torchft's step, ``committed``, ``participants``.
- FSDP1 (``FullyShardedDataParallel``, as ``ddp=``): faults inside its reduce-scatter (grad_corrupt, phase
  allreduce) through FSDP1's comm hook; the checksum guard and FSDP2 (``fully_shard``, no comm hook) are refused
  at attach, saying why (:mod:`chaos.injob.fsdp`); no consistency check (the ranks hold different shards).
- PyTorch Lightning: :class:`chaos.integrations.lightning.ChaosCallback` makes these calls for the Trainer.

Misuse is refused at attach with a ``ValueError`` that says what to pass: ``guard="checksum"`` without ``ddp=``
or ``manager=``, a plan with a ``grad_corrupt`` fault without either (both live in the gradient all-reduce, and
would otherwise silently do nothing), torchft's DDP without its ``manager=``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Literal

import torch
import torch.distributed as dist
from torch import nn
from torch._C._distributed_c10d import GradBucket

from chaos import events
from chaos.event_kinds import TARGET_STEP_SKIPPED
from chaos.guards import digest_carrier
from chaos.guards import torchft as ft
from chaos.guards.anomaly import GradAnomalyGuard
from chaos.guards.checksum import ChecksumConfig, ChecksumState, checksum_hook
from chaos.guards.consistency import DEFAULT_EVERY, ConsistencyGuard
from chaos.guards.settings import Guards
from chaos.injob import flight_recorder, fsdp
from chaos.injob.attach_rules import refuse_misuse
from chaos.injob.collective_faults import COLLECTIVE_FAULT, CollectiveFaults
from chaos.injob.crash_faults import CrashFaults
from chaos.injob.fault_events import FiringRules
from chaos.injob.hang_faults import HANG_FAULTS, SKIP, HangFaults
from chaos.injob.loop_hooks import LoopCalls, LoopHooks, hook_names
from chaos.injob.phase_faults import PhaseFaults, in_this_replica
from chaos.injob.progress import JobEmits, Progress, ProgressCalls
from chaos.injob.rank_faults import RankFaults
from chaos.plan.agent_plan import InJobPlan, JsonValue, load_plan

Emit = Callable[..., None]


def _rank_and_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def _ddp_group(ddp: nn.Module | None) -> dist.ProcessGroup | None:
    """The process group DDP reduces over (``process_group=`` of DDP; the default group when none was given)."""
    if not isinstance(ddp, nn.parallel.DistributedDataParallel) or ft.is_torchft_ddp(ddp):
        return None
    group = getattr(ddp, "process_group", None)
    return group if isinstance(group, dist.ProcessGroup) else None


def _global_ranks(emit: Emit, group: dist.ProcessGroup | None) -> Emit:
    """``emit`` with a guard's ``rank=`` (its rank inside ``group``) turned into the global rank."""
    if group is None or group == dist.GroupMember.WORLD:
        return emit

    def translated(kind: str, **data: object) -> None:
        rank = data.get("rank")
        if isinstance(rank, int):
            data["rank"] = dist.get_global_rank(group, rank)
        emit(kind, **data)

    return translated


class Agent(ProgressCalls):
    """Fires this rank's planned faults, runs the guards, and reports both, and training progress, as events."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        ddp: nn.Module | None = None,
        manager: ft.Manager | None = None,
        guard: Literal["checksum", "none"] = "none",
        checksum: ChecksumConfig | None = None,
        anomaly: bool = False,
        consistency_every: int = DEFAULT_EVERY,
        consistency_optimizer: bool = False,
        plan: InJobPlan | None = None,
        emit: Emit = events.emit,
        data: object | None = None,
        job_emits: JobEmits = (),
        hooks: bool | Collection[str] = True,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.rank, self.world_size = _rank_and_world()
        self.emit = emit
        self.plan = plan if plan is not None else load_plan()
        ft_ddp = ddp is not None and ft.is_torchft_ddp(ddp)
        refuse_misuse(
            self.plan, ddp=ddp, torchft_ddp=ft_ddp, manager=manager, guard=guard, consistency_every=consistency_every
        )
        self.group = _ddp_group(ddp)  # the data-parallel group every guard's collective runs on
        self.manager = manager
        if consistency_optimizer and optimizer is None:
            raise ValueError("consistency_optimizer=True hashes the optimizer's state: pass optimizer= too")
        self.step = 0
        self._skip = False
        # This rank's ops, its cross-restart markers, and the tensor and gradient faults it fires itself.
        faults = self.faults = RankFaults(
            self.plan, model, optimizer, rank=self.rank, world_size=self.world_size, step=lambda: self.step, emit=emit
        )
        rules = FiringRules(
            faults.targets_me,
            self.rank,
            lambda: self.step,
            emit,
            faults.already_fired,
            faults.mark_fired,
            has_ddp=ddp is not None or manager is not None,
        )
        # process faults fired on this process at a phase (trigger.phase); crash: an exception, SIGSEGV or SIGABRT
        self.phase_faults, self.crash_faults = PhaseFaults(self.plan.ops, rules), CrashFaults(self.plan.ops, rules)
        self.hang_faults = HangFaults(  # spin / skip_collective on this rank (chaos.injob.hang_faults)
            [op for op in faults.mine if op.injector in HANG_FAULTS],
            rank=self.rank,
            step=lambda: self.step,
            emit=emit,
            already_fired=faults.already_fired,
            mark_fired=faults.mark_fired,
        )
        self.collective_faults = CollectiveFaults(self.plan.ops, rules)  # fired by the recorder's wrappers
        # Phases where any of this rank's faults can fire: the per-step hooks skip the fault dispatch at the others.
        self._fault_phases = (
            faults.tensor_phases | self.phase_faults.phases | self.hang_faults.phases | self.crash_faults.phases
        )
        # Whether a fault fires inside the gradient all-reduce (every rank then reduces through the comm hook).
        self._in_collective_wanted = self.phase_faults.in_collective_wanted or self.crash_faults.in_collective_wanted
        # The collective flight recorder (CHAOS_FLIGHT_DIR; a skip or collective fault needs its wrappers anyway).
        wrappers_wanted = self.hang_faults.wants_skips or self.collective_faults.wanted
        self.recorder = flight_recorder.install(self.rank, self.world_size, _skip_dir(wrappers_wanted))
        if self.recorder is not None:
            self.hang_faults.arm(self.recorder)
            self.collective_faults.arm(self.recorder)
        self.checksum_state: ChecksumState | None = None
        self.torchft: ft.TorchftReduction | None = None
        self.fsdp: fsdp.FsdpReduction | None = None
        self._anomaly_requested = anomaly
        guard_emit = _global_ranks(emit, self.group)
        self.anomaly_guard = GradAnomalyGuard(model, emit=guard_emit, group=self.group) if anomaly else None
        sharded = ddp is not None and fsdp.is_fsdp1(ddp)
        if manager is not None:
            self._install_torchft(manager, guard, checksum)
        elif sharded and (faults.has_grad_faults or anomaly or self._in_collective_wanted):
            assert ddp is not None
            observe = None if self.anomaly_guard is None else self.anomaly_guard.observe
            self.fsdp = fsdp.FsdpReduction(ddp, corrupt=faults.corrupt, in_flight=self._in_flight, observe=observe)
        elif ddp is not None and not sharded:
            self._install_comm_hook(ddp, guard, checksum)
            if self.checksum_state is not None and self.anomaly_guard is not None:
                # The anomaly guard must see each rank's LOCAL gradients, i.e. inside the hook, pre-reduction.
                self.checksum_state.observe = self.anomaly_guard.observe
        # Decided from the job's shape, never from the plan: a golden run hashes (reads) exactly as a faulted one.
        # Under torchft the ranks of a replica group are not one data-parallel group (each group has its own
        # replicas), and FSDP's ranks hold different shards by design: no consistency check there.
        distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size(self.group) > 1
        self.consistency = (
            ConsistencyGuard(
                model,
                optimizer=optimizer,
                optimizer_state=consistency_optimizer,
                every=consistency_every,
                emit=emit,
                group=self.group,
            )
            if consistency_every > 0 and distributed and manager is None and not sharded
            else None
        )
        if self.consistency is not None and ddp is not None:  # its digest rides in the agent's hook, if there is one
            self.consistency.carrier = digest_carrier.install(ddp, self.group)
        # Last: the steps, checkpoints, resume, samples and digest the checks need (chaos.injob.progress).
        self.progress = Progress(
            model, optimizer, rank=self.rank, world_size=self.world_size, emit=emit, job_emits=job_emits, data=data
        )
        self.progress.digest_every = self.plan.digest_every
        if manager is not None:
            self.progress.step_fields = self._torchft_step
        # The one-line tier: the per-step calls made from hooks until the loop makes one itself (loop_hooks).
        self._hooks = (
            LoopHooks(
                LoopCalls(
                    self._begin_step,
                    lambda: self._after_backward(None),
                    self._allow_optimizer_step,
                    self._end_step,
                    self._close_at_exit,
                ),
                ddp if ddp is not None else model,
                optimizer,
                rank=self.rank,
                emit=emit,
                manager=manager,
                install=hook_names(hooks),
            )
            if hook_names(hooks) and optimizer is not None
            else None
        )

    # -- the collective ---------------------------------------------------------------------------------
    def _install_torchft(self, manager: ft.Manager, guard: str, checksum: ChecksumConfig | None) -> None:
        """In ``manager.allreduce`` (torchft's DDP hook calls it per bucket), under the same rule as the hook."""
        if guard == "checksum" or self.faults.has_grad_faults or self._anomaly_requested or self._in_collective_wanted:
            self.torchft = ft.TorchftReduction(
                manager,
                rank=self.rank,
                guard=guard == "checksum",
                config=checksum,
                emit=self.emit,
                corrupt=self.faults.corrupt,
                in_flight=self._in_flight,
                observe=None if self.anomaly_guard is None else self.anomaly_guard.observe,
            )
        self._torchft_from = manager.current_step()

    def _torchft_step(self) -> dict[str, JsonValue]:
        """``target.step`` under torchft: torchft's step after this one, whether it committed, participants."""
        assert self.manager is not None
        now = self.manager.current_step()
        return {"step": now, "committed": now > self._torchft_from, "participants": self.manager.num_participants()}

    def _install_comm_hook(self, ddp: nn.Module, guard: str, checksum: ChecksumConfig | None) -> None:
        """The checksum guard's hook, or (when faults or the anomaly guard need the local buckets) a plain
        all-reduce hook with the same injection points. Decided from the guard settings, not from the plan,
        wherever possible, so a golden run takes the same code path as the faulted run."""
        if guard == "checksum":
            config = checksum or ChecksumConfig()
            if config.emit is None:
                config.emit = self.emit
            state = ChecksumState(config, group=self.group)
            state.corrupt = self.faults.corrupt
            state.in_flight = self._in_flight
            self.checksum_state = state
            _register(ddp, state, checksum_hook)
        elif self._plain_hook_wanted():
            _register(ddp, self, _plain_hook)  # with the recorder on: so it sees the gradient all-reduce

    def _plain_hook_wanted(self) -> bool:
        """Whether the ranks reduce through :func:`_plain_hook`, decided alike on every rank from the whole plan
        and the job's settings: the consistency digest rides in that hook, so a rank without it would exchange on
        its own while the others carried, and the job would hang at the next check."""
        return (
            self._anomaly_requested
            or self._in_collective_wanted
            or self.recorder is not None  # CHAOS_FLIGHT_DIR (every rank), or this rank's skip fault (below)
            or any(
                op.injector in ("grad_corrupt", SKIP, COLLECTIVE_FAULT) and in_this_replica(op) for op in self.plan.ops
            )
        )

    def _in_flight(self, bucket_index: int) -> None:
        """Inside the comm hook, the bucket's all-reduce started and not yet waited for: the faults of phase
        ``allreduce`` (a kill or freeze, then a crash)."""
        self.phase_faults.in_collective(bucket_index)
        self.crash_faults.in_collective(bucket_index)

    # -- the loop hooks ---------------------------------------------------------------------------------
    def _take_over(self) -> None:
        """The loop makes the per-step calls itself: the one-line tier's hooks stand down for good."""
        if self._hooks is not None:  # (the hooks call the private halves, never these)
            self._hooks.remove()
            self._hooks = None

    def begin_step(self, step: int) -> None:
        """Call at the top of each step (1-based); fires weight/activation faults due at this step."""
        self._take_over()
        self._begin_step(step)

    def after_backward(self, loss: torch.Tensor | None = None) -> None:
        """Call after ``loss.backward()``: gradient-phase faults, then the anomaly guard."""
        self._take_over()
        self._after_backward(loss)

    def allow_optimizer_step(self) -> bool:
        """False when a guard (checksum after a failed retry, anomaly) agreed on every rank to skip this step.
        Always True under torchft (``manager=``): there a detection is reported to torchft, whose
        ``optimizer.step()`` then does not commit."""
        self._take_over()
        return self._allow_optimizer_step()

    def end_step(self) -> None:
        """Call at the end of each step (after the optimizer step): heals tensor faults whose persistence ran
        out, then, at every ``consistency_every``-th step, compares the ranks' parameters (a collective)."""
        self._take_over()
        self._end_step()

    def _begin_step(self, step: int) -> None:
        self.step = step
        if self.recorder is not None:
            self.recorder.begin_step(step)
        self._skip = False
        self.progress.begin_step(step)
        if self.checksum_state is not None:
            self.checksum_state.step = step
        if self.manager is not None:
            self._torchft_from = self.manager.current_step()
        if self.torchft is not None:
            self.torchft.begin_step(step)
        if self.fsdp is not None:
            self.fsdp.begin_step()
        if "forward" in self._fault_phases:
            self.faults.tensor_phase("forward")
            self.phase_faults.at("forward")
            self.hang_faults.at("forward")
            self.crash_faults.at("forward")

    def _after_backward(self, loss: torch.Tensor | None) -> None:
        self.progress.after_backward(loss)
        if "backward" in self._fault_phases:
            self.phase_faults.at("backward")
            self.hang_faults.at("backward")
            self.faults.tensor_phase("backward")
            self.crash_faults.at("backward")
        if self.anomaly_guard is not None:
            reasons = self.anomaly_guard.check(self.step, None if loss is None else float(loss.item()))
            if self.manager is not None:
                if reasons:  # torchft's error path: this replica does not commit the step
                    self.manager.report_error(RuntimeError(f"gradient anomaly at step {self.step}: {reasons}"))
                return
            flag = torch.tensor([1.0 if reasons else 0.0])
            if dist.is_available() and dist.is_initialized():
                dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)  # every rank skips, or none does
            if flag.item() > 0:
                self._skip = True

    def _allow_optimizer_step(self) -> bool:
        if "optimizer_step" in self._fault_phases:
            self.faults.tensor_phase("optimizer_step")
            self.phase_faults.at("optimizer_step")
            self.hang_faults.at("optimizer_step")
            self.crash_faults.at("optimizer_step")
        state = self.checksum_state
        if state is not None and state.consume_skip():
            self._skip = True
        if self._skip:
            self.emit(TARGET_STEP_SKIPPED, rank=self.rank, step=self.step)
        return not self._skip

    def _end_step(self) -> None:
        self.faults.heal_expired()
        if self.consistency is not None:
            # After the heal: what the ranks carry into the next step is what must agree. Pipelined: this
            # takes the verdict of the previous check and starts this step's exchange (see the guard).
            self.consistency.maybe_check(self.step)
        self.progress.end_step()

    def close(self) -> None:
        """Take the last consistency verdict (a collective when a check is in flight: every rank calls close),
        then heal every in-job fault still applied (only the fault's own change is undone); idempotent."""
        self._take_over()
        if self.consistency is not None:
            self.consistency.finish()
        self._close_at_exit()

    def _close_at_exit(self) -> None:
        """``close`` without the consistency guard's last exchange (the one-line tier's close at exit)."""
        self.faults.heal_all()
        if self.torchft is not None:
            self.torchft.close()
        self.progress.close()  # after the heal: the digest is of what training really produced


def _skip_dir(wanted: bool) -> str | None:
    """Where the recorder writes when only a skip or collective fault needs it (no CHAOS_FLIGHT_DIR): the run
    directory."""
    if not wanted or os.environ.get(flight_recorder.ENV_FLIGHT_DIR):
        return None
    return str(Path(os.environ.get("CHAOS_RUN_DIR") or "/tmp") / f"flight-{os.getpid()}")


def _register(ddp: nn.Module, state: object, hook: Callable[..., torch.futures.Future[torch.Tensor]]) -> None:
    """``ddp.register_comm_hook(state, hook)``; a wrapper without a DDP comm hook was refused at attach."""
    register = getattr(ddp, "register_comm_hook", None)
    assert register is not None
    register(state, hook)


def _plain_hook(agent: Agent, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's default all-reduce (divide, then sum) with the three corruption sites and no detection."""
    tensor = bucket.buffer()
    index = bucket.index()
    agent.faults.corrupt("local", index, tensor)
    if agent.anomaly_guard is not None:
        agent.anomaly_guard.observe(index, tensor)
    tensor.div_(dist.get_world_size(agent.group))
    agent.faults.corrupt("in_transit", index, tensor)
    carrier = None if agent.consistency is None else agent.consistency.carrier  # the consistency digest, clean
    sent = tensor if carrier is None else carrier.pack(index, tensor)
    work = dist.all_reduce(
        sent, group=agent.group, async_op=True
    )  # started, then waited: a phase fault fires in between
    assert work is not None
    agent._in_flight(index)
    work.wait()
    tensor = tensor if carrier is None else carrier.unpack(sent, tensor.numel())
    agent.faults.corrupt("post_reduce", index, tensor)
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(tensor)
    return future


# register_comm_hook checks the hook's ``bucket`` annotation by identity; postponed (string) annotations
# would fail that check, so the real objects are put back.
_plain_hook.__annotations__.update({"bucket": GradBucket, "return": torch.futures.Future[torch.Tensor]})


def attach(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    ddp: nn.Module | None = None,
    manager: ft.Manager | None = None,
    guard: Literal["checksum", "none"] | Guards = "none",
    data: object | None = None,
    job_emits: JobEmits = (),
    hooks: bool | Collection[str] = True,
) -> Agent:
    """Opt a training loop into mlchaos: arms this rank's planned faults and the chosen guards.

    With ``optimizer`` given, nothing else is needed in the loop (:mod:`chaos.injob.loop_hooks`): ``hooks``
    installs a forward pre-hook on ``ddp`` (else ``model``) that begins each step (``"forward"``), the optimizer's
    step pre- and post-hooks that run the backward and optimizer-step phases and end it (``"optimizer"``), a
    wrapper of torchft's commit vote (``"commit"``, with ``manager=``), ``atexit`` for the digest (``"atexit"``)
    and ``sys.excepthook`` reporting a collective failure as ``detect.*`` (``"excepthook"``): True for all, False
    for none, or the names to install. The loop's first explicit per-step call removes them all.

    ``guard``: ``"checksum"``, ``"none"`` or :class:`~chaos.guards.settings.Guards` (checksum, anomaly,
    the cross-rank consistency interval and whether it hashes the optimizer's state). ``data``: the job's
    DataLoader (or sampler), whose sample ids each ``target.step`` then reports; ``job_emits``: the progress
    events the job reports itself (``"all"``: none; see :mod:`chaos.injob.progress`). ``ddp``: the DDP-wrapped
    model (any process group); ``manager``: torchft's Manager (with torchft's DDP as ``ddp``).
    Raises ValueError for a checksum guard or a planned ``grad_corrupt`` fault without ``ddp=``/``manager=``,
    torchft's DDP without ``manager=``, or a ``ddp=`` the agent cannot work inside (said why).
    """
    guards = Guards.of(guard)
    return Agent(
        model,
        optimizer=optimizer,
        ddp=ddp,
        manager=manager,
        guard=guards.mode,  # type: ignore[arg-type]
        anomaly=guards.anomaly,
        checksum=guards.checksum_config,
        consistency_every=guards.consistency_every,
        consistency_optimizer=guards.consistency_optimizer,
        data=data,
        job_emits=job_emits,
        hooks=hooks,
    )


__all__ = ["Agent", "Guards", "attach"]
