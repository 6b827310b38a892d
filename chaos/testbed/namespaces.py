"""A multi-host testbed on this machine: N network namespaces, each a "host" running a real OpenSSH sshd.

Layout (``T`` is a 4-hex-digit tag derived from the state dir, so testbeds of different state dirs coexist)::

    root namespace                 namespace chaos-tb-T-hub            namespace chaos-tb-T-hN
    chtb-T  10.213.X.1/24  <-veth-> chtb-up ─┐
                                             chtb-br0 (bridge)
                                   chtb-hN ──┘        <-veth->        eth0  10.213.X.(10+N)/24, sshd :22

The bridge lives in its own hub namespace, so the root namespace gets one veth and one connected route and
nothing else: no bridge, no forwarding, no iptables rule (br_netfilter hooks, if loaded, run the HUB's empty
tables). Each host also gets its own UTS namespace, so ``hostname`` answers ``hN``. Hosts share this
machine's filesystem, pid space and clock; only their network stacks (and hostnames) are their own.

Everything created carries the prefix ``chaos-tb`` (namespaces, files) or ``chtb`` (interfaces, whose names
are limited to 15 characters); :func:`down` removes exactly those of one state dir, processes first.
Requires root, iproute2 with ``ip netns``, OpenSSH's sshd and ssh-keygen.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from chaos.cluster.inventory import Host, Inventory, dump_inventory
from chaos.testbed import base as tb
from chaos.testbed import etcd as etcd_host
from chaos.testbed import slurm_daemons
from chaos.testbed.base import HOST_OFFSET as HOST_OFFSET  # re-exported: part of this module's surface
from chaos.testbed.base import INVENTORY as _INVENTORY
from chaos.testbed.base import MAX_HOSTS as MAX_HOSTS  # re-exported: part of this module's surface
from chaos.testbed.system import TestbedError as TestbedError  # re-exported: callers catch it here
from chaos.testbed.system import (
    in_namespace,
    keygen,
    kill_all,
    link_exists,
    live_sshds,
    machine_lock,
    netns_inode,
    netns_pids,
    new_uts,
    pid_of,
    pids_in_netns,
    run,
    used_networks,
    wait_listening,
)

# Not imported as `namespaces`: that name here would shadow this very module for `from chaos.testbed
# import namespaces` (the package's moved-name forwarding found it and warned about a current path).
from chaos.testbed.system import namespaces as netns_names

PREFIX = "chaos-tb"
LINK_PREFIX = "chtb"
SUBNET_PREFIX = "10.213"
SSH_PORT = 22
_PRIVSEP_DIR = Path("/run/sshd")  # sshd refuses to start without it
_NETNS_ETC = Path("/etc/netns")  # per-namespace /etc files that `ip netns exec` mounts (each host's hosts file)
# Marks a /run/sshd that a testbed created; the last testbed down (no sshd left) removes both.
_PRIVSEP_MARK = _PRIVSEP_DIR / ".chaos-tb-created"
_STATE_FILE = "chaos-tb.json"
_KNOWN_HOSTS = "chaos-tb-known_hosts"
_CLIENT_KEY = "chaos-tb-client-key"
_AUTHORIZED_KEYS = "chaos-tb-authorized_keys"
_HOST_KEY = "chaos-tb-host-key"
_SSHD_CONFIG = "sshd_config"
_PID_FILE = "sshd.pid"
_HOST_FILES = (_HOST_KEY, _HOST_KEY + ".pub", _SSHD_CONFIG, _PID_FILE, "sshd.log")


def default_state_dir() -> Path:
    """``<mlchaos state dir>/testbed``."""
    return Layout.default_dir()


def unsupported_reason() -> str | None:
    """Why a testbed cannot be built here (not root, no ``ip netns``, no sshd/ssh-keygen), or None."""
    if os.geteuid() != 0:
        return "the testbed needs root (network namespaces, sshd on port 22)"
    if shutil.which("ip") is None:
        return "iproute2 (`ip`) is not installed"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return f"`ip netns` does not work here: {probe.stderr.strip()}"
    if _sshd() is None:
        return "OpenSSH's sshd is not installed (Debian: openssh-server)"
    if shutil.which("ssh-keygen") is None:
        return "ssh-keygen is not installed (Debian: openssh-client)"
    return None


def _sshd() -> str | None:
    found = shutil.which("sshd") or ("/usr/sbin/sshd" if os.access("/usr/sbin/sshd", os.X_OK) else None)
    # sshd re-executes itself and insists on an absolute path.
    return str(Path(found).resolve()) if found else None


@dataclass(frozen=True)
class Layout(tb.TestbedLayout):
    """Every name and path of the testbed of one state dir (``Layout.of(state_dir)``)."""

    subdir = "testbed"
    state_file = _STATE_FILE
    prefix = PREFIX
    link_prefix = LINK_PREFIX

    # This testbed's words for the shared names: its hosts are namespaces, its link a veth.
    ns_prefix = tb.TestbedLayout.name_prefix
    root_link = tb.TestbedLayout.link
    host_ns = tb.TestbedLayout.host_name

    @property
    def hub(self) -> str:
        return f"{self.name_prefix}hub"

    def mac(self, index: int) -> str:
        """A fixed MAC per host (0: the root side), so a re-made interface meets no stale ARP entries."""
        return f"02:c7:{self.tag[:2]}:{self.tag[2:]}:{index >> 8:02x}:{index & 0xFF:02x}"

    def file(self, name: str, index: int | None = None) -> Path:
        """``state_dir/name``, or ``state_dir/h<index>/name`` for a host's own files."""
        return (self.state_dir if index is None else self.state_dir / f"h{index}") / name


