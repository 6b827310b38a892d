"""Which Slurm cluster a scenario talks to, written down so that a fault's heal (even ``mlchaos cleanup``, with
nothing but the journal) reaches the same one.

Two kinds: the Slurm testbed of this machine (``testbed``: its state dir; commands run here with its
``SLURM_CONF``), or an existing cluster (``login``: an inventory host, the inventory file it is in, and the
cluster's slurm.conf there when not at the default path; commands run on the login node over SSH).

A testbed is found from the scenario's inventory: ``mlchaos testbed up`` writes ``<state dir>/inventory.yaml``
and labels each host with the Slurm cluster it is a node of (``slurm_cluster``), so the inventory's folder is
the state dir. Without an inventory, the default testbed's state dir is used.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import JsonValue

from chaos.cluster.inventory import Inventory, load_inventory
from chaos.slurm.client import SlurmClient, login_client

TESTBED_CLUSTER_LABEL = "slurm_cluster"  # what the testbed labels its hosts with (chaos.testbed.slurm)


class ClusterNotFound(RuntimeError):
    """No Slurm cluster can be reached as the scenario says (no testbed up, no such login host)."""


@dataclass(frozen=True)
class SlurmCluster:
    """Where Slurm's commands run for a scenario; :meth:`client` talks to it."""

    kind: Literal["testbed", "login"]
    state_dir: Path | None = None  # testbed
    login: str | None = None  # login: the inventory host
    inventory_path: Path | None = None  # login: the inventory that names it (heal reads it back)
    conf: str | None = None  # login: slurm.conf on the login node (None: its default)
    completion_log: bool = False  # login: sacct reads the job-completion log, not slurmdbd

    def client(self, *, timeout: float = 30.0, inventory: Inventory | None = None) -> SlurmClient:
        """A client of this cluster; ClusterNotFound when it cannot be reached as recorded."""
        if self.kind == "testbed":
            from chaos.testbed import slurm as testbed  # the testbed's modules only for a testbed
            from chaos.testbed.system import TestbedError

            try:
                return testbed.attach(self.state_dir).client(timeout=timeout)
            except TestbedError as exc:
                raise ClusterNotFound(str(exc)) from None
        if self.login is None:
            raise ClusterNotFound("an existing cluster needs its login node (target.login)")
        if inventory is None:
            if self.inventory_path is None:
                raise ClusterNotFound(f"no inventory to reach login node {self.login!r}")
            inventory = load_inventory(self.inventory_path)
        try:
            inventory.host(self.login)
        except Exception as exc:  # the inventory's own error names its hosts
            raise ClusterNotFound(f"login node: {exc}") from None
        return login_client(inventory, self.login, conf=self.conf, completion_log=self.completion_log, timeout=timeout)

    def describe(self) -> str:
        if self.kind == "testbed":
            return f"the Slurm testbed of {self.state_dir}"
        return f"the cluster of login node {self.login}"

    def to_json(self) -> dict[str, JsonValue]:
        return {
            "kind": self.kind,
            "state_dir": str(self.state_dir) if self.state_dir is not None else None,
            "login": self.login,
            "inventory": str(self.inventory_path) if self.inventory_path is not None else None,
            "conf": self.conf,
            "completion_log": self.completion_log,
        }

    @classmethod
    def from_json(cls, data: JsonValue) -> SlurmCluster:
        """ValueError when ``data`` is not what :meth:`to_json` writes."""
        if not isinstance(data, dict) or data.get("kind") not in ("testbed", "login"):
            raise ValueError(f"not a Slurm cluster record: {data!r}")
        state_dir, login, inventory, conf = (data.get(k) for k in ("state_dir", "login", "inventory", "conf"))
        if data["kind"] == "testbed":
            if not isinstance(state_dir, str):
                raise ValueError("a testbed cluster record has no state_dir")
            return cls("testbed", state_dir=Path(state_dir))
        if not isinstance(login, str):
            raise ValueError("a login cluster record has no login host")
        return cls(
            "login",
            login=login,
            inventory_path=Path(inventory) if isinstance(inventory, str) else None,
            conf=conf if isinstance(conf, str) else None,
            completion_log=data.get("completion_log") is True,
        )


def locate(
    *,
    login: str | None,
    conf: str | None = None,
    completion_log: bool = False,
    inventory: Inventory | None = None,
    inventory_path: Path | None = None,
) -> SlurmCluster:
    """The cluster a slurm target names: ``login`` (an existing cluster, through the inventory), or the Slurm
    testbed whose inventory this is (else the default testbed). ClusterNotFound says what is missing."""
    if login is not None:
        if inventory is None:
            raise ClusterNotFound(f"login node {login!r} is an inventory host, but no inventory was given")
        try:
            inventory.host(login)
        except Exception as exc:
            raise ClusterNotFound(f"login node: {exc}") from None
        return SlurmCluster(
            "login", login=login, inventory_path=inventory_path, conf=conf, completion_log=completion_log
        )
    from chaos.testbed import namespaces
    from chaos.testbed import slurm as testbed

    labels = {h.labels.get(TESTBED_CLUSTER_LABEL) for h in inventory.hosts} if inventory is not None else set()
    labels.discard(None)
    candidates = [inventory_path.parent] if inventory_path is not None else []
    candidates.append(namespaces.default_state_dir())
    for state_dir in candidates:
        layout = testbed.slurm_layout(state_dir)
        if layout.conf.exists() and (not labels or layout.cluster in labels):
            return SlurmCluster("testbed", state_dir=layout.root.parent)
    where = f" for inventory {inventory_path}" if inventory_path is not None else ""
    raise ClusterNotFound(
        f"no Slurm testbed is up{where} (`mlchaos testbed up --slurm`); for an existing cluster give the target "
        "login: <its login node in the inventory>"
    )
