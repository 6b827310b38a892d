"""The job object for a scenario's ``target:`` spec: the one place that maps a target type to its class, and
answers the few questions the runner has about a target spec before any job exists."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from chaos.cluster.hosts import HostSet
from chaos.cluster.local import LocalTransport
from chaos.spec.scenario import HostSelector, Scenario, TorchrunTarget
from chaos.spec.serving import ServingTarget
from chaos.spec.targets import HttpTarget
from chaos.targets.base import Target
from chaos.targets.command import CommandJob
from chaos.targets.http import HttpJob
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
        return MultiNodeTorchrunJob(spec, nodes, run_dir, seed, extra_env)
    if isinstance(spec, TorchrunTarget):
        return TorchrunJob(spec, transport, run_dir, seed, extra_env)
    if isinstance(spec, ServingTarget):
        from chaos.targets.reference.serving.job import ServingJob  # its processes import torch; the harness need not

        return ServingJob(spec, transport, run_dir, seed, extra_env)
    if isinstance(spec, HttpTarget):
        return HttpJob(spec)
    return CommandJob(spec, transport, run_dir, seed, extra_env)


def on_nodes(scenario: Scenario, nodes: HostSelector) -> Scenario:
    """``scenario`` with its job spread over the inventory hosts ``nodes`` selects (``--nodes``);
    :class:`TargetSpecError` when its target cannot be (only torchrun can)."""
    if not isinstance(scenario.target, TorchrunTarget):
        raise TargetSpecError(f"--nodes needs a torchrun target; {scenario.name!r} has a {scenario.target.type} target")
    return scenario.model_copy(update={"target": scenario.target.model_copy(update={"nodes": nodes})})


def entry_file(scenario: Scenario) -> Path | None:
    """The file the job starts from (a torchrun script, or its module's source), when it is on this machine;
    None for targets whose code is not a file here (commands, endpoints, the serving stack's own modules)."""
    spec = scenario.target
    if not isinstance(spec, TorchrunTarget):
        return None
    entry = spec.script
    if spec.module is not None:
        found = importlib.util.find_spec(spec.module)
        entry = found.origin if found is not None else None
    return Path(entry) if entry is not None and os.path.exists(entry) else None