@dataclass(frozen=True)
class HostStatus:
    name: str
    namespace: str
    address: str
    namespace_exists: bool
    sshd_pid: int | None
    reachable: bool  # port 22 accepts a TCP connection from the root namespace

    @property
    def healthy(self) -> bool:
        return self.namespace_exists and self.sshd_pid is not None and self.reachable


@dataclass(frozen=True)
class TestbedStatus:
    """What exists of the testbed of ``state_dir``; ``built`` is False when nothing does."""

    __test__ = False

    state_dir: Path
    tag: str
    subnet: str | None
    root_link: bool
    hub: bool
    hosts: list[HostStatus] = field(default_factory=list)
    inventory: Path | None = None

    @property
    def built(self) -> bool:
        return self.root_link or self.hub or any(h.namespace_exists for h in self.hosts)

    @property
    def healthy(self) -> bool:
        return self.root_link and self.hub and bool(self.hosts) and all(h.healthy for h in self.hosts)


_SSHD_CONFIG_TEXT = """\
# {prefix} host h{index}: written by chaos.testbed.namespaces; removed by `mlchaos testbed down`
ListenAddress {address}:{port}
HostKey "{host_key}"
PidFile "{pid_file}"
AuthorizedKeysFile "{authorized_keys}"
AllowUsers root
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
# The state dir may sit under /tmp, whose world-writable parent StrictModes would refuse.
StrictModes no
UseDNS no
# bash sources ~/.bashrc for every command run over SSH unless SHLVL says it is nested; this machine's root
# .bashrc (pyenv init and the like) would add ~0.2 s to each command and is no part of the "host" anyway.
SetEnv SHLVL=1
PrintMotd no
# Fan-outs open many connections at once; spawn keeps one channel per process.
MaxStartups 100
MaxSessions 100
Subsystem sftp internal-sftp
LogLevel INFO
"""


def _sshd_config_text(layout: Layout, index: int, address: str) -> str:
    if any(c in str(layout.state_dir) for c in '"\n'):
        raise TestbedError(f"the state dir {layout.state_dir!r} cannot hold '\"' or newlines (sshd_config)")
    return _SSHD_CONFIG_TEXT.format(
        prefix=PREFIX,
        index=index,
        address=address,
        port=SSH_PORT,
        host_key=layout.file(_HOST_KEY, index),
        pid_file=layout.file(_PID_FILE, index),
        authorized_keys=layout.file(_AUTHORIZED_KEYS),
    )


def _sshd_pids(layout: Layout, index: int) -> list[int]:
    pid = pid_of(layout.file(_PID_FILE, index), layout.file(_SSHD_CONFIG, index))
    return [pid] if pid is not None else []


# ---------------------------------------------------------------------------------------------------------
# up / down / status.


