"""Network faults against REAL network namespaces: a bridge with three hosts, real iptables and tc, real packets.

Topology (created here, deleted in the module fixture's ``finally``)::

    chaos-nt-<id>-a  10.214.N.1 --+
    chaos-nt-<id>-b  10.214.N.2 --+-- br0 in chaos-nt-<id>-hub
    chaos-nt-<id>-c  10.214.N.3 --+

Every host runs a small server (UDP echo on 9000, TCP sink on 9001). Reachability is judged by real
datagrams and connections started inside the namespaces; every test leaves no chain, rule or qdisc behind.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from capabilities import kernel_has, requires
from pydantic import BaseModel, ValidationError
from support import chains_left_since, pids_where, root_chains

from chaos.cluster.base import Completed
from chaos.cluster.local import process_state
from chaos.cluster.netns import NetnsTransport
from chaos.plugins import registry
from chaos.plugins.injector import Applied, FaultOp, InjectionContext, InjectionError, Unsupported
from injectors.network import iptables as netfilter
from injectors.network import tc as netshape
from injectors.network.faults import (
    BandwidthInjector,
    BandwidthParams,
    DelayInjector,
    DelayParams,
    DropLargePacketsInjector,
    DropLargeParams,
    FlapInjector,
    FlapParams,
    JitterInjector,
    JitterParams,
    PacketLossInjector,
    PacketLossParams,
    PartitionInjector,
    PartitionParams,
)

PREFIX = "chaos-nt-"
UDP_PORT, TCP_PORT = 9000, 9001

# One script, several roles, run with this interpreter inside a namespace (no ping/nc needed on the host).
PROBE = r"""
import socket, sys, threading, time
mode, args = sys.argv[1], sys.argv[2:]
if mode == "serve":  # UDP echo + TCP sink (reads to EOF, answers one byte) until killed
    def tcp():
        srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("0.0.0.0", int(args[1]))); srv.listen()
        while True:
            conn, _ = srv.accept()
            while conn.recv(65536):
                pass
            conn.sendall(b"k"); conn.close()
    threading.Thread(target=tcp, daemon=True).start()
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); udp.bind(("0.0.0.0", int(args[0])))
    print("ready", flush=True)
    while True:
        data, peer = udp.recvfrom(65535); udp.sendto(data, peer)
elif mode == "echo":  # exit 0 when one of `tries` datagrams of `size` bytes comes back
    host, port, size, timeout, tries = args[0], int(args[1]), int(args[2]), float(args[3]), int(args[4])
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(timeout)
    for _ in range(tries):
        try:  # a DROP in OUTPUT makes sendto itself fail (EPERM)
            s.sendto(b"x" * size, (host, port))
            if len(s.recvfrom(65535)[0]) == size:
                sys.exit(0)
        except OSError:  # includes socket.timeout
            time.sleep(timeout if not isinstance(sys.exc_info()[1], socket.timeout) else 0)
    sys.exit(1)
elif mode == "timeline":  # one echo every `interval` for `seconds`: prints 1 (answered) / 0 per probe
    host, port, seconds, interval = args[0], int(args[1]), float(args[2]), float(args[3])
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(interval * 0.8)
    out, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        start = time.monotonic()
        try:
            s.sendto(b"t", (host, port))
            while s.recvfrom(64)[0] != b"t":
                pass
            out.append("1")
        except OSError:  # timeout, or EPERM from a DROP in OUTPUT
            out.append("0")
        time.sleep(max(0.0, interval - (time.monotonic() - start)))
    print("".join(out))
elif mode == "recv":  # exit 0 when a datagram arrives on `port` within `timeout`
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("0.0.0.0", int(args[0])))
    s.settimeout(float(args[1])); print("ready", flush=True)
    try:
        s.recvfrom(65535); sys.exit(0)
    except socket.timeout:
        sys.exit(1)
elif mode == "send":  # fire `count` datagrams at host:port, 50 ms apart
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for _ in range(int(args[2])):
        try:
            s.sendto(b"one-way", (args[0], int(args[1])))
        except OSError:  # EPERM from a DROP in OUTPUT: that datagram is lost, as intended
            pass
        time.sleep(0.05)
elif mode == "tcp":  # send `nbytes` over TCP, wait for the sink's answer; prints seconds taken
    start = time.monotonic(); c = socket.create_connection((args[0], int(args[1])), timeout=30)
    c.sendall(b"x" * int(args[2])); c.shutdown(socket.SHUT_WR); c.recv(1)
    print(time.monotonic() - start)
