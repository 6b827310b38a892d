"""Node faults in the scheduler's terms: ``node_fail``, ``slurmd_stop``, ``drain``.

Each lands on the inventory host its ``hosts:`` selects (``{slurm: allocated, count: 1}``: a node of the job's
allocation when the fault fires), which must be a node of the scenario's ``slurm`` target's cluster:

- ``node_fail``: SIGKILL the node's slurmd and every process of its jobs (slurmstepd and below), as a node that
  lost power. The controller notices after ``SlurmdTimeout`` (plus its ping cycle), marks the node DOWN "Not
  responding", and a ``--requeue`` job is requeued under the same id (its attempt ends NODE_FAIL).
- ``slurmd_stop``: SIGTERM the node's slurmd only; the job's processes keep running (the controller still
  marks the node DOWN after SlurmdTimeout, and kills the job then).
- ``drain``: ``scontrol update state=drain reason=...`` (what an operator or a health check does): running jobs
  finish, no new job lands there.

Heal (and the dead-man, which runs the same code: :mod:`injectors.slurm.nodes`) restarts the slurmd the fault
stopped and resumes the node if it is drained or down by our doing; a drain someone else set meanwhile (the
health check's) is left alone. ``node_fail`` and ``slurmd_stop`` work on the Slurm testbed's nodes (their
daemons are ours to kill and restart); ``drain`` on any cluster the target reaches (testbed or login node).
"""

from __future__ import annotations

import signal
from typing import ClassVar, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from chaos.cluster.hosts import node_of_host
from chaos.cluster.inventory import Inventory
from chaos.plugins.injector import Applied, FaultOp, InjectionContext, InjectionError, InjectorBase, Unsupported
from chaos.slurm.client import SlurmError
from chaos.slurm.locate import ClusterNotFound, SlurmCluster
from injectors.slurm import nodes as slurm_nodes
from injectors.slurm.nodes import NodeFault

_REASON = r"^[^\n\r]{1,200}$"


class NodeFailParams(BaseModel):
    """Kill the node's slurmd and its jobs' processes (SIGKILL)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class SlurmdStopParams(BaseModel):
    """Stop the node's slurmd (SIGTERM); the jobs' processes keep running."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class DrainParams(BaseModel):
    """Drain the node with ``reason`` (Slurm shows it with the node; heal resumes only a node it still drains)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    reason: str = Field(default="mlchaos drain", pattern=_REASON, description="the reason Slurm records")


@runtime_checkable
class _OnSlurm(Protocol):
    """The target a Slurm fault needs: the ``slurm`` target, which knows its cluster."""

    @property
    def cluster(self) -> SlurmCluster: ...


def _cluster(ctx: InjectionContext) -> SlurmCluster:
    if not isinstance(ctx.target, _OnSlurm):
        raise Unsupported("a Slurm node fault needs a slurm target (the cluster it acts on)")
    try:
        return ctx.target.cluster
    except Exception as exc:  # noqa: BLE001 - the target's own TargetUnusable: no cluster was found
        raise Unsupported(str(exc)) from None


def _host(ctx: InjectionContext) -> tuple[str, Inventory | None]:
    host = ctx.extras.get("host")
    if not isinstance(host, str):
        raise Unsupported(
            "a Slurm node fault lands on a node: select it with hosts: (e.g. {slurm: allocated, count: 1})"
        )
    inventory = ctx.extras.get("inventory")
    return host, inventory if isinstance(inventory, Inventory) else None


def _signal_slurmd(applied: Applied, signum: int) -> NodeFault:
    """Send ``signum`` to the journaled node's slurmd; InjectionError when it is not running."""
    fault = NodeFault.from_json(applied.state)
    daemons = slurm_nodes.slurmd_pids(fault)
    if not daemons:
        raise InjectionError(f"slurmd of {fault.node} is not running")
    slurm_nodes.kill(daemons, signum)
    return fault