def up(
    n: int,
    state_dir: Path | None = None,
    *,
    subnet: str | None = None,
    etcd: bool = False,
    log: Callable[[str], None] = tb.ignore,
) -> Inventory:
    """Build (or repair) an ``n``-host testbed and return its inventory, also written to ``inventory.yaml``.
    With ``etcd``, host h``n`` also runs etcd (:mod:`chaos.testbed.etcd`) and is in inventory group ``etcd``;
    without, an etcd an earlier ``up`` started is stopped.

    Idempotent: what exists and is right is kept (keys, namespaces, running sshds), what is missing or
    wrong is (re)made, hosts beyond ``n`` from an earlier, larger testbed are removed. The subnet is chosen
    once (a free ``10.213.X.0/24``, or ``subnet``) and kept. On failure everything built so far stays for
    :func:`down` (or a retry) to handle. Raises TestbedError.
    """
    reason = unsupported_reason()
    if reason is not None:
        raise TestbedError(reason)
    tb.check_host_count(n)
    layout = Layout.at(state_dir)
    layout.state_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with machine_lock():
        record = layout.read_record()
        if record.get("tag", layout.tag) != layout.tag:
            raise TestbedError(f"{layout.record} belongs to a testbed tagged {record.get('tag')}; run down first")
        net = _subnet(layout, record, subnet)
        if not _PRIVSEP_DIR.exists():
            _PRIVSEP_DIR.mkdir(mode=0o755)
            _PRIVSEP_MARK.touch()
        record.update({"tag": layout.tag, "subnet": str(net), "hosts": n})
        layout.write_record(record)  # before anything exists, so down() knows what to look for

        _ensure_hub(layout, net, log)
        keygen(layout.file(_CLIENT_KEY), f"{PREFIX}-{layout.tag} client")
        (layout.file(_AUTHORIZED_KEYS)).write_text(layout.file(_CLIENT_KEY).with_name(_CLIENT_KEY + ".pub").read_text())
        existing = netns_names()
        for stale in sorted(ns for ns in existing if layout.index_of(ns) not in (None, *range(1, n + 1))):
            index = layout.index_of(stale)
            assert index is not None
            _remove_host(layout, index, log)
        sshd = _sshd()
        assert sshd is not None
        _write_hosts_files(layout, net, n)
        for index in range(1, n + 1):
            _ensure_host(layout, index, net, sshd, log)
        for index in range(1, n + 1):  # etcd on the last host when asked, nowhere else
            if etcd and index == n:
                etcd_host.start(layout.file("", index), layout.host_ns(index), tb.host_address(net, index), log=log)
            elif etcd_host.stop(layout.file("", index), log=log):
                log(f"removed h{index}'s etcd")
        known = []
        for index in range(1, n + 1):
            kind, blob = layout.file(_HOST_KEY + ".pub", index).read_text().split()[:2]
            known.append(f"{tb.host_address(net, index)} {kind} {blob}\n")
        layout.file(_KNOWN_HOSTS).write_text("".join(known))
        inventory = Inventory(
            hosts=[
                Host(
                    name=f"h{index}",
                    address=tb.host_address(net, index),
                    port=SSH_PORT,
                    user="root",
                    key_file=layout.file(_CLIENT_KEY),
                    groups=["testbed", *([etcd_host.GROUP] if etcd and index == n else [])],
                    labels={"netns": layout.host_ns(index), "testbed": layout.tag},
                    python=sys.executable,  # hosts share this filesystem, so this interpreter is theirs too
                )
                for index in range(1, n + 1)
            ],
            known_hosts=layout.file(_KNOWN_HOSTS),
        )
        dump_inventory(inventory, layout.inventory)
    log(f"testbed {layout.tag}: {n} host(s) on {net} ready in {time.monotonic() - started:.1f}s")
    return inventory


def _subnet(layout: Layout, record: Mapping[str, object], explicit: str | None) -> ipaddress.IPv4Network:
    known = record.get("subnet")
    if explicit is not None:
        net = ipaddress.IPv4Network(explicit, strict=True)
        if net.prefixlen > 24:
            raise TestbedError(f"subnet {net} is too small; use a /24 or larger")
        if isinstance(known, str) and known != str(net) and link_exists(layout.root_link):
            raise TestbedError(f"this testbed already uses {known}; run down before changing its subnet")
        return net
    if isinstance(known, str):
        return ipaddress.IPv4Network(known)
    return tb.choose_subnet(SUBNET_PREFIX, layout.tag, used_networks(), "here; pass an explicit subnet")