"""


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, check=check, timeout=60)


pytestmark = requires("root", "ip", "iptables", "tc")


@dataclass
class Net:
    hub: str
    names: dict[str, str]  # a/b/c -> namespace
    addrs: dict[str, str]  # a/b/c -> address
    servers: list[subprocess.Popen[bytes]]

    def transport(self, host: str) -> NetnsTransport:
        return NetnsTransport(self.names[host])

    def ctx(self, host: str) -> InjectionContext:
        return InjectionContext(transport=self.transport(host))

    def py(self, host: str, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        argv = ["ip", "netns", "exec", self.names[host], sys.executable, "-c", PROBE, *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)

    def echo(self, src: str, dst: str, size: int = 64, *, timeout: float = 0.25, tries: int = 3) -> bool:
        """A UDP round trip of ``size`` bytes from ``src`` to ``dst`` and back succeeds."""
        return self.py(src, "echo", self.addrs[dst], str(UDP_PORT), str(size), str(timeout), str(tries)).returncode == 0

    def connects(self, src: str, dst: str) -> bool:
        """A TCP connection from ``src`` to ``dst``'s sink is established within half a second."""
        code = "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=0.5)"
        argv = ["ip", "netns", "exec", self.names[src], sys.executable, "-c", code, self.addrs[dst], str(TCP_PORT)]
        return subprocess.run(argv, capture_output=True, check=False, timeout=10).returncode == 0

    def delivered(self, src: str, dst: str) -> bool:
        """A datagram sent from ``src`` arrives at ``dst`` (one direction only, no reply needed)."""
        argv = ["ip", "netns", "exec", self.names[dst], sys.executable, "-c", PROBE, "recv", "9100", "0.8"]
        receiver = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        try:
            assert receiver.stdout is not None and receiver.stdout.readline().strip() == "ready"
            self.py(src, "send", self.addrs[dst], "9100", "5")
            return receiver.wait(timeout=10) == 0
        finally:
            receiver.kill()
            receiver.wait()

    def leftovers(self, host: str) -> list[str]:
        transport = self.transport(host)
        found = netfilter.leftovers(lambda argv: transport.run(argv))
        root = netshape.root_qdisc(lambda argv: transport.run(argv), "eth0")
        if root is not None and root[1] != "0:":
            found.append(f"qdisc {root}")
        return found