class _SlurmFault(InjectorBase):
    """What the three share: find the node and its cluster (check), journal them (prepare), heal."""

    revert_on_harness: ClassVar[bool] = True  # heal acts through the cluster's commands / the testbed here
    testbed_only: ClassVar[bool] = True

    def _node(self, ctx: InjectionContext, reason: str) -> NodeFault:
        """The fault's node; Unsupported when the host is no node of the cluster mlchaos reaches."""
        cluster = _cluster(ctx)
        host, inventory = _host(ctx)
        node = node_of_host(inventory, host)
        netns = inventory.host(host).labels.get("netns") if inventory is not None else None
        if self.testbed_only and cluster.kind != "testbed":
            raise Unsupported(
                f"{self.name} kills and restarts the node's slurmd, which mlchaos does only on its Slurm testbed; "
                f"on {cluster.describe()} use drain (or a host fault: partition, storage, cpu_throttle)"
            )
        if cluster.kind == "testbed" and netns is None:
            raise Unsupported(f"host {host!r} has no testbed namespace (inventory label netns)")
        try:
            client = cluster.client(inventory=inventory)
            client.node(node)
        except (ClusterNotFound, SlurmError) as exc:
            raise Unsupported(f"host {host!r} is not a node of {cluster.describe()}: {exc}") from None
        return NodeFault(self.name, node, cluster, reason, netns)

    def check(self, ctx: InjectionContext, params: BaseModel) -> None:
        self._node(ctx, "check")

    def heal(self, ctx: InjectionContext, applied: Applied) -> None:
        """Restart the slurmd we stopped, resume the node if it is down or drained by our doing. Idempotent."""
        said = slurm_nodes.heal(NodeFault.from_json(applied.state))
        applied.state["healed"] = said

    def revert_command(self, applied: Applied) -> list[str] | None:
        return slurm_nodes.revert_argv(applied.state)


class NodeFailInjector(_SlurmFault, name="node_fail", params=NodeFailParams):
    """a Slurm node fails: SIGKILL its slurmd and its jobs' processes (DOWN, job requeued)

    SIGKILL the node's slurmd and its jobs' processes: the controller sees the node fail."""

    def prepare(self, ctx: InjectionContext, op: FaultOp) -> Applied:
        fault = self._node(ctx, f"mlchaos {op.fault}")
        description = f"SIGKILL slurmd and the job processes of Slurm node {fault.node}"
        return op.record(self.name, ctx.transport.host, fault.to_json(), description)

    def apply(self, ctx: InjectionContext, applied: Applied) -> None:
        fault = _signal_slurmd(applied, signal.SIGKILL)  # the daemon first: it must not see its jobs die
        applied.state["killed"] = slurm_nodes.kill(slurm_nodes.job_pids(fault), signal.SIGKILL)


class SlurmdStopInjector(_SlurmFault, name="slurmd_stop", params=SlurmdStopParams):
    """stop a Slurm node's slurmd (its jobs' processes keep running)

    SIGTERM the node's slurmd; its jobs' processes keep running."""

    def prepare(self, ctx: InjectionContext, op: FaultOp) -> Applied:
        fault = self._node(ctx, f"mlchaos {op.fault}")
        return op.record(self.name, ctx.transport.host, fault.to_json(), f"stop slurmd of Slurm node {fault.node}")

    def apply(self, ctx: InjectionContext, applied: Applied) -> None:
        _signal_slurmd(applied, signal.SIGTERM)


class DrainInjector(_SlurmFault, name="drain", params=DrainParams):
    """drain a Slurm node with a reason (scontrol update state=drain), as an operator does

    ``scontrol update state=drain reason=...`` on the node."""

    testbed_only: ClassVar[bool] = False

    def prepare(self, ctx: InjectionContext, op: FaultOp) -> Applied:
        reason = op.params_as(DrainParams).reason
        fault = self._node(ctx, reason)
        return op.record(self.name, ctx.transport.host, fault.to_json(), f"drain Slurm node {fault.node}: {reason}")

    def apply(self, ctx: InjectionContext, applied: Applied) -> None:
        fault = NodeFault.from_json(applied.state)
        try:
            fault.client().drain(fault.node, fault.reason)
        except SlurmError as exc:
            raise InjectionError(f"cannot drain {fault.node}: {exc}") from None


INJECTORS = (NodeFailInjector, SlurmdStopInjector, DrainInjector)