def _ensure_hub(layout: Layout, net: ipaddress.IPv4Network, log: Callable[[str], None]) -> None:
    if layout.hub not in netns_names():
        run(["ip", "netns", "add", layout.hub])
        log(f"created namespace {layout.hub}")
    hub = ["ip", "-n", layout.hub]
    if not link_exists("chtb-br0", layout.hub):
        run([*hub, "link", "add", "chtb-br0", "type", "bridge"])
    run([*hub, "link", "set", "chtb-br0", "up"])
    if not link_exists(layout.root_link):
        root = ["ip", "link", "add", layout.root_link, "address", layout.mac(0)]
        run([*root, "type", "veth", "peer", "name", "chtb-up", "netns", layout.hub])
        log(f"created link {layout.root_link}")
    run([*hub, "link", "set", "chtb-up", "master", "chtb-br0", "up"])
    run(["ip", "addr", "replace", f"{net.network_address + 1}/{net.prefixlen}", "dev", layout.root_link])
    run(["ip", "link", "set", layout.root_link, "up"])


def _ensure_host(layout: Layout, index: int, net: ipaddress.IPv4Network, sshd: str, log: Callable[[str], None]) -> None:
    ns, port = layout.host_ns(index), f"chtb-h{index}"
    address = tb.host_address(net, index)
    config = layout.file(_SSHD_CONFIG, index)
    pid = pid_of(layout.file(_PID_FILE, index), config)
    if pid is not None and not in_namespace(pid, ns):
        # Its namespace was deleted (or replaced) under it: the orphan lives on, with its veth, until every
        # process inside is gone, and no `ip netns pids` can name them any more.
        orphan = netns_inode(pid)
        if orphan is not None:
            count = kill_all(partial(pids_in_netns, orphan))
            log(f"stopped {count} process(es) left in h{index}'s deleted namespace")
        pid = None
    if ns not in netns_names():
        run(["ip", "netns", "add", ns])
        log(f"created namespace {ns}")
    if not link_exists("eth0", ns):
        if link_exists(port, layout.hub):  # the orphan's veth, if the kernel has not reaped it yet
            run(["ip", "-n", layout.hub, "link", "del", port], check=False)
        peer = ["name", "eth0", "netns", ns, "address", layout.mac(index)]
        run(["ip", "link", "add", port, "netns", layout.hub, "type", "veth", "peer", *peer])
    run(["ip", "-n", layout.hub, "link", "set", port, "master", "chtb-br0", "up"])
    run(["ip", "-n", ns, "addr", "replace", f"{address}/{net.prefixlen}", "dev", "eth0"])
    run(["ip", "-n", ns, "link", "set", "lo", "up"])
    run(["ip", "-n", ns, "link", "set", "eth0", "up"])

    layout.file("", index).mkdir(exist_ok=True)
    keygen(layout.file(_HOST_KEY, index), f"{PREFIX}-{layout.tag} h{index}")
    text = _sshd_config_text(layout, index, address)
    changed = not config.exists() or config.read_text() != text
    config.write_text(text)
    if pid is not None and changed:
        kill_all(partial(_sshd_pids, layout, index))
        pid = None
    if pid is None:
        layout.file(_PID_FILE, index).unlink(missing_ok=True)
        log_file = layout.file("sshd.log", index)
        starter = subprocess.Popen(
            ["ip", "netns", "exec", ns, sshd, "-f", str(config), "-E", str(log_file)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            preexec_fn=new_uts(f"h{index}"),
        )
        _, err = starter.communicate(timeout=15)  # sshd forks into the background and its starter exits
        if starter.returncode != 0:
            tail = log_file.read_text(errors="replace")[-500:] if log_file.exists() else ""
            raise TestbedError(f"sshd for h{index} failed to start: {err.decode(errors='replace')}{tail}")
        log(f"started sshd for h{index} on {address}:{SSH_PORT}")
    if not wait_listening(address, SSH_PORT, 10.0):
        raise TestbedError(f"sshd for h{index} is not accepting connections on {address}:{SSH_PORT}")


def _write_hosts_files(layout: Layout, net: ipaddress.IPv4Network, n: int) -> None:
    """``/etc/netns/<host ns>/hosts`` for every host: ``ip netns exec`` (how sshd starts) bind-mounts it over
    ``/etc/hosts`` for that host's processes only, so each host resolves every testbed host's name (``h2``) the
    way a cluster's DNS does (torchft's peers, for one, connect to each other by hostname), and nothing outside
    the testbed sees the names. Written in place, so a running host's mount sees hosts added later."""
    text = "127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n"
    text += "".join(f"{tb.host_address(net, index)} h{index}\n" for index in range(1, n + 1))
    for index in range(1, n + 1):
        folder = _NETNS_ETC / layout.host_ns(index)
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "hosts", "w", encoding="ascii") as handle:
            handle.write(text)


