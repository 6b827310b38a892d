"""The job object for a scenario's ``target:`` spec: the one place that maps a target type to its class, and
answers the few questions the runner has about a target spec before any job exists."""

from __future__ import annotations

from pathlib import Path

from chaos.cluster.hosts import RDZV_STORE, HostSet
from chaos.cluster.local import LocalTransport
from chaos.spec.roles import RolesTarget
from chaos.spec.scenario import HostSelector, Scenario, TorchrunTarget
from chaos.spec.serving import ServingTarget
from chaos.spec.slurm import SlurmTarget
from chaos.spec.targets import HttpTarget
from chaos.targets import interpreter
from chaos.targets.base import Target
from chaos.targets.command import CommandJob
from chaos.targets.http import HttpJob
from chaos.targets.role_hosts import RoleHost
from chaos.targets.roles import RolesJob, ServingRolesJob
from chaos.targets.serving_stack import ServingJob
from chaos.targets.torchrun import TorchrunJob
from chaos.targets.torchrun_nodes import MultiNodeTorchrunJob, Node


class TargetSpecError(ValueError):
    """A run option does not fit the scenario's target (e.g. ``--nodes`` for a target that is not torchrun)."""


def make_target(
    scenario: Scenario, transport: LocalTransport, run_dir: Path, seed: int, extra_env: dict[str, str], hosts: HostSet
) -> Target:
    """A not-yet-started job for ``scenario.target``: multi-node torchrun on the inventory's job nodes, local
    torchrun, the reference serving stack, an existing HTTP endpoint (started by nobody), or a command.
    ``extra_env`` reaches every process the job starts (e.g. the in-job agent's plan file)."""
    spec = scenario.target
    if isinstance(spec, TorchrunTarget) and spec.nodes is not None:
        nodes = [Node(name, address, hosts.transport(name)) for name, address in hosts.job_nodes(spec.nodes, seed)]
        store = None
        if spec.rdzv_host is not None:  # etcd-v2: the user's etcd on its own inventory host
            name, address = hosts.job_nodes(spec.rdzv_host, seed)[0]
            store = Node(name, address, hosts.transport(name))
        job = MultiNodeTorchrunJob(spec, nodes, run_dir, seed, extra_env, store)
        hosts.roles[RDZV_STORE] = job.store.name  # hosts: {role: rdzv_store}
        return job
    if isinstance(spec, TorchrunTarget):
        return TorchrunJob(spec, transport, run_dir, seed, extra_env)
    if isinstance(spec, ServingTarget):
        return ServingJob(spec, transport, run_dir, seed, extra_env)
    if isinstance(spec, HttpTarget):
        return HttpJob(spec)
    if isinstance(spec, SlurmTarget):
        return _slurm_job(scenario, spec, run_dir, seed, extra_env, hosts)
    if isinstance(spec, RolesTarget):
        kind = RolesJob if spec.url is None else ServingRolesJob
        placement = {name: RoleHost(name, hosts.address(name), hosts.transport(name)) for name in spec.hosts()}
        source = scenario.located(())[0]
        scenario_dir = Path(source).resolve().parent if not source.startswith("<") else None
        return kind(spec, transport, run_dir, seed, extra_env, placement, scenario_dir)
    return CommandJob(spec, transport, run_dir, seed, extra_env)


def _slurm_job(
    scenario: Scenario, spec: SlurmTarget, run_dir: Path, seed: int, extra_env: dict[str, str], hosts: HostSet
) -> Target:
    """A batch job on the scenario's Slurm cluster; it answers the hosts' ``slurm:`` selector from here on."""
    from chaos.slurm.locate import ClusterNotFound, SlurmCluster, locate
    from chaos.targets.slurm import SlurmJob

    cluster: SlurmCluster | str
    try:
        cluster = locate(
            login=spec.login,
            conf=spec.conf,
            completion_log=spec.accounting == "completion_log",
            inventory=hosts.inventory,
            inventory_path=hosts.inventory_path,
        )
    except ClusterNotFound as exc:
        cluster = str(exc)  # the job's preflight refuses the run with it
    source = scenario.located(())[0]
    scenario_dir = Path(source).resolve().parent if not source.startswith("<") else None
    job = SlurmJob(
        spec,
        cluster,
        run_dir,
        seed,
        extra_env,
        inventory=hosts.inventory,
        scenario_dir=scenario_dir,
        reach=hosts.transport,
        run_bound_s=scenario.safety.max_duration + scenario.safety.heal_grace,
    )
    hosts.slurm = job
    return job


def on_nodes(scenario: Scenario, nodes: HostSelector) -> Scenario:
    """``scenario`` with its job spread over the inventory hosts ``nodes`` selects (``--nodes``);
    :class:`TargetSpecError` when its target cannot be (only torchrun can)."""
    if not isinstance(scenario.target, TorchrunTarget):
        raise TargetSpecError(f"--nodes needs a torchrun target; {scenario.name!r} has a {scenario.target.type} target")
    return scenario.model_copy(update={"target": scenario.target.model_copy(update={"nodes": nodes})})


def entry_file(scenario: Scenario) -> Path | None:
    """The first of :func:`entry_files` (the file the job starts from), or None."""
    files = entry_files(scenario)
    return files[0] if files else None


def entry_files(scenario: Scenario) -> list[Path]:
    """The user's code files the job starts from, when they are on this machine: a torchrun target's script
    (or its module's source), a command target's ``.py`` arguments, ``-m`` module sources and script program
    (:func:`chaos.targets.interpreter.entry_files`); empty for endpoints and the serving stack's own modules."""
    return interpreter.entry_files(scenario.target)


def job_identity(scenario: Scenario) -> str:
    """What besides code decides what the job computes: its interpreter (path, Python and torch versions)
    and launcher (:func:`chaos.targets.interpreter.job_identity`)."""
    return interpreter.job_identity(scenario.target)
