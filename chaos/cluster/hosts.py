"""Which hosts a fault lands on, and how to reach them: the scenario's inventory and one transport per host.

A fault without ``hosts:`` runs on the harness's own host (``local``). A fault with ``hosts:`` is applied on
every host its selector picks from the inventory (``--inventory`` or ``cluster.inventory``), each through its
own SSH transport; the choice is seeded by the run's seed and the op id, so a run replays exactly.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Protocol, runtime_checkable

from chaos.cluster.base import Transport
from chaos.cluster.inventory import Inventory, draw, load_inventory, select
from chaos.cluster.local import LocalTransport
from chaos.spec.scenario import FaultSpec, HostSelector, Scenario, TorchrunTarget

LOCAL = "local"
RDZV_STORE = "rdzv_store"  # the role of a multi-node torchrun job's rendezvous store (``hosts: {role: rdzv_store}``)
SLURM_GROUP = "slurm"  # the inventory group of Slurm nodes (the Slurm testbed puts its hosts in it)
NODE_LABEL = "slurm_node"  # the inventory label naming a host's Slurm node, when its name is not that


@runtime_checkable
class SlurmPlacement(Protocol):
    """A Slurm job (the ``slurm`` target) that knows its allocation: what ``hosts: {slurm: ...}`` selects from."""

    def slurm_nodes(self, which: str) -> list[str] | None:
        """Slurm node names: ``allocated`` (the job's allocation now) or ``spare`` (the partition's others);
        None while not known yet (before the job's first poll)."""
        ...


def needs_inventory(scenario: Scenario) -> bool:
    """True when the scenario reaches inventory hosts: a fault with ``hosts:``, ``cluster.transport: ssh``, or a
    target with ``nodes:``. Such a scenario cannot run without an inventory."""
    roles = getattr(scenario.target, "roles", None)
    return (
        any(f.hosts is not None for f in scenario.faults)
        or scenario.cluster.transport == "ssh"
        or isinstance(getattr(scenario.target, "nodes", None), HostSelector)  # a slurm target's is a count
        or getattr(scenario.target, "login", None) is not None  # a slurm target's login node
        or (isinstance(roles, dict) and any(getattr(r, "host", None) is not None for r in roles.values()))
    )


class HostsError(Exception):
    """The scenario's hosts cannot be resolved (no inventory, unknown host, selection empty …)."""


class HostSet:
    """The inventory (if any) and lazily opened transports, by host name (``local`` for this machine)."""

    def __init__(
        self,
        inventory: Inventory | None,
        protected: list[str],
        blast_radius: int | None,
        inventory_path: Path | None = None,
    ) -> None:
        self.inventory = inventory
        self.inventory_path = inventory_path  # the file it was read from (a Slurm testbed's is in its state dir)
        self.protected = set(protected)
        self.blast_radius = blast_radius
        self.slurm: SlurmPlacement | None = None  # the slurm target, which answers ``hosts: {slurm: ...}``
        self.roles: dict[str, str] = {}  # ``hosts: {role: ...}``: the host of each part of the target (rdzv_store)
        self._transports: dict[str, Transport] = {LOCAL: LocalTransport()}

    @classmethod
    def for_scenario(cls, scenario: Scenario, inventory_path: Path | None, base_dir: Path | None) -> HostSet:
        """Load the inventory named by ``--inventory`` (``inventory_path``) or by ``cluster.inventory``."""
        path = inventory_path
        if path is None and scenario.cluster.inventory is not None:
            path = Path(scenario.cluster.inventory)
            if not path.is_absolute() and base_dir is not None:
                path = base_dir / path
        if path is None:
            if needs_inventory(scenario):
                raise HostsError(
                    "this scenario uses inventory hosts (faults with hosts:, or a target with nodes:) but no inventory was given: pass --inventory FILE "
                    "(e.g. the one `mlchaos testbed up --hosts 3` prints) or set cluster.inventory"
                )
            return cls(None, scenario.cluster.protected, scenario.safety.blast_radius)
        found = cls(load_inventory(path), scenario.cluster.protected, scenario.safety.blast_radius, path.resolve())
        store = found._store_host(scenario)
        if store is not None:  # the job's own placement replaces it when the target is built (same seed: same host)
            found.roles[RDZV_STORE] = store
        return found

    def _store_host(self, scenario: Scenario) -> str | None:
        """The host of a multi-node torchrun target's rendezvous store: its first node (c10d), or its
        ``rdzv_host`` (etcd-v2); None for other targets or when the selection cannot be met (the target's own
        build then says why)."""
        target = scenario.target
        if not isinstance(target, TorchrunTarget) or target.nodes is None:
            return None
        selector = target.rdzv_host if target.rdzv_backend == "etcd-v2" else target.nodes
        try:
            chosen = self.job_nodes(selector, scenario.seed) if selector is not None else []
        except HostsError:
            return None
        return chosen[0][0] if chosen else None

    def resolve(self, fault: FaultSpec, op_id: str, seed: int) -> list[str]:
        """The host names ``fault`` hits for op ``op_id`` (``[local]`` without a selector)."""
        if fault.hosts is None:
            return [LOCAL]
        if self.inventory is None:
            raise HostsError(f"fault {fault.name!r} selects hosts but there is no inventory")
        rng = random.Random(f"{seed}:{op_id}")
        if fault.hosts.role is not None:
            return [self._role_host(fault, fault.hosts.role)]
        if fault.hosts.slurm is not None:
            try:
                return self._slurm_hosts(fault.hosts, rng)
            except HostsError as exc:
                raise HostsError(f"fault {fault.name!r}: {exc}") from None
        try:
            hosts = select(self.inventory, fault.hosts, rng, protected=self.protected, blast_radius=self.blast_radius)
        except Exception as exc:  # SelectionError and friends: one clear message naming the fault
            raise HostsError(f"fault {fault.name!r}: {exc}") from exc
        return [h.name for h in hosts]

    def _role_host(self, fault: FaultSpec, role: str) -> str:
        """The host of ``role`` (:attr:`roles`), unless protected; HostsError when the target has no such part."""
        host = self.roles.get(role)
        if host is None:
            raise HostsError(
                f"fault {fault.name!r}: hosts: {{role: {role}}} is the host of a multi-node torchrun target's "
                "rendezvous store, and this scenario's target has none on an inventory host"
            )
        self.refuse_protected(fault, [host])
        return host

    def _slurm_hosts(self, selector: HostSelector, rng: random.Random) -> list[str]:
        """``hosts: {slurm: allocated|spare}``: the inventory hosts of those Slurm nodes now, less ``exclude``
        and protected hosts, ``count`` of them drawn with ``rng``. Before the job's allocation is known (the
        checks before the run) every Slurm node of the inventory is returned: the fault may land on any."""
        assert self.inventory is not None
        names = self.inventory.names()
        for name in selector.exclude:
            if name not in names:
                raise HostsError(f"excluded host {name!r} is not in the inventory")
        nodes = self.slurm.slurm_nodes(selector.slurm or "") if self.slurm is not None else None
        if nodes is None:
            known = [h.name for h in self.inventory.hosts if h.in_group(SLURM_GROUP) or NODE_LABEL in h.labels]
            candidates = [n for n in known if n not in selector.exclude and n not in self.protected]
            if not candidates:
                raise HostsError(f"the inventory has no Slurm node (group {SLURM_GROUP!r}) that may be selected")
            if selector.count is not None and selector.count > len(candidates):
                raise HostsError(
                    f"asked for {selector.count} host(s) but the inventory has {len(candidates)} Slurm node(s)"
                )
            return candidates
        hosts: list[str] = []
        for node in nodes:
            host = host_of_node(self.inventory, node)
            if host is None:
                raise HostsError(f"Slurm node {node!r} is no inventory host (name it, or label one slurm_node: {node})")
            hosts.append(host)
        candidates = [h for h in hosts if h not in selector.exclude and h not in self.protected]
        what = "the job's allocation" if selector.slurm == "allocated" else "the partition's spare nodes"
        if not candidates:
            state = f" ({', '.join(hosts)}, all excluded or protected)" if hosts else " (none now)"
            raise HostsError(f"{what} has no node to select{state}")
        count = selector.count if selector.count is not None else len(candidates)
        if count > len(candidates):
            raise HostsError(f"asked for {count} host(s) but {what} has {len(candidates)}: {', '.join(candidates)}")
        candidates = draw(candidates, count, rng)
        if self.blast_radius is not None and len(candidates) > self.blast_radius:
            raise HostsError(
                f"selection hits {len(candidates)} hosts, more than the blast radius of {self.blast_radius}"
            )
        return candidates

    def job_nodes(self, selector: HostSelector, seed: int) -> list[tuple[str, str]]:
        """(name, address) of the hosts a multi-node target runs on, in inventory order. Protection and the
        blast radius are about faults, so they do not limit where the job runs."""
        if self.inventory is None:
            raise HostsError("the target runs on inventory nodes but there is no inventory")
        try:
            chosen = select(self.inventory, selector, random.Random(f"{seed}:target"))
        except Exception as exc:
            raise HostsError(f"target nodes: {exc}") from exc
        return [(host.name, host.address) for host in chosen]

    def address(self, name: str) -> str:
        """The inventory address of host ``name`` (HostsError without an inventory or for an unknown host)."""
        if self.inventory is None:
            raise HostsError(f"no inventory to find host {name!r}")
        try:
            return self.inventory.host(name).address
        except Exception as exc:  # the inventory's own error names the hosts it has
            raise HostsError(str(exc)) from exc

    def refuse_protected(self, fault: FaultSpec, names: list[str]) -> None:
        """HostsError when ``fault`` would land on a protected host (used for rank-resolved hosts)."""
        hit = sorted(set(names) & self.protected)
        if hit and len(hit) == len(set(names)):
            raise HostsError(f"fault {fault.name!r}: host {hit[0]!r} is protected and cannot be targeted")

    def transport(self, name: str) -> Transport:
        """The transport of host ``name`` (opened on first use)."""
        if name not in self._transports:
            if self.inventory is None:
                raise HostsError(f"no inventory to reach host {name!r}")
            self._transports[name] = open_transport(self.inventory, name)
        return self._transports[name]

    def all_transports(self) -> dict[str, Transport]:
        """A transport for every inventory host and ``local`` (for healing leftovers anywhere)."""
        names = self.inventory.names() if self.inventory is not None else []
        return {LOCAL: self._transports[LOCAL], **{n: self.transport(n) for n in names}}

    def close(self) -> None:
        for name, transport in self._transports.items():
            close = getattr(transport, "close", None)
            if name != LOCAL and callable(close):
                close()


def open_transport(inventory: Inventory, name: str) -> Transport:
    """The transport to inventory host ``name`` by its kind: the Docker API for ``transport: docker``, SSH
    otherwise (each client library is imported only when a host of its kind is used)."""
    if inventory.host(name).transport == "docker":
        from chaos.cluster.docker import DockerTransport

        return DockerTransport.for_host(inventory, name)
    from chaos.cluster.ssh import SshTransport

    return SshTransport.for_host(inventory, name)


def parse_node_selector(text: str) -> HostSelector:
    """``--nodes`` syntax: ``all``, ``group:NAME``, ``group:NAME:COUNT`` or ``host:NAME`` (ValueError otherwise)."""
    kind, _, rest = text.partition(":")
    if kind == "all" and not rest:
        return HostSelector(group="all")
    if kind == "host" and rest:
        return HostSelector(host=rest)
    if kind == "group" and rest:
        name, _, count = rest.partition(":")
        if count and not count.isdigit():
            raise ValueError(f"--nodes {text!r}: the count after the group must be a number")
        return HostSelector(group=name, count=int(count) if count else None)
    raise ValueError(f"--nodes {text!r}: use all, group:NAME, group:NAME:COUNT or host:NAME")


def host_of_node(inventory: Inventory, node: str) -> str | None:
    """The inventory host that is Slurm node ``node``: the one labelled ``slurm_node: <node>``, else the host
    of that name; None when the inventory has neither."""
    for host in inventory.hosts:
        if host.labels.get(NODE_LABEL) == node:
            return host.name
    return node if node in inventory.names() else None


def node_of_host(inventory: Inventory | None, host: str) -> str:
    """The Slurm node name of inventory host ``host`` (its ``slurm_node`` label, else its name)."""
    if inventory is not None and host in inventory.names():
        return inventory.host(host).labels.get(NODE_LABEL) or host
    return host