def _namespaces() -> list[str]:
    return [line.split()[0] for line in sh("ip", "netns", "list").stdout.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def net() -> Iterator[Net]:
    tag = uuid.uuid4().hex[:6]
    subnet = f"10.214.{os.getpid() % 200 + 20}"
    hub = f"{PREFIX}{tag}-hub"
    names = {host: f"{PREFIX}{tag}-{host}" for host in "abc"}
    addrs = {host: f"{subnet}.{index + 1}" for index, host in enumerate("abc")}
    created: list[str] = []
    servers: list[subprocess.Popen[bytes]] = []
    chains = root_chains()  # other runs' (parallel test workers): not ours to judge
    try:
        for ns in (hub, *names.values()):
            sh("ip", "netns", "add", ns)
            created.append(ns)
        sh("ip", "-n", hub, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", hub, "link", "set", "br0", "up")
        for host, ns in names.items():
            port = f"v{host}"
            sh("ip", "link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", port, "netns", hub)
            sh("ip", "-n", hub, "link", "set", port, "master", "br0", "up")
            sh("ip", "-n", ns, "addr", "add", f"{addrs[host]}/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        for ns in names.values():
            argv = ["ip", "netns", "exec", ns, sys.executable, "-c", PROBE, "serve", str(UDP_PORT), str(TCP_PORT)]
            server = subprocess.Popen(argv, stdout=subprocess.PIPE)
            servers.append(server)
            assert server.stdout is not None and server.stdout.readline().strip() == b"ready"
        topology = Net(hub, names, addrs, servers)
        deadline = time.monotonic() + 10  # the bridge forwards once its ports leave the learning state
        while not (topology.echo("a", "b") and topology.echo("a", "c") and topology.echo("b", "c")):
            assert time.monotonic() < deadline, "the test bridge never started forwarding"
        yield topology
    finally:
        for server in servers:
            server.kill()
            server.wait()
        for ns in reversed(created):
            sh("ip", "netns", "del", ns, check=False)
        # Nothing of ours may survive the module: none of its namespaces, no chain leaked into the root namespace.
        assert not [ns for ns in _namespaces() if ns.startswith(f"{PREFIX}{tag}-")]
        assert not chains_left_since(chains), "a chain leaked into the root namespace"


@pytest.fixture(autouse=True)
def _clean(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each topology test: no CHAOS chain, mlchaos rule or qdisc of ours on any host (then scrub)."""
    yield
    if "net" not in request.fixturenames:
        return
    topology: Net = request.getfixturevalue("net")
    left = {host: topology.leftovers(host) for host in "abc"}
    for host, ns in topology.names.items():
        if left[host]:  # scrub so one failure does not cascade into every later test
            sh("ip", "netns", "exec", ns, "iptables", "-F", check=False)
            sh("ip", "netns", "exec", ns, "iptables", "-X", check=False)
            sh("ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", "eth0", "root", check=False)
    assert not any(left.values()), f"left behind: {left}"


def running(pid: int) -> bool:
    """Alive and not a zombie (a detached helper is reaped by init, whenever init gets to it)."""
    return process_state(pid) not in (None, "Z")


def op(injector: str, params: BaseModel, duration_s: float | None = None) -> FaultOp:
    return FaultOp(
        op_id=f"op-{uuid.uuid4().hex[:8]}", fault="f", injector=injector, params=params, duration_s=duration_s
    )


def inject(injector: object, ctx: InjectionContext, fault: FaultOp) -> Applied:
    """check -> prepare -> apply, as the runner drives it."""
    assert hasattr(injector, "check") and hasattr(injector, "prepare") and hasattr(injector, "apply")
    injector.check(ctx, fault.params)
    applied: Applied = injector.prepare(ctx, fault)
    injector.apply(ctx, applied)
    return applied


# -- params (pure) ----------------------------------------------------------------------------------------------


def test_params_validate_peers_ports_and_rates() -> None:
    params = PartitionParams(peers=["10.0.0.2", "10.0.1.7/24", "10.0.0.2/32"])
    assert params.peers == ["10.0.0.2", "10.0.1.0/24"]
    with pytest.raises(ValidationError, match="not an IP address"):
        PartitionParams(peers=["db-1"])
    with pytest.raises(ValidationError, match="only IPv4"):
        PartitionParams(peers=["fe80::1"])
    with pytest.raises(ValidationError):
        PartitionParams(peers=[])
    with pytest.raises(ValidationError, match="icmp has no ports"):
        PartitionParams(peers=["10.0.0.2"], protocol="icmp", ports=[22])
    with pytest.raises(ValidationError, match="extra"):
        PartitionParams.model_validate({"peers": ["10.0.0.2"], "peer": "x"})
    assert BandwidthParams(peers=["10.0.0.2"], rate="10mbit").rate == 10_000_000
    with pytest.raises(ValidationError, match="not a rate"):
        BandwidthParams(peers=["10.0.0.2"], rate="10mbps")
    with pytest.raises(ValidationError, match="give `peers` or an `interface`"):
        BandwidthParams(rate="1mbit")
    with pytest.raises(ValidationError, match="valid network interface"):
        BandwidthParams(interface="eth0; reboot", rate="1mbit")
    with pytest.raises(ValidationError, match="needs a jitter"):
        DelayParams(peers=["10.0.0.2"], delay="10ms", distribution="normal")
    assert PacketLossParams(peers=["10.0.0.2"], probability=0.25).direction == "both"
    assert DropLargeParams(peers=["10.0.0.2"]).min_size == 1024


def test_registered_and_revert_names_are_validated() -> None:
    names = registry.injectors()
    for name in ("partition", "packet_loss", "drop_large_packets", "flap", "bandwidth", "delay", "jitter"):
        assert name in names
    with pytest.raises(InjectionError, match="not an mlchaos chain"):
        netfilter.revert_argv(["CHAOS-abc; rm -rf /"], sudo=False)
    with pytest.raises(InjectionError, match="not a valid network interface"):
        netshape.revert_argv("eth0 $(x)", "1a2b:", sudo=False)
    argv = netfilter.revert_argv(["CHAOS-0123456789-in"], sudo=True)
    assert argv[:4] == ["sudo", "-n", "sh", "-c"] and argv[4] == netfilter.REVERT_SCRIPT
    assert argv[5:] == ["mlchaos-netrevert", "CHAOS-0123456789-in"]


def test_restore_texts_batch_exactly_what_install_and_heal_do() -> None:
    odd = 'say "hi" \\ there'
    specs = netfilter.chains_from_state(
        {
            "chains": [
                {"chain": "CHAOS-0123456789-in", "hook": "INPUT", "rules": [["-s", "10.0.0.2", "-j", "DROP"]]},
                {
                    "chain": "CHAOS-0123456789-out",
                    "hook": "OUTPUT",
                    "rules": [["-d", "10.0.0.2", "-m", "comment", "--comment", odd, "-j", "DROP"]],
                },
            ]
        }
    )
    assert netfilter.install_text(specs, "mlchaos:op-1", bypass=True).splitlines() == [
        "*filter",
        "-N CHAOS-0123456789-in",
        "-A CHAOS-0123456789-in -m comment --comment mlchaos-flap-up -j RETURN",
        "-A CHAOS-0123456789-in -s 10.0.0.2 -j DROP",
        "-N CHAOS-0123456789-out",
        "-A CHAOS-0123456789-out -m comment --comment mlchaos-flap-up -j RETURN",
        '-A CHAOS-0123456789-out -d 10.0.0.2 -m comment --comment "say \\"hi\\" \\\\ there" -j DROP',
        "-I INPUT 1 -m comment --comment mlchaos:op-1 -j CHAOS-0123456789-in",
        "-I OUTPUT 1 -m comment --comment mlchaos:op-1 -j CHAOS-0123456789-out",
        "COMMIT",
    ]
    assert netfilter.uninstall_text(specs, "mlchaos:op-1").splitlines() == [
        "*filter",
        "-D INPUT -m comment --comment mlchaos:op-1 -j CHAOS-0123456789-in",
        "-D OUTPUT -m comment --comment mlchaos:op-1 -j CHAOS-0123456789-out",
        "-F CHAOS-0123456789-in",
        "-X CHAOS-0123456789-in",
        "-F CHAOS-0123456789-out",
        "-X CHAOS-0123456789-out",
        "COMMIT",
    ]
    # A (corrupt) journal word that would end the line and start a command of its own is refused.
    evil = [netfilter.ChainSpec("CHAOS-0123456789-in", "INPUT", [["-s", "10.0.0.2\n-P INPUT DROP", "-j", "DROP"]])]
    with pytest.raises(InjectionError, match="iptables-restore line"):
        netfilter.install_text(evil, "mlchaos:op-1")
    with pytest.raises(InjectionError, match="iptables-restore line"):
        netfilter.uninstall_text(specs, "mlchaos:op-1\nCOMMIT")


# -- partition --------------------------------------------------------------------------------------------------


def test_partition_cuts_only_the_peers_and_heals_idempotently(net: Net) -> None:
    ctx, injector = net.ctx("a"), PartitionInjector()
    applied = inject(injector, ctx, op("partition", PartitionParams(peers=[net.addrs["b"]])))
    assert applied.description == f"partition {net.addrs['a']} <-> {net.addrs['b']} (both directions)"
    assert not net.echo("a", "b") and not net.echo("b", "a")
    assert net.echo("a", "c")  # a non-peer is untouched
    rules = net.transport("a").run(["iptables", "-S"]).stdout
    assert f'--comment "mlchaos:{applied.op_id}"' in rules or f"--comment mlchaos:{applied.op_id}" in rules
    chains = {spec.chain for spec in netfilter.chains_from_state(applied.state)}
    assert all(chain.startswith("CHAOS-") and len(chain) <= 28 for chain in chains)
    assert sum("-A CHAOS-" in line and "DROP" in line for line in rules.splitlines()) == 2  # only in our chains
    injector.heal(ctx, applied)
    injector.heal(ctx, applied)  # twice is safe
    assert net.echo("a", "b") and net.echo("b", "a")
    assert "CHAOS" not in net.transport("a").run(["iptables", "-S"]).stdout


@pytest.mark.parametrize("direction", ["in", "out"])
def test_one_way_partition_blocks_one_direction(net: Net, direction: str) -> None:
    ctx, injector = net.ctx("a"), PartitionInjector()
    params = PartitionParams(peers=[net.addrs["b"]], direction=direction)
    applied = inject(injector, ctx, op("partition", params))
    try:
        arrow = "<-" if direction == "in" else "->"
        assert f" {arrow} {net.addrs['b']}" in applied.description
        assert net.delivered("b", "a") is (direction == "out")
        assert net.delivered("a", "b") is (direction == "in")
    finally:
        injector.heal(ctx, applied)
    assert net.delivered("b", "a") and net.delivered("a", "b")


def test_heal_from_journal_alone_removes_every_copy_of_the_jump(net: Net) -> None:
    ctx = net.ctx("a")
    first = PartitionInjector()
    applied = inject(first, ctx, op("partition", PartitionParams(peers=[net.addrs["b"], net.addrs["c"]])))
    first.apply(ctx, applied)  # a retried apply adds no second jump ...
    chain_in = next(spec.chain for spec in netfilter.chains_from_state(applied.state) if spec.hook == "INPUT")
    # ... but someone (or a half-crashed tool) may still have added copies, with other specs too.
    net.transport("a").run(["iptables", "-A", "INPUT", "-j", chain_in], check=True)
    net.transport("a").run(["iptables", "-I", "FORWARD", "-s", "10.9.9.9", "-j", chain_in], check=True)
    assert not net.echo("a", "b") and not net.echo("a", "c")
    journaled = Applied.model_validate_json(applied.model_dump_json())  # a fresh process after a crash
    PartitionInjector().heal(net.ctx("a"), journaled)
    assert net.echo("a", "b") and net.echo("a", "c")
    PartitionInjector().heal(net.ctx("a"), journaled)


class _Recording:
    """A transport that records every argv (and ``put`` as ``["<put>", path]``) before running it."""

    def __init__(self, inner: NetnsTransport) -> None:
        self.inner, self.host, self.calls = inner, inner.host, list[list[str]]()

    def run(self, argv: list[str], *, timeout: float = 30.0, check: bool = False) -> Completed:
        self.calls.append(list(argv))
        return self.inner.run(argv, timeout=timeout, check=check)

    def put(self, data: bytes, path: str) -> None:
        self.calls.append(["<put>", path])
        self.inner.put(data, path)

    def clock_offset(self) -> float:
        return 0.0


def _save(net: Net, host: str) -> list[str]:
    """``iptables-save`` of the filter table without its timestamp comments and packet counters."""
    text = net.transport(host).run(["iptables-save", "-t", "filter"], check=True).stdout
    return [line.split(" [", 1)[0] for line in text.splitlines() if not line.startswith("#")]


def _batching(net: Net) -> None:
    run = net.transport("a").run
    if netfilter.restore_backend(lambda argv: run(argv)) != netfilter.backend(lambda argv: run(argv)):
        pytest.skip("iptables-restore is missing or uses another backend than iptables here")


def test_partition_is_one_restore_each_way_and_leaves_iptables_save_as_it_was(net: Net) -> None:
    _batching(net)
    before = _save(net, "a")
    host = _Recording(net.transport("a"))
    ctx, injector = InjectionContext(transport=host), PartitionInjector()  # type: ignore[arg-type]
    params = PartitionParams(peers=[net.addrs["b"], net.addrs["c"]], protocol="udp", ports=[UDP_PORT, 9100])
    applied = inject(injector, ctx, op("partition", params))
    assert applied.state["restore"] is True
    assert not net.echo("a", "b") and not net.echo("a", "c") and net.connects("a", "b")
    assert _save(net, "a") != before
    injector.heal(ctx, applied)
    assert net.echo("a", "b") and _save(net, "a") == before
    changes = [argv for argv in host.calls if argv[0].startswith("iptables") and not {"-V", "-C"} & set(argv)]
    assert [argv[:4] for argv in changes] == [["iptables-restore", "-w", "5", "--noflush"]] * 2, changes
    files = [argv[1] for argv in host.calls if argv[0] == "<put>"]
    assert len(files) == 2 and all(f"{applied.op_id}-" in path for path in files)
    assert not [path for path in files if Path(path).exists()]  # every rules file was removed
    injector.heal(ctx, applied)  # a second heal: the batch cannot commit, the listing finds nothing
    assert _save(net, "a") == before


def test_retried_apply_adds_nothing_and_an_odd_comment_round_trips(net: Net) -> None:
    _batching(net)
    ctx, injector = net.ctx("a"), PartitionInjector()
    applied = inject(injector, ctx, op("partition", PartitionParams(peers=[net.addrs["b"]])))
    injector.apply(ctx, applied)  # the chains exist: the batch fails whole, the command path adds no copy
    rules = net.transport("a").run(["iptables", "-S"]).stdout.splitlines()
    assert sum(line.startswith(("-A INPUT", "-A OUTPUT")) and "CHAOS-" in line for line in rules) == 2
    assert sum(line.startswith("-A CHAOS-") for line in rules) == 2
    injector.heal(ctx, applied)
    # A comment needing restore's quoting is written and deleted by the batches, not by the fallback.
    transport = net.transport("a")
    run = lambda argv: transport.run(argv)  # noqa: E731
    loads: list[bool] = []
    batch = netfilter.file_restore(run, transport.put, "odd")

    def restore(text: str) -> bool:
        loads.append(batch(text))
        return loads[-1]

    odd = 'it\'s "odd" \\ $x #1'
    specs = [
        netfilter.ChainSpec(
            netfilter.chain_names("odd", "a", ["in"])["in"], "INPUT", [["-s", "10.9.9.9", "-j", "DROP"]]
        )
    ]
    netfilter.install(run, specs, odd, restore=restore)
    jump = ["-m", "comment", "--comment", odd, "-j", specs[0].chain]
    assert transport.run(["iptables", "-C", "INPUT", *jump]).ok  # stored word for word
    netfilter.uninstall(run, specs, odd, restore=restore)
    assert loads == [True, True] and not net.leftovers("a")


def test_revert_command_alone_heals_a_partition(net: Net) -> None:
    ctx, injector = net.ctx("a"), PartitionInjector()
    applied = inject(injector, ctx, op("partition", PartitionParams(peers=[net.addrs["b"]])))
    assert not net.echo("a", "b")
    revert = injector.revert_command(applied)
    assert revert is not None and revert[:2] == ["sh", "-c"]
    done = sh("ip", "netns", "exec", net.names["a"], *revert, check=False)  # what a host-side dead-man runs
    assert done.returncode == 0, done.stderr
    assert net.echo("a", "b")
    assert sh("ip", "netns", "exec", net.names["a"], *revert, check=False).returncode == 0  # and again: no-op
    injector.heal(ctx, applied)


def test_partition_of_one_tcp_port(net: Net) -> None:
    ctx, injector = net.ctx("a"), PartitionInjector()
    params = PartitionParams(peers=[net.addrs["b"]], protocol="tcp", ports=[TCP_PORT])
    applied = inject(injector, ctx, op("partition", params))
    try:
        assert applied.description.endswith(f", tcp port {TCP_PORT}")
        assert net.connects("a", "c")
        assert net.echo("a", "b")  # UDP still flows
        assert not net.connects("a", "b")  # the TCP port does not
    finally:
        injector.heal(ctx, applied)
    assert net.connects("a", "b")


# -- packet_loss / drop_large_packets ---------------------------------------------------------------------------


def test_packet_loss_all_and_nothing(net: Net) -> None:
    ctx, injector = net.ctx("a"), PacketLossInjector()
    applied = inject(injector, ctx, op("packet_loss", PacketLossParams(peers=[net.addrs["b"]], probability=1.0)))
    try:
        assert applied.description.startswith("drop 100% of packets")
        assert not net.echo("a", "b")
    finally:
        injector.heal(ctx, applied)
    applied = inject(injector, ctx, op("packet_loss", PacketLossParams(peers=[net.addrs["b"]], probability=0.0)))
    try:
        assert net.echo("a", "b", tries=5)
    finally:
        injector.heal(ctx, applied)


def test_drop_large_packets_passes_small_probes(net: Net) -> None:
    ctx, injector = net.ctx("a"), DropLargePacketsInjector()
    applied = inject(injector, ctx, op("drop_large_packets", DropLargeParams(peers=[net.addrs["b"]])))
    try:
        assert applied.description.startswith("drop packets >= 1024 bytes")
        assert net.echo("a", "b", 64)  # the health check stays green ...
        assert not net.echo("a", "b", 1400)  # ... while real payloads vanish
    finally:
        injector.heal(ctx, applied)
    assert net.echo("a", "b", 1400)


# -- flap -------------------------------------------------------------------------------------------------------


def test_flap_alternates_and_ends_healed(net: Net) -> None:
    ctx, injector = net.ctx("a"), FlapInjector()
    params = FlapParams(peers=[net.addrs["b"]], period=1.0, down_fraction=0.5)
    applied = inject(injector, ctx, op("flap", params, duration_s=3.0))
    helper = applied.state["helper_pid"]
    assert isinstance(helper, int)
    timeline = net.py("a", "timeline", net.addrs["b"], str(UDP_PORT), "3.0", "0.1").stdout.strip()
    assert "01" in timeline and "10" in timeline, timeline  # went down and came back up, at least once each
    deadline = time.monotonic() + 5
    while running(helper) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running(helper), "the flap helper did not end at its deadline"
    assert not net.leftovers("a") and net.echo("a", "b")  # it healed by itself
    injector.heal(ctx, applied)  # and heal afterwards is a no-op


def test_flap_heal_stops_the_helper_early(net: Net) -> None:
    ctx, injector = net.ctx("a"), FlapInjector()
    params = FlapParams(peers=[net.addrs["b"]], period=0.4, down_fraction=0.5)
    applied = inject(injector, ctx, op("flap", params, duration_s=60.0))
    helper = applied.state.pop("helper_pid")  # as if the harness died before journaling the pid
    time.sleep(0.3)
    FlapInjector().heal(ctx, applied)
    assert isinstance(helper, int) and not running(helper)
    assert net.echo("a", "b")


# -- tc ---------------------------------------------------------------------------------------------------------


def test_bandwidth_slows_a_transfer_and_heal_removes_the_qdisc(net: Net) -> None:
    size = "500000"
    baseline = float(net.py("a", "tcp", net.addrs["b"], str(TCP_PORT), size).stdout)
    ctx, injector = net.ctx("a"), BandwidthInjector()
    params = BandwidthParams(peers=[net.addrs["b"]], rate="4mbit")
    applied = inject(injector, ctx, op("bandwidth", params))
    try:
        assert applied.description.startswith("limit to 4mbit:") and "on eth0" in applied.description
        shaped = float(net.py("a", "tcp", net.addrs["b"], str(TCP_PORT), size).stdout)
        other = float(net.py("a", "tcp", net.addrs["c"], str(TCP_PORT), size).stdout)
    finally:
        injector.heal(ctx, applied)
    assert shaped > 0.5 and shaped > 5 * baseline, (baseline, shaped)  # 4 Mbit/s: about 1 s for 500 kB
    assert other < shaped / 3, (other, shaped)  # the htb filter shapes only the peer
    assert netshape.root_qdisc(lambda argv: net.transport("a").run(argv), "eth0") == ("noqueue", "0:")
    injector.heal(ctx, applied)


def test_bandwidth_without_peers_shapes_the_interface_with_tbf(net: Net) -> None:
    ctx, injector = net.ctx("a"), BandwidthInjector()
    params = BandwidthParams(interface="eth0", rate="8mbit")
    applied = inject(injector, ctx, op("bandwidth", params))
    assert applied.state["kind"] == "tbf"
    shown = net.transport("a").run(["tc", "qdisc", "show", "dev", "eth0"]).stdout
    assert f"tbf {applied.state['handle']} root" in shown
    revert = injector.revert_command(applied)
    assert revert is not None
    assert sh("ip", "netns", "exec", net.names["a"], *revert, check=False).returncode == 0
    assert sh("ip", "netns", "exec", net.names["a"], *revert, check=False).returncode == 0
    injector.heal(ctx, applied)


def test_bandwidth_refuses_an_interface_with_a_configured_qdisc(net: Net) -> None:
    theirs = ["tc", "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "tbf", "rate", "1gbit", "burst", "64kb"]
    transport = net.transport("c")
    transport.run([*theirs, "latency", "10ms"], check=True)
    try:
        with pytest.raises(Unsupported, match="already has a configured root qdisc"):
            BandwidthInjector().check(net.ctx("c"), BandwidthParams(interface="eth0", rate="1mbit"))
        assert netshape.root_qdisc(lambda argv: transport.run(argv), "eth0") == ("tbf", "1:")
    finally:
        transport.run(["tc", "qdisc", "del", "dev", "eth0", "root"], check=True)


def _netem_here(net: Net) -> bool:
    return netshape.netem_missing(lambda argv: net.transport("a").run(argv)) is None


def test_without_netem_a_jitter_shape_only_netem_draws_is_refused_up_front(net: Net) -> None:
    if _netem_here(net):
        kernel_has("tc netem", "the NFQUEUE holder is not used where netem exists")
    params = DelayParams(peers=[net.addrs["b"]], delay="50ms", jitter="10ms", distribution="pareto")
    with pytest.raises(Unsupported, match="tc netem is not available on this kernel: .*not pareto"):
        DelayInjector().check(net.ctx("a"), params)
    assert not net.leftovers("a")  # nothing was applied


# Runs tc argvs in order inside a throwaway namespace (unshare --net) and prints one stderr line per command.
_TC_RUNNER = """
import json, subprocess, sys
for argv in json.loads(sys.argv[1]):
    done = subprocess.run(argv, capture_output=True, text=True)
    print(json.dumps([done.returncode, done.stderr.strip()]))
"""


@pytest.mark.parametrize(
    "params",
    [
        DelayParams(peers=["10.0.0.2", "10.0.1.0/24"], delay="100ms", jitter="10ms", correlation=25),
        DelayParams(interface="lo", delay="5ms"),
        JitterParams(peers=["10.0.0.2"], jitter="20ms"),
        DelayParams(peers=["10.0.0.2"], ports=[80, 443], protocol="tcp", delay="50ms"),
        DelayParams(peers=["10.0.0.2"], delay="10ms", reorder=25),
    ],
    ids=["delay-peers", "delay-interface", "jitter-peers", "delay-ports", "delay-reorder"],
)
def test_netem_plans_are_valid_tc(params: DelayParams | JitterParams) -> None:
    """tc parses every argument of our netem plans; without sch_netem only the kernel may say no."""
    _, commands = netshape.shaping_plan("lo", "1a2b:", "1a2c:", params.peers, params)
    assert sum("netem" in argv for argv in commands) == 1
    argv = ["unshare", "--net", "--", sys.executable, "-c", _TC_RUNNER, json.dumps(commands)]
    results = [json.loads(line) for line in sh(*argv).stdout.splitlines()]
    assert len(results) == len(commands)
    for (code, err), command in zip(results, commands, strict=True):
        assert code == 0 or "qdisc kind is unknown" in err, (command, err)  # never a usage/parse error


@pytest.mark.parametrize("injector_cls", [DelayInjector, JitterInjector])
def test_delay_and_jitter_add_latency_with_netem_or_the_nfqueue_holder(net: Net, injector_cls: type) -> None:
    """netem where the kernel has it, else the NFQUEUE packet holder: either way only traffic to the peer waits,
    and heal leaves no rule, qdisc or holder behind."""
    ctx, injector = net.ctx("a"), injector_cls()
    params: BaseModel = (
        DelayParams(peers=[net.addrs["b"]], delay="150ms")
        if injector_cls is DelayInjector
        else JitterParams(peers=[net.addrs["b"]], jitter="10ms", delay="150ms")
    )
    injector.check(ctx, params)
    applied = inject(injector, ctx, op(injector.name, params))
    assert ("NFQUEUE" in applied.description) != _netem_here(net)
    try:
        assert not net.echo("a", "b", timeout=0.1, tries=1)  # a 150 ms one-way delay misses a 100 ms window
        assert net.echo("a", "b", timeout=1.0, tries=1)
        assert net.echo("a", "c", timeout=0.1, tries=3)  # another peer is not delayed
    finally:
        injector.heal(ctx, applied)
    assert net.echo("a", "b", timeout=0.1, tries=3)
    assert not net.leftovers("a")
    assert not pids_where(lambda cmdline: applied.op_id.encode() in cmdline), "the packet holder outlived heal"


def test_a_delay_on_one_port_leaves_the_peers_other_ports_alone(net: Net) -> None:
    ctx, injector = net.ctx("a"), DelayInjector()
    params = DelayParams(peers=[net.addrs["b"]], ports=[UDP_PORT], protocol="udp", delay="800ms")
    injector.check(ctx, params)
    applied = inject(injector, ctx, op("delay", params))
    try:
        assert f"udp port {UDP_PORT}" in applied.description
        assert not net.echo("a", "b", timeout=0.3, tries=1)  # to the UDP port: 800 ms late
        assert net.connects("a", "b")  # the TCP port on the same peer answers within 0.5 s
    finally:
        injector.heal(ctx, applied)
    assert net.echo("a", "b", timeout=0.3, tries=3) and not net.leftovers("a")


# -- backends, tools and privileges -----------------------------------------------------------------------------


def _path_with(tmp_path: Path, links: dict[str, str]) -> str:
    """A PATH whose only entry holds ``links`` (name -> real program): a host with exactly these tools."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for name, target in links.items():
        (folder / name).symlink_to(target)
    return str(folder)


@pytest.mark.parametrize("restore_as", [None, "legacy", "nft"])
def test_partition_on_the_legacy_iptables_backend(
    net: Net, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restore_as: str | None
) -> None:
    """``restore_as``: which backend the host's iptables-restore uses (None: it has none). Batching is used
    only when it is iptables' own backend; a mismatch would install rules heal and the dead-man never see."""
    legacy = shutil.which("iptables-legacy")
    restore = shutil.which(f"iptables-{restore_as}-restore") if restore_as else None
    if legacy is None or (restore_as and restore is None):
        pytest.skip("iptables-legacy (or the iptables-restore variant) is not installed")
    tools = {name: shutil.which(name) for name in ("ip", "id", "sh", "tc", "rm")}
    links = {"iptables": legacy, **({"iptables-restore": restore} if restore else {})}
    monkeypatch.setenv("PATH", _path_with(tmp_path, {**links, **{k: v for k, v in tools.items() if v}}))
    ctx, injector = net.ctx("a"), PartitionInjector()
    applied = inject(injector, ctx, op("partition", PartitionParams(peers=[net.addrs["b"]])))
    try:
        assert applied.state["backend"] == "legacy"
        assert applied.state["restore"] is (restore_as == "legacy")
        assert "CHAOS-" in sh("ip", "netns", "exec", net.names["a"], legacy, "-S").stdout
        assert not net.echo("a", "b")
        revert = injector.revert_command(applied)
        assert revert is not None
        assert sh("ip", "netns", "exec", net.names["a"], *revert, check=False).returncode == 0
        assert net.echo("a", "b")
    finally:
        injector.heal(ctx, applied)
    if restore_as == "legacy":  # and a heal that is one batch on this backend too: no iptables call at all
        host = _Recording(net.transport("a"))
        ctx = InjectionContext(transport=host)  # type: ignore[arg-type]
        applied = inject(injector, ctx, op("partition", PartitionParams(peers=[net.addrs["b"]])))
        assert not net.echo("a", "b")
        host.calls.clear()
        injector.heal(ctx, applied)
        assert net.echo("a", "b") and not [argv for argv in host.calls if argv[0] == "iptables"], host.calls
    left = sh("ip", "netns", "exec", net.names["a"], legacy, "-S").stdout
    assert "CHAOS" not in left and "mlchaos" not in left


def test_check_names_the_missing_tool(net: Net, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tools = {name: shutil.which(name) for name in ("ip", "id")}
    monkeypatch.setenv("PATH", _path_with(tmp_path, {k: v for k, v in tools.items() if v}))
    with pytest.raises(Unsupported, match="iptables"):
        PartitionInjector().check(net.ctx("a"), PartitionParams(peers=[net.addrs["b"]]))
    with pytest.raises(Unsupported, match="tc"):
        BandwidthInjector().check(net.ctx("a"), BandwidthParams(interface="eth0", rate="1mbit"))


class _Unprivileged:
    """A host where we are uid 1000 without sudo (plain data: decides only what `id`/`sudo` answer)."""

    host = "worker-7"

    def run(self, argv: list[str], *, timeout: float = 30.0, check: bool = False) -> Completed:
        out = "1000\n" if argv == ["id", "-u"] else ""
        return Completed(tuple(argv), 0 if argv == ["id", "-u"] else 1, out, "sudo: a password is required")


def test_check_refuses_without_root_or_sudo() -> None:
    ctx = InjectionContext(transport=_Unprivileged())  # type: ignore[arg-type]
    with pytest.raises(Unsupported, match="need root on worker-7"):
        PartitionInjector().check(ctx, PartitionParams(peers=["10.0.0.2"]))
    with pytest.raises(Unsupported, match="need root on worker-7"):
        BandwidthInjector().check(ctx, BandwidthParams(interface="eth0", rate="1mbit"))
