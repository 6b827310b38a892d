"""The job object for a scenario's ``target:`` spec (the one place that maps a target type to its class)."""

from __future__ import annotations

from pathlib import Path

from chaos.cluster.hosts import HostSet
from chaos.cluster.local import LocalTransport
from chaos.spec.scenario import Scenario, TorchrunTarget
from chaos.spec.serving import ServingTarget
from chaos.spec.targets import HttpTarget
from chaos.targets.base import Target
from chaos.targets.command import CommandJob
from chaos.targets.http import HttpJob
from chaos.targets.torchrun import TorchrunJob
from chaos.targets.torchrun_nodes import MultiNodeTorchrunJob, Node


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
