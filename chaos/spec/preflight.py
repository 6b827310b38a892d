"""The one preflight: what a run would refuse before anything starts, found from the scenario alone.

``mlchaos validate`` and ``mlchaos run`` call :func:`preflight` on every scenario before running anything, and
the orchestrator calls it again (a scenario built in code, ``--nodes``), so ``validate`` refuses first whatever
``run`` would refuse. Each problem names the file:line of the offending key (when the scenario was read from a
file) and the fix. What needs the world is not here: the inventory (``--inventory``) and the kernel's
capabilities (:func:`capability_problems`, which ``validate`` runs for faults on this host and the orchestrator
runs on every host a fault may hit, through the same ``Injector.check``).

The rules, each one a fault that would otherwise fail when it fires, or never fire at all:

- an in-job fault (``bitflip``, ``grad_corrupt``) fires at a training step: its trigger is ``at_step``;
- a rank exists: ``rank`` in a fault's params, its trigger or ``hosts`` is below the job's world size where
  the spec fixes it (a torchrun target: ``nproc_per_node`` times its node count), and a host-side fault that
  selects a rank needs a target that reports ranks (torchrun);
- a ``replica`` selector names a replica of a serving target; an in-job fault on a serving target hits the
  rank of one of its replicas; an in-job fault never targets an ``http`` target (nobody we start runs there);
- a ``trigger.phase`` (the job's agent fires the fault on its own process at that point of the step) is for a
  ``kill`` of a torchrun job, selecting the process by ``rank`` (the rank that fires it; the trigger's ``rank``,
  if given, is the same), or of a roles target's replica (``replica``; the trigger's ``rank`` is inside it),
  without ``hosts:``; a ``freeze`` with a phase needs a duration (a thaw the agent starts continues it) and a
  ``slow`` with a phase is refused (a duty cycle spans many steps);
- ``hosts: {rank: R}`` and ``hosts: {role: rdzv_store}`` need a job spread over hosts (torchrun with ``nodes:``, or
  ``run --nodes``), as does a port named ``rdzv`` (a partition's ``ports``, a process fault's ``port``); any other
  port name is a roles target's role with a port;
- a host selection can be met: a named host is neither excluded nor protected, and ``count`` is within the
  blast radius;
- a one-shot fault (``kill``, ``container_kill``, ``container_restart``: ``one_shot`` on the injector) has no
  ``duration``, and a serving or http target's faults wait for nothing it never reports (a checkpoint, a
  resume; on an http target, a step);
- a fault that acts through a library preloaded into the job's processes (``clock``) has a target whose
  processes the harness starts on this machine (not http, slurm, or one on inventory hosts);
- a fault ends within the run: its ``duration`` is at most ``safety.max_duration``, an ``every`` trigger's last
  firing comes before it, and ``safety.heal_grace`` is at most :data:`MAX_HEAL_GRACE_S` (a dead-man fires
  that long after a fault's end, so a harness that died leaves the fault that much longer).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from chaos.cluster.base import Transport, TransportError
from chaos.event_kinds import (
    TARGET_CHECKPOINT,
    TARGET_DIGEST,
    TARGET_RESTORE,
    TARGET_RESUME,
    TARGET_STEP,
    TARGET_WORKER,
)
from chaos.plugins import registry
from chaos.plugins.injector import (
    RDZV_PORT,
    InjectionContext,
    InjectionError,
    JobEnv,
    Unsupported,
    is_in_job,
    is_one_shot,
    needs_duration,
)
from chaos.spec.problems import Path_, Problem
from chaos.spec.roles import RolesTarget
from chaos.spec.scenario import CommandTarget, FaultSpec, Scenario, TorchrunTarget
from chaos.spec.serving import FALLBACK, PRIMARY, REPLICA_RANKS, ServingTarget
from chaos.spec.slurm import SlurmTarget
from chaos.spec.targets import HttpTarget


@dataclass(frozen=True)
class Finding:
    """One thing a run would refuse: where (a path of YAML keys), what is wrong, and the fix."""

    path: Path_
    message: str
    hint: str = ""


def preflight(scenario: Scenario) -> list[Problem]:
    """Every problem a run of ``scenario`` (as it will run: after ``--nodes``) would refuse before starting,
    in file order, each at the file:line of its key (see :meth:`Scenario.located`). Empty when it may run."""
    return _problems(scenario, list(findings(scenario)))


def findings(scenario: Scenario) -> Iterator[Finding]:
    """The rules of the module docstring, each broken one as a :class:`Finding` (a path, not a position)."""
    for index, fault in enumerate(scenario.faults):
        yield from _fault(scenario, index, fault)
        yield from _within_the_run(scenario, fault, ("faults", index))
    yield from _hang(scenario)
    if scenario.safety.heal_grace > MAX_HEAL_GRACE_S:
        yield Finding(
            ("safety", "heal_grace"),
            f"heal_grace {scenario.safety.heal_grace:.0f}s: a fault left by a harness that died would stay that long "
            "past its end before its dead-man heals it",
            f"use at most {MAX_HEAL_GRACE_S:g}s (the default, 5s, suits most faults)",
        )


MAX_HEAL_GRACE_S = 600.0


def _within_the_run(scenario: Scenario, fault: FaultSpec, at: Path_) -> Iterator[Finding]:
    """A fault's duration and an ``every`` trigger's last firing fit in ``safety.max_duration``."""
    limit = scenario.safety.max_duration
    if fault.duration is not None and fault.duration > limit:
        yield Finding(
            (*at, "duration"),
            f"fault {fault.name!r} lasts {fault.duration:g}s, longer than the whole run (safety.max_duration "
            f"{limit:g}s): the run would end, and heal it, first",
            "shorten the duration, or raise safety.max_duration",
        )
    every = fault.trigger.every
    if every is not None:
        last = (every.interval if every.start is None else every.start) + every.interval * (every.count - 1)
        if last > limit:
            yield Finding(
                (*at, "trigger", "every", "count"),
                f"fault {fault.name!r} fires {every.count} times every {every.interval:g}s, the last at +{last:g}s, "
                f"after the run's end (safety.max_duration {limit:g}s)",
                f"fire at most {max(1, int((limit - (every.start if every.start is not None else every.interval)) // every.interval) + 1)} "
                "times, or raise safety.max_duration",
            )


def refusal(problems: list[Problem]) -> str:
    """The problems as one refusal text (a run's ``error``), one problem with its fix per line."""
    return "\n".join(str(problem) for problem in problems)


def capability_problems(scenario: Scenario, transport: Transport) -> list[Problem]:
    """``Injector.check`` of every fault that lands on the host ``transport`` reaches (this machine, for
    ``validate``): the kernel features, tools and permissions a fault needs. Faults aimed at inventory hosts
    (``hosts:``, or a rank of a job spread over hosts) are left to the run, which probes every host."""
    found: list[Finding] = []
    target = _stand_in(scenario)
    for index, fault in enumerate(scenario.faults):
        rank = getattr(fault.params, "rank", None)
        if fault.hosts is not None or (_spread(scenario) and isinstance(rank, int)):
            continue  # an inventory host, or the host that runs a rank of a job spread over hosts
        injector = registry.injector(fault.type)
        try:
            injector.check(InjectionContext(transport, target=target), fault.params)
        except Unsupported as exc:
            found.append(Finding(("faults", index, "type"), unsupported(fault, exc), _CAPABILITY_FIX))
        except (InjectionError, TransportError) as exc:
            found.append(
                Finding(("faults", index, "type"), f"fault {fault.name!r} ({fault.type}): {exc}", _CAPABILITY_FIX)
            )
    return _problems(scenario, found)


def unsupported(fault: FaultSpec, exc: Exception) -> str:
    """The refusal of a fault whose injector's ``check`` said no (the same words from validate and run)."""
    return f"fault {fault.name!r} ({fault.type}) is not supported here: {exc}"


_CAPABILITY_FIX = "run where the fault is supported, or aim it at inventory hosts that have what it needs"


def _problems(scenario: Scenario, found: list[Finding]) -> list[Problem]:
    problems = []
    for finding in found:
        file, line, column = scenario.located(finding.path)
        where = ".".join(str(part) for part in finding.path)
        problems.append(Problem(file, line, column, f"{where}: {finding.message}", finding.hint))
    return sorted(problems, key=lambda p: (p.file, p.line, p.column))


# ---------------------------------------------------------------------------------------------------------
# The rules.


def _fault(scenario: Scenario, index: int, fault: FaultSpec) -> Iterator[Finding]:
    at: Path_ = ("faults", index)
    in_job = is_in_job(registry.injectors()[fault.type])
    target = scenario.target
    if in_job and fault.trigger.at_step is None:
        yield Finding(
            (*at, "trigger", fault.trigger.kind),
            f"fault {fault.name!r} ({fault.type}) is applied inside the job at a training step, so it needs an "
            f"at_step trigger (got {fault.trigger.kind})",
            "use trigger: {at_step: N, rank: R}",
        )
    if needs_duration(registry.injectors()[fault.type]) and fault.duration is None:
        yield Finding(
            (*at, "type"),
            f"fault {fault.name!r} ({fault.type}) holds its target until a deadline, so it needs a duration "
            "(without one it would be refused when it fires, after the run started)",
            "add `duration: 20s` (or how long it should last) to the fault",
        )
    if is_one_shot(registry.injectors()[fault.type]) and fault.duration is not None:
        yield Finding(
            (*at, "duration"),
            f"fault {fault.name!r} ({fault.type}) happens once and holds nothing, so a duration would change nothing",
            "drop duration (a held fault: freeze, container_stop, partition ... takes one)",
        )
    if isinstance(target, (ServingTarget, HttpTarget)) and (kind := _training_event(fault, target)) is not None:
        yield Finding(
            (*at, "trigger", fault.trigger.kind),
            f"fault {fault.name!r} waits for {kind}, which a {target.type} target never reports: it would never fire",
            "trigger it by time (after: 10s) or on an event the target reports (load.request, serving.*)",
        )
    if in_job and isinstance(target, HttpTarget):
        yield Finding(
            (*at, "type"),
            f"fault {fault.name!r} ({fault.type}) is applied inside the job, but an http target is a service "
            "the harness did not start: no agent of ours runs in it",
            "use a fault applied from outside (kill, partition, delay ...) or a target the harness starts",
        )
    ranks = [(path, rank) for path, rank in fault_ranks(fault, at) if rank is not None]
    rank_param = getattr(fault.params, "rank", None)
    if not in_job and isinstance(rank_param, int) and not isinstance(target, (TorchrunTarget, SlurmTarget)):
        hint = (
            "select the process by replica, pid or name"
            if isinstance(target, ServingTarget)
            else "select the process by pid or name"
        )
        yield Finding(
            (*at, "params", "rank"),
            f"fault {fault.name!r} selects rank {rank_param}, but a {target.type} target does not report ranks",
            hint,
        )
    size = world_size(scenario)
    if size is not None:
        for path, rank in ranks:
            if rank >= size:
                yield Finding(
                    path,
                    f"rank {rank} does not exist: the job runs {size} rank(s), 0..{size - 1}",
                    "aim at a rank below the world size (nproc_per_node x nodes), or run more ranks",
                )
    if in_job and isinstance(target, ServingTarget):
        served = {REPLICA_RANKS[name]: name for name in _replicas(target)}
        for path, rank in ranks:
            if rank not in served:
                yield Finding(
                    path,
                    f"rank {rank} runs no replica of this serving target (ranks: "
                    + ", ".join(f"{r} = {n}" for r, n in sorted(served.items()))
                    + ")",
                    "aim at the rank of a configured replica",
                )
    yield from _replica(target, fault, at)
    yield from _through_the_job(scenario, fault, at)
    yield from _hosts(scenario, fault, at)
    yield from _named_ports(scenario, fault, at)
    yield from _phase(scenario, fault, at)


def _training_event(fault: FaultSpec, target: object) -> str | None:
    """The training progress a fault's trigger waits for that ``target`` never reports, or None: an http target
    (nothing of ours runs in it) reports no step at all; a serving target's model servers count inferences as
    steps, but nothing checkpoints, resumes or restarts a worker there."""
    never = TRAINING_EVENTS if isinstance(target, HttpTarget) else TRAINING_EVENTS[2:]
    if fault.trigger.at_step is not None and isinstance(target, HttpTarget):
        return "a training step"
    event = fault.trigger.on_event
    return f"event {event.kind}" if event is not None and event.kind in never else None


# What a training job reports (the kinds a trigger names exactly); the first two a serving target reports too.
TRAINING_EVENTS = (TARGET_STEP, TARGET_DIGEST, TARGET_CHECKPOINT, TARGET_RESTORE, TARGET_RESUME, TARGET_WORKER)


# Hang faults (injectors.hang) fire in the agent of a training rank; culprit_named judges the hang watch's events.
HANG_FAULTS = ("spin", "skip_collective")
# So does a failed or aborted collective (injectors.collective): at a torch.distributed call of a training rank.
RANK_COLLECTIVE_FAULTS = (*HANG_FAULTS, "collective_fault")


def _hang(scenario: Scenario) -> Iterator[Finding]:
    target = scenario.target
    if not (isinstance(target, TorchrunTarget) and target.hang_watch is not None):
        for index, check in enumerate(scenario.checks):
            if check.type == "culprit_named":
                yield Finding(
                    ("checks", index, "type"),
                    "check culprit_named judges detect.hang, which the hang watch of a torchrun target raises, "
                    f"and this {target.type} target has none: it could never pass",
                    "add hang_watch: {hang_after: 3s} to the torchrun target (its script must attach the agent)",
                )
    for index, fault in enumerate(scenario.faults):
        if fault.type in RANK_COLLECTIVE_FAULTS and not isinstance(target, (TorchrunTarget, CommandTarget)):
            yield Finding(
                ("faults", index, "type"),
                f"fault {fault.name!r} ({fault.type}) is fired by the agent of a training rank, and a {target.type} "
                "target runs no training ranks of a script that attaches it",
                "use a torchrun (or command) target whose script calls chaos.agent.attach",
            )


# The faults a job's own agent can fire at a trigger phase (chaos.injob.phase_faults.PROCESS_FAULTS; the spec
# may not import the in-job package, so the name is repeated here and a unit test holds the two equal).
PHASE_FAULTS = ("kill", "freeze")


def _phase(scenario: Scenario, fault: FaultSpec, at: Path_) -> Iterator[Finding]:
    """``trigger.phase``: a kill of a torchrun rank, selected by rank, fired by that rank's own agent."""
    phase = fault.trigger.phase
    if phase is None:
        return
    where: Path_ = (*at, "trigger", "phase")
    if fault.type == "slow":
        yield Finding(
            where,
            f"fault {fault.name!r} (slow) cannot fire at a phase: a duty cycle of stops spans many steps, not a "
            "point inside one",
            "drop phase (trigger: {at_step: N, rank: R} starts the duty cycle at that step), or use type: freeze "
            "with a duration for one stop at the phase",
        )
        return
    if fault.type == "freeze" and fault.duration is None:
        yield Finding(
            (*at, "duration"),
            f"fault {fault.name!r} freezes a rank at phase {phase}: the rank stops itself and a thaw continues it "
            "when the duration has passed, so it needs one",
            "add duration: (e.g. duration: 12s)",
        )
        return
    if fault.type not in PHASE_FAULTS:
        in_job = is_in_job(registry.injectors()[fault.type])
        yield Finding(
            where,
            f"fault {fault.name!r} ({fault.type}) cannot fire at a trigger phase: only "
            f"{', '.join(PHASE_FAULTS)} is fired by the job's agent at a point inside the step",
            "set the point with the fault's own params (bitflip: phase, grad_corrupt: site) and drop trigger.phase"
            if in_job
            else "drop trigger.phase",
        )
        return
    kind = getattr(scenario.target, "type", "?")
    if kind == "roles":
        # A replica of a roles target (e.g. a torchft replica group, its own torchrun): its agent fires the
        # fault when CHAOS_REPLICA names it, on the trigger's rank inside that replica (default 0).
        replica = getattr(fault.params, "replica", None)
        if not isinstance(replica, str):
            yield Finding(
                (*at, "params"),
                f"fault {fault.name!r} fires at phase {phase} inside one replica of a roles target, so it must "
                "select that replica",
                f"use params: {{replica: NAME}} and trigger: {{at_step: N, rank: R, phase: {phase}}} (R: the rank "
                "inside that replica, default 0)",
            )
            return
        role = getattr(scenario.target, "roles", {}).get(replica.split(".")[0])
        if role is not None and getattr(role, "torchrun", None) is None:
            yield Finding(
                where,
                f"fault {fault.name!r} fires at phase {phase} from inside replica {replica!r}, but its role runs a "
                "command, not a torchrun job with the agent attached",
                "aim at a replica of a torchrun role, or drop trigger.phase",
            )
        return
    if not isinstance(scenario.target, TorchrunTarget):
        yield Finding(
            where,
            f"fault {fault.name!r} fires at phase {phase} from inside the job, but a {kind} target runs no "
            "training loop with the agent attached (only a torchrun target's ranks, or a roles target's, do)",
            "use a torchrun target whose script calls chaos.agent.attach, or drop trigger.phase",
        )
    selected = getattr(fault.params, "rank", None)
    if not isinstance(selected, int):
        yield Finding(
            (*at, "params"),
            f"fault {fault.name!r} fires at phase {phase} on the rank that hits itself, so it must select the "
            "process by rank (not pid, name or replica)",
            f"select it with params: {{rank: R}} and trigger: {{at_step: N, rank: R, phase: {phase}}}",
        )
    elif fault.trigger.rank is not None and fault.trigger.rank != selected:
        yield Finding(
            (*at, "trigger", "rank"),
            f"fault {fault.name!r} kills rank {selected} at phase {phase}, fired by that rank's own agent, so the "
            f"trigger's rank must be {selected} too (got {fault.trigger.rank})",
            f"use trigger: {{at_step: {fault.trigger.at_step}, rank: {selected}, phase: {phase}}}",
        )
    if fault.hosts is not None:
        yield Finding(
            (*at, "hosts"),
            f"fault {fault.name!r} fires at phase {phase} inside the rank's own process, wherever it runs: "
            "hosts: selects nothing here",
            "drop hosts: (the rank decides the host)",
        )


def fault_ranks(fault: FaultSpec, at: Path_) -> Iterator[tuple[Path_, int | None]]:
    """Every rank the fault names, with the path of its key: its params', its trigger's, its hosts'."""
    rank_param = getattr(fault.params, "rank", None)
    if isinstance(rank_param, int) and not isinstance(rank_param, bool):
        yield (*at, "params", "rank"), rank_param
    yield (*at, "trigger", "rank"), fault.trigger.rank
    if fault.trigger.on_event is not None:
        yield (*at, "trigger", "on_event", "rank"), fault.trigger.on_event.rank
    if fault.hosts is not None:
        yield (*at, "hosts", "rank"), fault.hosts.rank


def world_size(scenario: Scenario) -> int | None:
    """The number of ranks the job runs when its spec fixes it (a torchrun target on this host, on one named
    node, or on ``count`` nodes); None when it depends on an inventory or on the job itself."""
    target = scenario.target
    if not isinstance(target, TorchrunTarget):
        return None
    nodes = target.nodes
    if nodes is None or nodes.host is not None:
        return target.nproc_per_node
    return nodes.count * target.nproc_per_node if nodes.count is not None else None


def _replicas(target: ServingTarget) -> list[str]:
    return [PRIMARY] + ([FALLBACK] if target.fallback is not None else [])


def _replica(target: object, fault: FaultSpec, at: Path_) -> Iterator[Finding]:
    replica = getattr(fault.params, "replica", None)
    if not isinstance(replica, str):
        return
    if isinstance(target, RolesTarget):
        if replica not in target.replica_names():
            yield Finding(
                (*at, "params", "replica"),
                f"no replica named {replica!r}; this target has {', '.join(target.replica_names())}",
                "use one of: " + ", ".join(target.replica_names()),
            )
    elif not isinstance(target, ServingTarget):
        yield Finding(
            (*at, "params", "replica"),
            f"fault {fault.name!r} selects replica {replica!r}, but a {getattr(target, 'type', '?')} target has "
            "no replicas (only a roles or serving target has)",
            "select the process by rank, pid or name",
        )
    elif replica not in _replicas(target):
        known = _replicas(target)
        yield Finding(
            (*at, "params", "replica"),
            f"no replica named {replica!r}; this target has {', '.join(known)}",
            "use one of: " + ", ".join(known),
        )


def _through_the_job(scenario: Scenario, fault: FaultSpec, at: Path_) -> Iterator[Finding]:
    """A fault that acts through the job's own processes (an injector with ``job_env``: the clock shim, preloaded)
    needs a target whose processes the harness starts on this machine, where it gives them that environment."""
    if not isinstance(registry.injector(fault.type), JobEnv):
        return
    target = scenario.target
    if isinstance(target, HttpTarget):
        why = "is a service the harness did not start"
    elif isinstance(target, SlurmTarget):
        why = "runs its processes on the cluster's nodes"
    elif _spread(scenario) or (isinstance(target, RolesTarget) and target.hosts()):
        why = "runs processes on inventory hosts"
    else:
        return
    yield Finding(
        (*at, "type"),
        f"fault {fault.name!r} ({fault.type}) acts through a library preloaded into the processes the harness "
        f"starts on this machine, and this {target.type} target {why}",
        "use a torchrun (without nodes:), command, roles (without host:) or serving target",
    )


def _spread(scenario: Scenario) -> bool:
    """True when the job runs on inventory hosts (a torchrun target with ``nodes:``)."""
    return isinstance(scenario.target, TorchrunTarget) and scenario.target.nodes is not None


def _named_ports(scenario: Scenario, fault: FaultSpec, at: Path_) -> Iterator[Finding]:
    """A port given by name (``ports:`` of a network fault, ``port:`` of a process fault): ``rdzv`` is a multi-node
    torchrun job's rendezvous store's (no other target has one), any other name a roles target's role with a port
    (a serving target's: primary, fallback)."""
    port = getattr(fault.params, "port", None)
    target = scenario.target
    roles: list[str] = []
    if isinstance(target, RolesTarget):
        roles = [r for r, spec in target.roles.items() if spec.port is not None]
    elif isinstance(target, ServingTarget):  # the reference stack: each model server on its own port
        roles = [PRIMARY] + ([FALLBACK] if target.fallback is not None else [])
    for name in [p for p in [*getattr(fault.params, "ports", []), port] if isinstance(p, str)]:
        key = "port" if port == name else "ports"
        if name in roles:
            continue
        if name == RDZV_PORT and not _spread(scenario):
            yield Finding(
                (*at, "params", key),
                f"port rdzv is a multi-node torchrun job's rendezvous store, but this {target.type} target has none",
                "give the torchrun target nodes: (or run with --nodes), or give the port's number",
            )
        elif name != RDZV_PORT:
            yield Finding(
                (*at, "params", key),
                f"port {name!r} names no port of this {target.type} target (rdzv, or a roles target's role with a "
                "port)",
                f"name a role with a port ({', '.join(roles)})" if roles else "give the port's number",
            )


def _hosts(scenario: Scenario, fault: FaultSpec, at: Path_) -> Iterator[Finding]:
    hosts = fault.hosts
    if hosts is None:
        return
    if hosts.rank is not None and not _spread(scenario):
        yield Finding(
            (*at, "hosts", "rank"),
            f"hosts: {{rank: {hosts.rank}}} means the host running that rank, but this job runs on one host",
            "give the torchrun target nodes: (or run with --nodes), or select hosts by host, group or count",
        )
    if hosts.role is not None and not _spread(scenario):
        yield Finding(
            (*at, "hosts", "role"),
            f"hosts: {{role: {hosts.role}}} is the host of a multi-node torchrun job's rendezvous store, but this "
            f"{scenario.target.type} target has none on an inventory host",
            "give the torchrun target nodes: (or run with --nodes), or select hosts by host, group or count",
        )
    if hosts.slurm is not None and not isinstance(scenario.target, SlurmTarget):
        yield Finding(
            (*at, "hosts", "slurm"),
            f"hosts: {{slurm: {hosts.slurm}}} means nodes of a Slurm job, but this is a {scenario.target.type} target",
            "give the scenario a slurm target, or select hosts by host, group or count",
        )
    if hosts.host is not None and hosts.host in hosts.exclude:
        yield Finding(
            (*at, "hosts", "exclude"),
            f"host {hosts.host!r} is both selected and excluded",
            "drop it from exclude (or select another host)",
        )
    if hosts.host is not None and hosts.host in scenario.cluster.protected:
        yield Finding(
            (*at, "hosts", "host"),
            f"host {hosts.host!r} is protected (cluster.protected) and cannot be targeted",
            "aim at another host, or remove it from cluster.protected",
        )
    radius = scenario.safety.blast_radius
    if hosts.count is not None and radius is not None and hosts.count > radius:
        yield Finding(
            (*at, "hosts", "count"),
            f"count {hosts.count} is more hosts than the blast radius of {radius} allows",
            "lower count, or raise safety.blast_radius",
        )


# ---------------------------------------------------------------------------------------------------------
# What an injector's check may ask of the target before one exists.


class _PlannedReplicas:
    """A serving target's replicas as its spec names them (what ``check`` asks; no process exists yet)."""

    def __init__(self, names: list[str]) -> None:
        self._names = names

    def replicas(self) -> list[str]:
        return list(self._names)

    def pids_for_replica(self, name: str) -> list[int]:
        return []


class _PlannedRanks:
    """A torchrun target's ranks as its spec fixes them (empty when an inventory decides)."""

    def __init__(self, size: int | None) -> None:
        self._size = size or 0

    def ranks(self) -> list[int]:
        return list(range(self._size))

    def pids_for_rank(self, rank: int) -> list[int]:
        return []


def _stand_in(scenario: Scenario) -> _PlannedReplicas | _PlannedRanks | None:
    target = scenario.target
    if isinstance(target, ServingTarget):
        return _PlannedReplicas(_replicas(target))
    if isinstance(target, RolesTarget):
        return _PlannedReplicas(target.replica_names())
    if isinstance(target, TorchrunTarget):
        return _PlannedRanks(world_size(scenario))
    return None
