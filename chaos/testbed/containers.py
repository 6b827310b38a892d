"""A multi-host testbed of Docker containers on one daemon: N containers on a private bridge network.

Layout (``T`` is a 4-hex-digit tag derived from the state dir, as in :mod:`chaos.testbed.namespaces`, so
testbeds of different state dirs coexist)::

    network chaos-dtb-T      bridge chdtb-T (root namespace), 10.214.X.0/24, gateway .1
    container chaos-dtb-T-hN hostname hN, address 10.214.X.(10+N), image mlchaos-testbed:1

Every container bind-mounts this machine's ``/usr``, Python environment and checkout read-only
(:func:`~chaos.testbed.image.python_binds`, plus ``/etc/alternatives`` so Debian's alternative
symlinks such as ``iptables`` resolve), and each share READ-WRITE at the same path (default ``/tmp`` and
``<cwd>/reports``): a multi-node job's run dir and checkpoints must be at the same path on every host. It
gets NET_ADMIN (iptables/tc inside even when execs cannot be privileged), no restart policy, and a PID 1
shell that exits on SIGTERM and reaps orphans. The inventory (``inventory.yaml`` in the state dir) names
them ``h1..hN`` with ``transport: docker``.

Everything carries the label ``mlchaos.testbed=T`` and the prefix ``chaos-dtb-T``; :func:`down` removes
exactly those, then the image unless some other container still uses it. Changes are serialised with the
namespace testbed's machine lock.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chaos.cluster.base import TransportError
from chaos.cluster.inventory import Host, Inventory, dump_inventory
from chaos.testbed import base as tb
from chaos.testbed import shared_mounts
from chaos.testbed.base import HOST_OFFSET as HOST_OFFSET  # re-exported: part of this module's surface
from chaos.testbed.base import MAX_HOSTS as MAX_HOSTS  # re-exported: part of this module's surface
from chaos.testbed.image import IMAGE, LABEL, ensure_image, python_binds
from chaos.testbed.system import TestbedError, machine_lock, used_networks

if TYPE_CHECKING:
    import docker
    from docker.models.containers import Container
    from docker.models.networks import Network

PREFIX = "chaos-dtb"
LINK_PREFIX = "chdtb"  # the bridge's interface name in the root namespace (15 characters at most)
HOST_LABEL = f"{LABEL}.host"
CONFIG_LABEL = f"{LABEL}.config"
SUBNET_PREFIX = "10.214"
STOP_TIMEOUT_S = 5
# PID 1: `wait` (not `wait $!`) reaps every child, orphans of finished execs included; TERM ends it at once.
PID1 = ["sh", "-c", 'trap "exit 0" TERM; while :; do sleep 3600 & wait; done']
_STATE_FILE = "chaos-dtb.json"
_SYSTEM_BINDS = ("/etc/alternatives",)
_START_HINT = "start one with `bash scripts/start-dockerd.sh`"

__all__ = ["TestbedError", "Layout", "up", "down", "down_all", "status", "default_state_dir", "default_shares"]


def default_state_dir() -> Path:
    """``<mlchaos state dir>/docker-testbed``."""
    return Layout.default_dir()


def default_shares() -> list[Path]:
    """``/tmp`` and ``<cwd>/reports``: where run dirs and checkpoints usually live."""
    return [Path("/tmp"), Path.cwd() / "reports"]


@dataclass(frozen=True)
class Layout(tb.TestbedLayout):
    """Every name of the Docker testbed of one state dir (``Layout.of(state_dir)``)."""

    subdir = "docker-testbed"
    state_file = _STATE_FILE
    prefix = PREFIX
    link_prefix = LINK_PREFIX

    # This testbed's words for the shared names: its hosts are containers, its link the network's bridge.
    bridge = tb.TestbedLayout.link
    container = tb.TestbedLayout.host_name

    @property
    def network(self) -> str:
        return f"{PREFIX}-{self.tag}"


@dataclass(frozen=True)
class HostStatus:
    name: str
    container: str
    state: str  # running, exited, ... or "missing"
    address: str | None  # its address on the testbed network
    exec_ok: bool

    @property
    def healthy(self) -> bool:
        return self.state == "running" and self.address is not None and self.exec_ok


@dataclass(frozen=True)
class TestbedStatus:
    """What exists of the Docker testbed of ``state_dir``; ``built`` is False when nothing does."""

    __test__ = False

    state_dir: Path
    tag: str
    network: str
    subnet: str | None
    network_exists: bool
    hosts: list[HostStatus] = field(default_factory=list)
    inventory: Path | None = None

    @property
    def built(self) -> bool:
        return self.network_exists or any(h.state != "missing" for h in self.hosts)

    @property
    def healthy(self) -> bool:
        return self.network_exists and bool(self.hosts) and all(h.healthy for h in self.hosts)


def connect() -> docker.DockerClient:
    """A client for the daemon of DOCKER_HOST (else the local socket), pinged; TestbedError if unreachable."""
    import docker
    import docker.errors
    import requests

    where = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    try:
        client = docker.from_env()
        client.ping()
    except (docker.errors.DockerException, requests.RequestException, OSError) as exc:
        raise TestbedError(f"cannot reach the Docker daemon at {where}: {exc}; {_START_HINT}") from None
    return client


def _docker_networks(client: docker.DockerClient) -> list[ipaddress.IPv4Network]:
    nets: list[ipaddress.IPv4Network] = []
    for network in client.api.networks():
        for pool in (network.get("IPAM") or {}).get("Config") or []:
            try:
                net = ipaddress.ip_network(str(pool.get("Subnet", "")), strict=False)
            except ValueError:
                continue
            if isinstance(net, ipaddress.IPv4Network):
                nets.append(net)
    return nets


def _choose_subnet(client: docker.DockerClient, tag: str) -> ipaddress.IPv4Network:
    try:
        used = used_networks()  # addresses and routes of this machine's root namespace
    except (TestbedError, OSError, ValueError):
        used = []
    return tb.choose_subnet(SUBNET_PREFIX, tag, used + _docker_networks(client), "by a route or a docker network here")


def _binds(shares: Sequence[Path]) -> dict[str, Mapping[str, str]]:
    binds: dict[str, Mapping[str, str]] = dict(python_binds())
    for path in _SYSTEM_BINDS:
        if os.path.isdir(path):
            binds.setdefault(path, {"bind": path, "mode": "ro"})
    for share in shares:
        # rslave: a FUSE layer the docker host mounts under a share (a storage fault) reaches the container.
        binds[str(share)] = {"bind": str(share), "mode": "rw,rslave"}
    return dict(sorted(binds.items()))


def _ensure_network(
    client: docker.DockerClient, layout: Layout, record: dict[str, Any], log: Callable[[str], None]
) -> tuple[Network, ipaddress.IPv4Network]:
    import docker.errors
    import docker.types

    try:
        network = client.networks.get(layout.network)
    except docker.errors.NotFound:
        network = None
    if network is not None:
        configs = (network.attrs.get("IPAM") or {}).get("Config") or []
        if (network.attrs.get("Labels") or {}).get(LABEL) == layout.tag and configs:
            return network, ipaddress.IPv4Network(str(configs[0]["Subnet"]))
        raise TestbedError(f"a docker network named {layout.network} exists but is not this testbed's; remove it")
    known = record.get("subnet")
    net = ipaddress.IPv4Network(known) if isinstance(known, str) else _choose_subnet(client, layout.tag)
    if isinstance(known, str) and any(net.overlaps(other) for other in _docker_networks(client)):
        net = _choose_subnet(client, layout.tag)  # someone took our old subnet while the network was gone
    ipam = docker.types.IPAMConfig(
        pool_configs=[docker.types.IPAMPool(subnet=str(net), gateway=str(net.network_address + 1))]
    )
    network = client.networks.create(
        layout.network,
        driver="bridge",
        ipam=ipam,
        labels={LABEL: layout.tag},
        options={"com.docker.network.bridge.name": layout.bridge},
    )
    log(f"created network {layout.network} ({net}, bridge {layout.bridge})")
    return network, net


def _fingerprint(image_id: str, network_id: str, address: str, binds: Mapping[str, Mapping[str, str]]) -> str:
    text = json.dumps([image_id, network_id, address, {k: dict(v) for k, v in binds.items()}, PID1], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _ensure_container(
    client: docker.DockerClient,
    layout: Layout,
    index: int,
    network: Network,
    net: ipaddress.IPv4Network,
    binds: dict[str, Mapping[str, str]],
    log: Callable[[str], None],
) -> Container:
    import docker.errors
    import docker.types

    name, address = layout.container(index), tb.host_address(net, index)
    image_id = str(client.images.get(IMAGE).id)
    config = _fingerprint(image_id, str(network.id), address, binds)
    try:
        existing: Container | None = client.containers.get(name)
    except docker.errors.NotFound:
        existing = None
    if existing is not None:
        labels = existing.labels
        if labels.get(LABEL) != layout.tag:
            raise TestbedError(f"a container named {name} exists but is not this testbed's; remove it")
        if labels.get(CONFIG_LABEL) == config:
            if existing.status != "running":
                existing.start()
                log(f"started {name} (was {existing.status})")
            return existing
        existing.remove(force=True)
        log(f"removed {name} (its configuration changed)")
    api = client.api
    host_config = api.create_host_config(
        binds=binds, cap_add=["NET_ADMIN"], restart_policy={"Name": "no"}, network_mode=layout.network
    )
    networking = docker.types.NetworkingConfig()
    networking["EndpointsConfig"] = {layout.network: api.create_endpoint_config(ipv4_address=address)}
    created = api.create_container(
        IMAGE,
        command=PID1,
        name=name,
        hostname=f"h{index}",
        labels={LABEL: layout.tag, HOST_LABEL: f"h{index}", CONFIG_LABEL: config},
        host_config=host_config,
        networking_config=networking,
        detach=True,
        stop_signal="SIGTERM",
    )
    api.start(created["Id"])
    log(f"started {name} as h{index} on {address}")
    return client.containers.get(created["Id"])


def _ours(client: docker.DockerClient, layout: Layout | None) -> list[Container]:
    """Containers of the testbed of ``layout`` (None: of every Docker testbed), running or not."""
    value = f"{LABEL}={layout.tag}" if layout is not None else LABEL
    prefix = f"{PREFIX}-{layout.tag}-" if layout is not None else f"{PREFIX}-"
    found = client.containers.list(all=True, filters={"label": value})
    return [c for c in found if (c.name or "").startswith(prefix)]


def _our_networks(client: docker.DockerClient, layout: Layout | None) -> list[Network]:
    value = f"{LABEL}={layout.tag}" if layout is not None else LABEL
    found = client.networks.list(filters={"label": value})
    return [n for n in found if (n.name or "").startswith(layout.network if layout is not None else f"{PREFIX}-")]


# ---------------------------------------------------------------------------------------------------------
# up / down / status.


def up(
    n: int,
    state_dir: Path | None = None,
    *,
    shares: Sequence[Path] | None = None,
    log: Callable[[str], None] = tb.ignore,
) -> Inventory:
    """Build (or repair) an ``n``-host Docker testbed and return its inventory, also written to ``inventory.yaml``.

    Idempotent: a running container of the right configuration is kept, a stopped one started, a wrong one
    recreated; hosts beyond ``n`` from an earlier, larger testbed are removed. ``shares`` (default
    :func:`default_shares`) are created when missing and bind-mounted read-write at the same path. On failure
    what was built stays for :func:`down` (or a retry). Raises TestbedError.
    """
    import docker.errors
    import requests

    tb.check_host_count(n)
    layout = Layout.at(state_dir)
    wanted = [Path(p).expanduser().resolve() for p in (shares if shares is not None else default_shares())]
    started = time.monotonic()
    client = connect()
    try:
        for share in wanted:
            share.mkdir(parents=True, exist_ok=True)
        layout.state_dir.mkdir(parents=True, exist_ok=True)
        with machine_lock():
            record = layout.read_record()
            self_binds = list(record.get("self_binds", []))
            for share in wanted:
                try:
                    if shared_mounts.ensure_shared(share):
                        self_binds.append(str(share))
                        shared_mounts.remember(share)
                        log(f"made {share} a shared mount (a self-bind) so host mounts reach the containers")
                except OSError as exc:
                    raise TestbedError(f"cannot share {share} with the containers: {exc}") from None
            record["self_binds"] = sorted(set(self_binds))
            ensure_image(client)
            network, net = _ensure_network(client, layout, record, log)
            record.update({"tag": layout.tag, "subnet": str(net), "hosts": n, "shares": [str(s) for s in wanted]})
            layout.write_record(record)
            for stale in _ours(client, layout):
                index = layout.index_of(stale.name or "")
                if index is None or index > n:
                    stale.remove(force=True)
                    log(f"removed {stale.name} (beyond {n} hosts)")
            binds = _binds(wanted)
            containers = [_ensure_container(client, layout, i, network, net, binds, log) for i in range(1, n + 1)]
            _wait_running(client, containers)
            inventory = Inventory(
                hosts=[
                    Host(
                        name=f"h{index}",
                        address=tb.host_address(net, index),
                        transport="docker",
                        container=layout.container(index),
                        groups=["testbed"],
                        labels={"testbed": layout.tag, "container": layout.container(index)},
                        python=sys.executable,  # /usr, the venv and the checkout are bound at the same paths
                    )
                    for index in range(1, n + 1)
                ]
            )
            _check_exec(inventory)
            dump_inventory(inventory, layout.inventory)
    except (docker.errors.DockerException, requests.RequestException) as exc:
        raise TestbedError(f"docker testbed up failed: {exc}") from None
    finally:
        client.close()
    log(f"docker testbed {layout.tag}: {n} container(s) on {net} ready in {time.monotonic() - started:.1f}s")
    return inventory


def _wait_running(client: docker.DockerClient, containers: list[Container], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    for container in containers:
        while True:
            container.reload()
            if container.status == "running":
                break
            if container.status in ("exited", "dead") or time.monotonic() > deadline:
                logs = container.logs(tail=5).decode(errors="replace").strip()
                raise TestbedError(
                    f"container {container.name} is {container.status}, not running: {logs or 'no output'}"
                )
            time.sleep(0.05)


def _check_exec(inventory: Inventory) -> None:
    """One exec per container: the shell and its tools (the /usr bind) work."""
    from chaos.cluster.docker import DockerTransport

    for host in inventory.hosts:
        with DockerTransport(host) as transport:
            try:
                transport.run(["test", "-x", transport.python], timeout=30, check=True)
            except TransportError as exc:
                raise TestbedError(f"{host.container} does not run commands: {exc}") from None


def down(state_dir: Path | None = None, *, log: Callable[[str], None] = tb.ignore) -> list[str]:
    """Remove everything the Docker testbed of ``state_dir`` made: its containers (with their processes), its
    network, its files, and the image when no other container uses it. Safe when half built or already down.

    Returns what was removed, one line each. Every step is tried even when an earlier one fails; then a
    TestbedError lists the failures."""
    layout = Layout.at(state_dir)
    made_here = set(layout.read_record().get("self_binds", []))
    done = _remove(layout, log)
    with machine_lock():  # no testbed comes up (binding a share) while the last one down releases it
        # Every self-bind mlchaos made here, this testbed's or another's (the testbed that made one may have gone
        # down while this one still bound it), that no testbed container binds any more.
        self_binds = made_here | set(shared_mounts.remembered())
        if self_binds:
            client = connect()
            try:
                in_use = {
                    str(mount.get("Source", ""))
                    for c in client.containers.list(all=True)
                    if (c.name or "").startswith(PREFIX)
                    for mount in c.attrs.get("Mounts") or []
                }
            finally:
                client.close()
            mounted = shared_mounts.mount_points()
            for bound in sorted(self_binds - in_use):
                if bound in mounted:
                    done.append(shared_mounts.release(Path(bound)))
                    log(done[-1])
                if bound not in shared_mounts.mount_points():
                    shared_mounts.remember(Path(bound), keep=False)
    removed = tb.remove_files((layout.record, layout.inventory))
    if removed:
        done.append(f"removed {removed} testbed file(s) under {layout.state_dir}")
        log(done[-1])
    tb.remove_dir_if_empty(layout.state_dir)
    return done


def down_all(*, log: Callable[[str], None] = tb.ignore) -> list[str]:
    """Remove EVERY Docker testbed's containers and networks on this daemon (``chaos-dtb-*`` with our label),
    whoever made them, and the image. For recovery when a state dir was lost; files stay."""
    return _remove(None, log)


def _remove(layout: Layout | None, log: Callable[[str], None]) -> list[str]:
    import docker.errors
    import requests

    steps = tb.Teardown(log)
    say, fail = steps.say, steps.fail
    client = connect()
    try:
        with machine_lock():
            for container in _ours(client, layout):
                try:
                    # stop first: PID 1 exits on TERM at once, and every process inside dies with it.
                    if container.status == "running":
                        container.stop(timeout=STOP_TIMEOUT_S)
                    container.remove(force=True, v=True)
                    say(f"removed container {container.name}")
                except docker.errors.NotFound:
                    pass
                except (docker.errors.DockerException, requests.RequestException) as exc:
                    fail(f"cannot remove container {container.name}: {exc}")
            for network in _our_networks(client, layout):
                try:
                    network.remove()
                    say(f"removed network {network.name}")
                except docker.errors.NotFound:
                    pass
                except (docker.errors.DockerException, requests.RequestException) as exc:
                    fail(f"cannot remove network {network.name}: {exc}")
            try:
                line = _remove_image(client)
                if line:
                    say(line)
            except (docker.errors.DockerException, requests.RequestException) as exc:
                fail(f"cannot remove image {IMAGE}: {exc}")
    finally:
        client.close()
    return steps.result("docker testbed down")


def _remove_image(client: docker.DockerClient) -> str | None:
    """Remove :data:`IMAGE` unless a container (any, ours or not) still uses it; the line to log, or None."""
    import docker.errors

    try:
        image = client.images.get(IMAGE)
    except docker.errors.ImageNotFound:
        return None
    if (image.labels or {}).get(LABEL) is None:
        return None  # not the image we build: someone else's under our name
    users = client.containers.list(all=True, filters={"ancestor": str(image.id)})
    if users:
        return None
    try:
        client.images.remove(IMAGE)
    except docker.errors.APIError as exc:
        if exc.status_code == 409:  # a container appeared meanwhile: it keeps the image
            return None
        raise
    return f"removed image {IMAGE}"


def status(state_dir: Path | None = None, *, check_exec: bool = True) -> TestbedStatus:
    """What exists of the Docker testbed of ``state_dir``: the network, each container's state and address,
    and (``check_exec``) whether a command runs in it. TestbedError when the daemon is unreachable."""
    import docker.errors

    layout = Layout.at(state_dir)
    record = layout.read_record()
    client = connect()
    try:
        try:
            network: Network | None = client.networks.get(layout.network)
        except docker.errors.NotFound:
            network = None
        subnet = record.get("subnet")
        if network is not None:
            configs = (network.attrs.get("IPAM") or {}).get("Config") or []
            subnet = str(configs[0]["Subnet"]) if configs else subnet
        found = {layout.index_of(c.name or ""): c for c in _ours(client, layout)}
        hosts = [_host_status(layout, index, found.get(index), check_exec) for index in tb.host_indices(record, found)]
    finally:
        client.close()
    return TestbedStatus(
        state_dir=layout.state_dir,
        tag=layout.tag,
        network=layout.network,
        subnet=subnet if isinstance(subnet, str) else None,
        network_exists=network is not None,
        hosts=hosts,
        inventory=layout.inventory if layout.inventory.exists() else None,
    )


def _host_status(layout: Layout, index: int, container: Container | None, check_exec: bool) -> HostStatus:
    from chaos.cluster.docker import DockerTransport

    name = layout.container(index)
    if container is None:
        return HostStatus(f"h{index}", name, "missing", None, False)
    networks = (container.attrs.get("NetworkSettings") or {}).get("Networks") or {}
    address = str((networks.get(layout.network) or {}).get("IPAddress") or "") or None
    ok = False
    if check_exec and container.status == "running":
        host = Host(name=f"h{index}", address=address or "0.0.0.0", transport="docker", container=name)
        try:
            with DockerTransport(host, api_timeout=15) as transport:
                ok = transport.run(["true"], timeout=15).ok
        except TransportError:
            ok = False
    return HostStatus(f"h{index}", name, container.status, address, ok)
