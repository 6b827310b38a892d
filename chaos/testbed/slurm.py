"""A real Slurm cluster on the namespace testbed (:mod:`chaos.testbed.namespaces`).

What runs where (``T`` is the testbed's tag)::

    root namespace (the harness side)              namespace chaos-tb-T-hN (one per host)
    munged    socket <slurm>/munge.socket          slurmd -f <slurm>/slurm.conf   NodeName=hN, NodeAddr = hN's
    slurmctld on 10.213.X.1:<port>, hostname          address, port 6818, hostname hN (own UTS namespace),
              chaos-tb-T-ctld (own UTS namespace)     spool <slurm>/slurmd/hN/, pid and log next to it

``<slurm>`` is ``<state dir>/chaos-tb-slurm``: every file the cluster has lives there (config, munge key,
controller state, job-completion log, logs, pids), and ``down`` removes the folder. Every daemon is started
with a path in that folder on its command line, which is how ``down`` (and ``down --all``, for every state
dir) finds exactly ours. The cluster is ``chaos-tb-T``, its one partition ``chaos`` spans every host; node
names are the inventory's host names, so a node of an allocation IS the inventory host of that name.

The slurmds enter their namespace with ``nsenter --net`` rather than ``ip netns exec``: the latter mounts a
fresh /sys, which hides /sys/fs/cgroup, and slurmd 22.05 refuses to start without its cgroup plugin. What
``ip netns exec`` would give them besides, the host's ``/etc/netns/<ns>/hosts`` over /etc/hosts (so a job
resolves ``h2`` as users' sbatch scripts expect: ``MASTER_ADDR=$(scontrol show hostnames | head -n1)``),
is bound in a mount namespace of slurmd's own, slave to this one.
Munge is reached through a Unix socket on the shared filesystem, from every namespace alike.

Slurm commands here need ``SLURM_CONF=<slurm>/slurm.conf`` (the testbed never touches /etc/slurm);
:meth:`SlurmTestbed.client` sets it. Requires root and Debian's slurmctld, slurmd, slurm-client, munge.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from chaos.cluster.base import Transport
from chaos.cluster.inventory import Inventory, dump_inventory, load_inventory
from chaos.cluster.local import LocalTransport
from chaos.cluster.poll import wait_until
from chaos.slurm.client import SlurmClient, SlurmError
from chaos.testbed import base as tb
from chaos.testbed import namespaces
from chaos.testbed import slurm_daemons as daemons
from chaos.testbed.slurm_conf import PARTITION, SlurmConfError, SlurmSettings, conf_text
from chaos.testbed.slurm_daemons import SLURM_DIR as SLURM_DIR  # re-exported: part of this surface
from chaos.testbed.slurm_daemons import SlurmLayout
from chaos.testbed.system import TestbedError, machine_lock, wait_listening

_BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "squeue", "sacct", "nsenter")
_PORT_BASE = 16800  # the controller's port is the first free one from here + (tag % 1000)
_SOCKET_PATH_MAX = 107  # sun_path
_JOB_ID_MAX = 67108863  # Slurm's largest job id (MaxJobId's limit)
_STEP_ID_MAX = 4294967291  # the largest special step id (the batch step's, SLURM_BATCH_SCRIPT)
_READY_S = 40.0
_NETNS_ETC = Path("/etc/netns")  # where the namespace testbed keeps each host's hosts file
# A constant script (arguments are positional): mount the host's hosts file in slurmd's own mount namespace,
# slave to this one (so later mounts here, a storage fault's FUSE layer, still reach the jobs), then exec slurmd.
_BIND_HOSTS: tuple[str, ...] = ("unshare", "--mount", "--propagation", "slave", "--")
_BIND_HOSTS += ("sh", "-c", 'mount --bind "$1" /etc/hosts && shift && exec "$@"', "sh")

__all__ = [
    "SlurmSettings",
    "SlurmTestbed",
    "attach",
    "down",
    "down_all",
    "present",
    "slurm_layout",
    "status",
    "unsupported_reason",
    "up",
]


def unsupported_reason() -> str | None:
    """Why a Slurm testbed cannot be built here (the namespace testbed's reasons, or a missing program), or None."""
    reason = namespaces.unsupported_reason()
    if reason is not None:
        return reason
    missing = [name for name in _BINARIES if daemons.which(name) is None]
    if missing:
        return (
            f"{', '.join(missing)} not installed (Debian: slurmctld slurmd slurm-client munge; "
            "`bash scripts/setup.sh` as root installs them)"
        )
    return None


@dataclass(frozen=True)
class SlurmTestbed:
    """A running Slurm testbed: its inventory (hosts = nodes), config and how to talk to it."""

    inventory: Inventory
    conf: Path
    cluster: str
    controller: str  # address:port
    partition: str
    nodes: tuple[str, ...]
    jobcomp_log: Path

    def client(self, transport: Transport | None = None, *, timeout: float = 30.0) -> SlurmClient:
        """A client running Slurm's commands on this machine (or ``transport``, which shares its filesystem)."""
        return SlurmClient(transport or LocalTransport(), conf=str(self.conf), completion_log=True, timeout=timeout)


# ---------------------------------------------------------------------------------------------------------
# up


def up(
    n: int,
    state_dir: Path | None = None,
    *,
    settings: SlurmSettings | None = None,
    subnet: str | None = None,
    log: Callable[[str], None] = tb.ignore,
) -> SlurmTestbed:
    """Build (or repair) an ``n``-host namespace testbed with Slurm on it, and wait until every node is up.

    Idempotent: running daemons are kept while the generated slurm.conf is unchanged; when it changed (other
    hosts, other settings) the controller and slurmds restart on the new one (munged and the key stay).
    On failure, what was started stays for :func:`down` (``mlchaos testbed down``). Raises TestbedError.
    """
    reason = unsupported_reason()
    if reason is not None:
        raise TestbedError(reason)
    settings = settings or SlurmSettings()
    try:
        settings.check()
    except SlurmConfError as exc:
        raise TestbedError(str(exc)) from None
    layout = slurm_layout(state_dir)
    _check_socket_paths(layout, n)
    inventory = namespaces.up(n, state_dir, subnet=subnet, log=log)
    started = time.monotonic()
    host_layout = namespaces.Layout.at(state_dir)
    record = host_layout.read_record()
    net = ipaddress.IPv4Network(str(record["subnet"]))
    nodes = [(host.name, host.address) for host in inventory.hosts]
    with machine_lock():
        layout.root.mkdir(mode=0o700, exist_ok=True)
        mine = daemons.read_json(layout.record)
        port = mine.get("port")
        if not isinstance(port, int) or (not daemons.pids(layout, ("slurmctld",)) and not _port_free(port)):
            port = _free_port(_PORT_BASE + int(layout.tag, 16) % 1000)
        daemons.write_json(layout.record, {"tag": layout.tag, "port": port, "nodes": [name for name, _ in nodes]})
        controller = str(net.network_address + 1)
        try:
            text = conf_text(
                cluster=layout.cluster,
                controller_host=layout.controller_host,
                controller_address=controller,
                controller_port=port,
                nodes=nodes,
                paths=layout.paths,
                settings=settings,
            )
        except SlurmConfError as exc:
            raise TestbedError(str(exc)) from None
        if layout.conf.exists() and layout.conf.read_text() != text:
            count = daemons.stop(layout, ("slurmd", "slurmctld"))
            log(f"slurm.conf changed: stopped {count} slurm daemon(s) to restart them on the new one")
        layout.conf.write_text(text)
        for folder in (layout.paths.state_save, layout.paths.slurmd_dir):
            folder.mkdir(mode=0o700, exist_ok=True)
        _ensure_munged(layout, log)
        _ensure_slurmctld(layout, controller, port, log)
        for index, (name, _) in enumerate(nodes, start=1):
            _ensure_slurmd(layout, name, host_layout.host_ns(index), log)
    testbed = SlurmTestbed(
        inventory=_label_inventory(inventory, host_layout.inventory, layout.cluster),
        conf=layout.conf,
        cluster=layout.cluster,
        controller=f"{controller}:{port}",
        partition=PARTITION,
        nodes=tuple(name for name, _ in nodes),
        jobcomp_log=layout.paths.jobcomp,
    )
    _wait_nodes_up(testbed, layout)
    log(f"slurm {layout.cluster}: controller {testbed.controller}, {n} node(s) up in {time.monotonic() - started:.1f}s")
    return testbed


def _check_socket_paths(layout: SlurmLayout, n: int) -> None:
    """TestbedError when a socket the daemons create under ``layout`` would not fit a Unix socket path.

    munged's socket, and each job step's ``<spool>/<node>/<node>_<job>.<step>`` (slurmstepd cannot start
    without it: the job is requeued and held, and nothing but slurmd's log says why).
    """
    node = f"h{n}"
    step_socket = layout.paths.slurmd_dir / node / f"{node}_{_JOB_ID_MAX}.{_STEP_ID_MAX}"
    for path in (layout.munge_socket, step_socket):
        if len(str(path)) > _SOCKET_PATH_MAX:
            raise TestbedError(
                f"the state dir {layout.root.parent} is too long for Slurm's sockets ({path} is {len(str(path))}"
                f" characters, a Unix socket path holds {_SOCKET_PATH_MAX}); use a state dir of at most"
                f" {len(str(layout.root.parent)) - (len(str(path)) - _SOCKET_PATH_MAX)} characters"
            )


def attach(state_dir: Path | None = None) -> SlurmTestbed:
    """The Slurm testbed already up for ``state_dir`` (read from its files; starts nothing); TestbedError if none."""
    layout = slurm_layout(state_dir)
    host_layout = namespaces.Layout.at(state_dir)
    mine = daemons.read_json(layout.record)
    subnet = host_layout.read_record().get("subnet")
    if not layout.conf.exists() or not isinstance(mine.get("port"), int) or not isinstance(subnet, str):
        raise TestbedError(f"no Slurm testbed is up for {host_layout.state_dir} (`mlchaos testbed up --slurm`)")
    inventory = load_inventory(host_layout.inventory)
    return SlurmTestbed(
        inventory=inventory,
        conf=layout.conf,
        cluster=layout.cluster,
        controller=f"{ipaddress.IPv4Network(subnet).network_address + 1}:{mine['port']}",
        partition=PARTITION,
        nodes=tuple(host.name for host in inventory.hosts),
        jobcomp_log=layout.paths.jobcomp,
    )


def _label_inventory(inventory: Inventory, path: Path, cluster: str) -> Inventory:
    """The inventory with each host in group ``slurm`` and labelled with its node and cluster (written back)."""
    hosts = [
        host.model_copy(
            update={
                "groups": sorted({*host.groups, "slurm"}),
                "labels": {**host.labels, "slurm_node": host.name, "slurm_cluster": cluster},
            }
        )
        for host in inventory.hosts
    ]
    labelled = inventory.model_copy(update={"hosts": hosts})
    dump_inventory(labelled, path)
    return labelled


def _ensure_munged(layout: SlurmLayout, log: Callable[[str], None]) -> None:
    if daemons.pids(layout, ("munged",)):
        return
    if not layout.munge_key.exists():
        fd = os.open(layout.munge_key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(os.urandom(1024))
    layout.munge_socket.unlink(missing_ok=True)
    argv = [
        daemons.binary("munged"),
        f"--key-file={layout.munge_key}",
        f"--socket={layout.munge_socket}",
        f"--pid-file={layout.munged_pid}",
        f"--log-file={layout.munged_log}",
        f"--seed-file={layout.root / 'munged.seed'}",
        "--force",  # the state dir may sit under /tmp, whose permissions munged would otherwise refuse
    ]
    daemons.start("munged", argv, layout.munged_log)
    if not wait_until(lambda: layout.munge_socket.exists(), 10.0):
        raise TestbedError(f"munged did not create {layout.munge_socket}:\n{daemons.tail(layout.munged_log)}")
    log(f"started munged ({layout.munge_socket})")


def _ensure_slurmctld(layout: SlurmLayout, address: str, port: int, log: Callable[[str], None]) -> None:
    if not daemons.pids(layout, ("slurmctld",)):
        log_file = layout.paths.ctld_log
        daemons.start(
            "slurmctld", [daemons.binary("slurmctld"), "-f", str(layout.conf)], log_file, uts=layout.controller_host
        )
        log(f"started slurmctld on {address}:{port}")
    if not wait_listening(address, port, 20.0):
        raise TestbedError(
            f"slurmctld is not accepting connections on {address}:{port}:\n{daemons.tail(layout.paths.ctld_log)}"
        )


def _ensure_slurmd(layout: SlurmLayout, node: str, ns: str, log: Callable[[str], None]) -> None:
    if daemons.pids(layout, ("slurmd",), ns=ns):
        return
    slurmd = [daemons.binary("slurmd"), "-f", str(layout.conf)]
    hosts = _NETNS_ETC / ns / "hosts"
    if hosts.exists():  # the host's own /etc/hosts (every testbed host by name), as `ip netns exec` gives sshd
        slurmd = [*_BIND_HOSTS, str(hosts), *slurmd]
    argv = ["nsenter", f"--net=/run/netns/{ns}", "--", *slurmd]
    daemons.start(f"slurmd {node}", argv, layout.slurmd_log(node), uts=node)
    log(f"started slurmd {node} in {ns}")


def _wait_nodes_up(testbed: SlurmTestbed, layout: SlurmLayout) -> None:
    client = testbed.client(timeout=15.0)
    seen: dict[str, str] = {}

    def ready() -> bool:
        try:
            nodes = client.nodes()
        except SlurmError as exc:
            seen["error"] = str(exc)
            return False
        seen.clear()
        seen.update({node.name: "+".join([node.state, *sorted(node.flags)]) for node in nodes})
        return {node.name for node in nodes if node.responding} == set(testbed.nodes)

    if not wait_until(ready, _READY_S, interval=0.2):
        tails = "\n".join(f"{node}: {daemons.tail(layout.slurmd_log(node), 3)}" for node in testbed.nodes)
        raise TestbedError(f"not every slurmd registered within {_READY_S:.0f}s: {seen}\n{tails}")


# ---------------------------------------------------------------------------------------------------------
# down / status


def slurm_layout(state_dir: Path | None = None) -> SlurmLayout:
    """The Slurm paths and names of the namespace testbed of ``state_dir`` (default: the default testbed)."""
    hosts = namespaces.Layout.at(state_dir)
    return SlurmLayout.of(hosts.state_dir, hosts.tag, hosts.prefix)


def present(state_dir: Path | None = None) -> bool:
    """Whether the testbed of ``state_dir`` has Slurm files or daemons."""
    return daemons.present(slurm_layout(state_dir))


def down(state_dir: Path | None = None, *, log: Callable[[str], None] = tb.ignore) -> list[str]:
    """Stop the Slurm of the testbed of ``state_dir`` (job steps, slurmds, slurmctld, munged) and remove its
    folder; the hosts stay. ``namespaces.down`` does this first by itself."""
    return daemons.down(slurm_layout(state_dir), namespaces.Layout.at(state_dir).ns_prefix, log=log)


def down_all(*, log: Callable[[str], None] = tb.ignore) -> list[str]:
    """Stop EVERY testbed's Slurm daemons on this machine; files stay (``namespaces.down_all`` does this too)."""
    return daemons.down_all(log=log)


@dataclass(frozen=True)
class SlurmStatus:
    munged: list[int]
    slurmctld: list[int]
    slurmd: dict[str, list[int]]  # node -> pids

    @property
    def healthy(self) -> bool:
        """munged, slurmctld and every node's slurmd are running."""
        return bool(self.munged and self.slurmctld and self.slurmd and all(self.slurmd.values()))


def status(state_dir: Path | None = None) -> SlurmStatus | None:
    """The daemons of the testbed's Slurm, or None when it has none (no files, no daemons)."""
    layout = slurm_layout(state_dir)
    host_layout = namespaces.Layout.at(state_dir)
    if not present(state_dir):
        return None
    nodes = daemons.read_json(layout.record).get("nodes")
    names = [str(name) for name in nodes] if isinstance(nodes, list) else []
    return SlurmStatus(
        munged=daemons.pids(layout, ("munged",)),
        slurmctld=daemons.pids(layout, ("slurmctld",)),
        slurmd={
            name: daemons.pids(layout, ("slurmd",), ns=host_layout.host_ns(i)) for i, name in enumerate(names, start=1)
        },
    )


# ---------------------------------------------------------------------------------------------------------
# small helpers


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def _free_port(start: int) -> int:
    for port in range(start, start + 1000):
        if _port_free(port):
            return port
    raise TestbedError(f"no free TCP port in {start}..{start + 999} for slurmctld")
