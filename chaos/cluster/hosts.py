"""Which hosts a fault lands on, and how to reach them: the scenario's inventory and one transport per host.

A fault without ``hosts:`` runs on the harness's own host (``local``). A fault with ``hosts:`` is applied on
every host its selector picks from the inventory (``--inventory`` or ``cluster.inventory``), each through its
own SSH transport; the choice is seeded by the run's seed and the op id, so a run replays exactly.
"""

from __future__ import annotations

import random
from pathlib import Path

from chaos.cluster.base import Transport
from chaos.cluster.inventory import Inventory, load_inventory, select
from chaos.cluster.local import LocalTransport
from chaos.spec.scenario import FaultSpec, HostSelector, Scenario

LOCAL = "local"


def needs_inventory(scenario: Scenario) -> bool:
    """True when the scenario reaches inventory hosts: a fault with ``hosts:``, ``cluster.transport: ssh``, or a
    target with ``nodes:``. Such a scenario cannot run without an inventory."""
    roles = getattr(scenario.target, "roles", None)
    return (
        any(f.hosts is not None for f in scenario.faults)
        or scenario.cluster.transport == "ssh"
        or getattr(scenario.target, "nodes", None) is not None
        or (isinstance(roles, dict) and any(getattr(r, "host", None) is not None for r in roles.values()))
    )


class HostsError(Exception):
    """The scenario's hosts cannot be resolved (no inventory, unknown host, selection empty …)."""


class HostSet:
    """The inventory (if any) and lazily opened transports, by host name (``local`` for this machine)."""

    def __init__(self, inventory: Inventory | None, protected: list[str], blast_radius: int | None) -> None:
        self.inventory = inventory
        self.protected = set(protected)
        self.blast_radius = blast_radius
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
        return cls(load_inventory(path), scenario.cluster.protected, scenario.safety.blast_radius)

    def resolve(self, fault: FaultSpec, op_id: str, seed: int) -> list[str]:
        """The host names ``fault`` hits for op ``op_id`` (``[local]`` without a selector)."""
        if fault.hosts is None:
            return [LOCAL]
        if self.inventory is None:
            raise HostsError(f"fault {fault.name!r} selects hosts but there is no inventory")
        rng = random.Random(f"{seed}:{op_id}")
        try:
            hosts = select(
                self.inventory, fault.hosts, rng, protected=self.protected, blast_radius=self.blast_radius
            )
        except Exception as exc:  # SelectionError and friends: one clear message naming the fault
            raise HostsError(f"fault {fault.name!r}: {exc}") from exc
        return [h.name for h in hosts]

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
            if self.inventory.host(name).transport == "docker":
                from chaos.cluster.docker import DockerTransport  # the docker SDK only when a container is used

                self._transports[name] = DockerTransport.for_host(self.inventory, name)
            else:
                from chaos.cluster.ssh import SshTransport  # paramiko only when a remote host is used

                self._transports[name] = SshTransport.for_host(self.inventory, name)
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