def _remove_netns_etc(ns: str) -> None:
    """Remove the namespace's ``/etc/netns/<ns>`` (its hosts file); never raises."""
    shutil.rmtree(_NETNS_ETC / ns, ignore_errors=True)


def _remove_host(layout: Layout, index: int, log: Callable[[str], None]) -> None:
    ns = layout.host_ns(index)
    killed = kill_all(partial(netns_pids, ns))
    run(["ip", "netns", "del", ns], check=False)
    _remove_netns_etc(ns)
    _remove_host_files(layout, index)
    log(f"removed host h{index} (namespace {ns}, {killed} process(es))")


def down(state_dir: Path | None = None, *, log: Callable[[str], None] = tb.ignore) -> list[str]:
    """Remove everything the testbed of ``state_dir`` made: its Slurm (:mod:`chaos.testbed.slurm`),
    processes in its namespaces (sshd and whatever ran over SSH), the namespaces, the root veth, its files;
    safe when half built or already down.

    Returns what was removed, one line each. Every step is tried even when an earlier one fails; then a
    TestbedError lists the failures.
    """
    layout = Layout.at(state_dir)
    steps = tb.Teardown(log)
    say, fail = steps.say, steps.fail
    tag = layout.read_record().get("tag", layout.tag)
    if tag != layout.tag:
        raise TestbedError(f"{layout.record} names testbed {tag}, not {layout.tag}; remove it by hand")
    slurm = slurm_daemons.SlurmLayout.of(layout.state_dir, layout.tag, PREFIX)
    if slurm_daemons.present(slurm):  # first: its controller and munged live outside the namespaces
        try:
            steps.done += slurm_daemons.down(slurm, layout.ns_prefix, log=log)
        except TestbedError as exc:
            fail(str(exc))
    with machine_lock():
        ours = [ns for ns in netns_names() if ns.startswith(layout.ns_prefix)]
        # Hosts before the hub: a host's veth peer lives in the hub, and nothing should see the hub vanish first.
        for ns in sorted(ours, key=lambda name: name == layout.hub):
            try:
                count = kill_all(partial(netns_pids, ns))
                run(["ip", "netns", "del", ns])
                _remove_netns_etc(ns)
                say(f"deleted namespace {ns}" + (f" (stopped {count} process(es))" if count else ""))
            except TestbedError as exc:
                fail(str(exc))
        for index in _host_dirs(layout):
            pid = pid_of(layout.file(_PID_FILE, index), layout.file(_SSHD_CONFIG, index))
            orphan = netns_inode(pid) if pid is not None else None
            if orphan is not None:  # its namespace was deleted by hand: it and its sessions are still ours
                try:
                    count = kill_all(partial(pids_in_netns, orphan))
                    say(f"stopped {count} process(es) left in h{index}'s deleted namespace")
                except TestbedError as exc:
                    fail(str(exc))
        # Deleting the hub normally takes the veth with it, but the kernel does that asynchronously.
        if link_exists(layout.root_link):
            gone = run(["ip", "link", "del", layout.root_link], check=False)
            if gone.returncode == 0:
                say(f"deleted link {layout.root_link}")
            elif link_exists(layout.root_link):
                fail(f"cannot delete link {layout.root_link}: {gone.stderr.strip()}")
        try:
            if _remove_privsep_dir():
                say(f"removed {_PRIVSEP_DIR}")
        except OSError as exc:
            fail(f"cannot remove {_PRIVSEP_DIR}: {exc}")
    removed = _remove_files(layout)
    if removed:
        say(f"removed {removed} testbed file(s) under {layout.state_dir}")
    return steps.result("testbed down")


def _remove_privsep_dir() -> bool:
    """Remove /run/sshd if a testbed created it and no sshd is left to need it; True if removed."""
    if not _PRIVSEP_MARK.exists() or live_sshds():
        return False
    try:
        _PRIVSEP_MARK.unlink()
        _PRIVSEP_DIR.rmdir()
    except FileNotFoundError:  # another testbed's down got there first
        return False
    return True


def _remove_host_files(layout: Layout, index: int) -> int:
    count = tb.remove_files(layout.file(name, index) for name in _HOST_FILES)
    count += etcd_host.remove(layout.file("", index))  # its process went with the namespace's
    tb.remove_dir_if_empty(layout.file("", index))  # someone's own files there are theirs to keep
    return count


def _remove_files(layout: Layout) -> int:
    """Delete the files the testbed wrote (never anything else in the folder); rmdir it if left empty."""
    names = (_STATE_FILE, _INVENTORY, _KNOWN_HOSTS, _CLIENT_KEY, _CLIENT_KEY + ".pub", _AUTHORIZED_KEYS)
    count = tb.remove_files(layout.file(name) for name in names)
    for index in _host_dirs(layout):
        count += _remove_host_files(layout, index)
    tb.remove_dir_if_empty(layout.state_dir)
    return count


def _host_dirs(layout: Layout) -> list[int]:
    if not layout.state_dir.is_dir():
        return []
    return sorted(int(p.name[1:]) for p in layout.state_dir.glob("h[0-9]*") if p.is_dir() and p.name[1:].isdigit())


def down_all(*, log: Callable[[str], None] = tb.ignore) -> list[str]:
    """Remove EVERY testbed's namespaces and root links on this machine (``chaos-tb-*``, ``chtb-*``), and
    every testbed's Slurm daemons, including other users' and other state dirs'. For recovery when a state
    dir was lost; files stay."""
    done = slurm_daemons.down_all(log=log)  # first: controllers and munged live outside the namespaces
    with machine_lock():
        for ns in sorted((n for n in netns_names() if n.startswith(PREFIX + "-")), key=lambda n: n.endswith("-hub")):
            count = kill_all(partial(netns_pids, ns))
            run(["ip", "netns", "del", ns])
            _remove_netns_etc(ns)
            done.append(f"deleted namespace {ns}" + (f" (stopped {count} process(es))" if count else ""))
            log(done[-1])
        links = json.loads(run(["ip", "-j", "link", "show"]).stdout or "[]")
        for link in links:
            name = str(link.get("ifname", ""))
            if name.startswith(LINK_PREFIX + "-"):
                run(["ip", "link", "del", name], check=False)
                done.append(f"deleted link {name}")
                log(done[-1])
        if _remove_privsep_dir():
            done.append(f"removed {_PRIVSEP_DIR}")
            log(done[-1])
    return done


def status(state_dir: Path | None = None) -> TestbedStatus:
    """What exists of the testbed of ``state_dir`` and whether each host's sshd answers."""
    layout = Layout.at(state_dir)
    record = layout.read_record()
    present = set(netns_names()) if unsupported_reason() is None else set()
    subnet = record.get("subnet")
    net = ipaddress.IPv4Network(subnet) if isinstance(subnet, str) else None
    hosts = []
    for index in tb.host_indices(record, (layout.index_of(ns) for ns in present)):
        address = tb.host_address(net, index) if net is not None else ""
        pid = pid_of(layout.file(_PID_FILE, index), layout.file(_SSHD_CONFIG, index))
        hosts.append(
            HostStatus(
                name=f"h{index}",
                namespace=layout.host_ns(index),
                address=address,
                namespace_exists=layout.host_ns(index) in present,
                sshd_pid=pid,
                reachable=bool(address) and pid is not None and wait_listening(address, SSH_PORT, 1.0),
            )
        )
    return TestbedStatus(
        state_dir=layout.state_dir,
        tag=layout.tag,
        subnet=str(net) if net is not None else None,
        root_link=link_exists(layout.root_link),
        hub=layout.hub in present,
        hosts=hosts,
        inventory=layout.inventory if layout.inventory.exists() else None,
    )
