"""What every network fault needs from its host: peer validation, privileges (root or ``sudo -n``), routes.

Shared by :mod:`injectors.network.faults` (iptables faults) and :mod:`injectors.network.tc` (tc faults). Every command
goes through the transport as an argv list; nothing here changes the host.
"""

from __future__ import annotations

import ipaddress
import re
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Annotated, TypeVar, cast

from pydantic import BaseModel, ConfigDict, Field, field_validator

from chaos.cluster.base import Completed, Transport, TransportError
from chaos.cluster.local import LocalTransport
from chaos.cluster.netns import NetnsTransport
from chaos.cluster.remote_process import RemoteTransport
from chaos.plugins.injector import InjectionContext, InjectionError

TIMEOUT_S = 30.0
T = TypeVar("T")
_FACTS: weakref.WeakKeyDictionary[object, dict[tuple[str, ...], object]] = weakref.WeakKeyDictionary()
_FACTS_LOCK = threading.Lock()


def remembered(transport: Transport, key: tuple[str, ...], find: Callable[[], T], keep: Callable[[T], bool]) -> T:
    """``find()``, asked once per remote transport and ``key`` while ``keep(answer)``: what a host is (root or
    sudo, its iptables backends, a route) does not change within a run, and on an SSH or container host asking
    again is a round trip per host per fault. Transports on this machine are always asked (cheap, and tests
    change PATH between calls); exceptions are never remembered."""
    if not isinstance(transport, RemoteTransport):
        return find()
    with _FACTS_LOCK:
        known = _FACTS.setdefault(transport, {})
        if key in known:
            return cast(T, known[key])
    answer = find()
    if keep(answer):
        with _FACTS_LOCK:
            known[key] = answer
    return answer


def forget_facts() -> None:
    """Forget every remembered host fact (benchmarks measuring the cost of asking)."""
    with _FACTS_LOCK:
        _FACTS.clear()


_INVENTORY_PEER = re.compile(r"^(host|group):[A-Za-z0-9_.-]+$")


def peer_address(value: str) -> str:
    """An IPv4 address or CIDR in canonical form (``10.0.0.2``, ``10.0.1.0/24``), or an inventory reference
    ``host:NAME`` / ``group:NAME`` kept as is (resolved per run by :func:`resolve_peers`); ValueError otherwise."""
    if _INVENTORY_PEER.match(value.strip()):
        return value.strip()
    try:
        net = ipaddress.ip_network(value.strip(), strict=False)
    except ValueError:
        raise ValueError(
            f"{value!r} is not an IP address, CIDR or inventory reference (e.g. 10.0.0.2, 10.0.1.0/24, "
            "host:h2, group:workers)"
        ) from None
    if net.version != 4:
        raise ValueError(f"{value!r}: only IPv4 peers are supported (ip6tables is not wired up yet)")
    return str(net.network_address) if net.prefixlen == 32 else str(net)


Port = Annotated[int, Field(ge=1, le=65535)]


def port_numbers(ports: Sequence[int | str]) -> list[int]:
    """``ports`` as numbers: the injector's plan has replaced every name (``rdzv``, a role) by the target's port."""
    named = [port for port in ports if not isinstance(port, int)]
    if named:
        raise InjectionError(f"port {named[0]!r} was not resolved to a number")
    return [port for port in ports if isinstance(port, int)]


class Peers(BaseModel):
    """Base of every network fault's params: ``peers`` as canonical, de-duplicated IPv4 addresses/CIDRs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    peers: list[str] = Field(default_factory=list)

    @field_validator("peers")
    @classmethod
    def _canonical(cls, value: list[str]) -> list[str]:
        return list(dict.fromkeys(peer_address(item) for item in value))


def shares_machine(transport: Transport) -> bool:
    """Whether the host runs on this machine's kernel and filesystem (this Python can run helpers there)."""
    return isinstance(transport, (LocalTransport, NetnsTransport))


class Host:
    """The fault's host: argv through the transport, behind ``sudo -n`` when the op needs it."""

    def __init__(self, transport: Transport, sudo: bool) -> None:
        self.transport = transport
        self.sudo = sudo

    def run(self, argv: list[str]) -> Completed:
        return self.transport.run([*(["sudo", "-n"] if self.sudo else []), *argv], timeout=TIMEOUT_S)

    @staticmethod
    def privilege(transport: Transport) -> bool | str:
        """False when the transport is root, True when it needs (and has) ``sudo -n``, else why neither."""
        return remembered(transport, ("privilege",), lambda: Host._privilege(transport), lambda v: type(v) is bool)

    @staticmethod
    def _privilege(transport: Transport) -> bool | str:
        try:
            done = transport.run(["id", "-u"], timeout=TIMEOUT_S)
            if done.ok and done.stdout.strip() == "0":
                return False
            if transport.run(["sudo", "-n", "true"], timeout=TIMEOUT_S).ok:
                return True
        except TransportError as exc:
            return f"cannot run commands on {transport.host}: {exc}"
        return f"network faults need root on {transport.host} (or password-less sudo)"

    @classmethod
    def open(cls, transport: Transport, *, refuse: type[Exception]) -> Host:
        sudo = cls.privilege(transport)
        if isinstance(sudo, str):
            raise refuse(sudo)
        return cls(transport, sudo)

    def route(self, address: str) -> tuple[str | None, str | None]:
        """(interface, source address) this host uses to reach ``address``; Nones when it has no route."""
        return remembered(self.transport, ("route", address), lambda: self._route(address), lambda v: v[0] is not None)

    def _route(self, address: str) -> tuple[str | None, str | None]:
        try:
            done = self.transport.run(["ip", "-o", "-4", "route", "get", address], timeout=TIMEOUT_S)
        except TransportError:
            return None, None
        tokens = done.stdout.split() if done.ok else []
        found = {key: tokens[i + 1] for i, key in enumerate(tokens[:-1]) if key in ("dev", "src")}
        return found.get("dev"), found.get("src")


def next_hop(host: Host, peer: str) -> str | None:
    """The neighbour a packet to ``peer`` (an address, or a CIDR reached through one gateway) is handed to: the
    route's ``via``, or the address itself when it is on-link; None when there is no route or ``peer`` is a CIDR
    on-link (its packets go to many neighbours)."""
    try:
        done = host.transport.run(["ip", "-o", "-4", "route", "get", probe_address(peer)], timeout=TIMEOUT_S)
    except TransportError:
        return None
    tokens = done.stdout.split() if done.ok else []
    via = next((tokens[i + 1] for i, key in enumerate(tokens[:-1]) if key == "via"), None)
    if via is not None:
        return via
    single = ipaddress.ip_network(peer, strict=False).num_addresses == 1
    return str(ipaddress.ip_network(peer, strict=False).network_address) if single and tokens else None


def probe_address(peer: str) -> str:
    """One address inside ``peer`` to ask the routing table about (the first host of a CIDR)."""
    net = ipaddress.ip_network(peer, strict=False)
    return str(net.network_address + 1) if net.num_addresses > 2 else str(net.network_address)


def resolve_peers(ctx: InjectionContext, peers: Sequence[str]) -> list[str]:
    """The addresses/CIDRs a fault's peers stand for on this host.

    ``host:NAME`` and ``group:NAME`` are looked up in the run's inventory (``ctx.extras["inventory"]``, set by
    the runner for faults with ``hosts:``), so one scenario file runs against any inventory. The fault's own
    host is left out of a group: a host is never partitioned from itself.
    """
    resolved: list[str] = []
    inventory = ctx.extras.get("inventory")
    me = ctx.extras.get("host")
    for peer in peers:
        match = _INVENTORY_PEER.match(peer)
        if match is None:
            resolved.append(peer)
            continue
        if inventory is None:
            raise InjectionError(f"peer {peer!r} names an inventory entry, but this run has no inventory")
        kind, name = peer.split(":", 1)
        hosts = getattr(inventory, "hosts", [])
        if kind == "host":
            chosen = [h for h in hosts if h.name == name]
        else:
            chosen = [h for h in hosts if name == "all" or name in h.groups]
        if not chosen:
            raise InjectionError(f"peer {peer!r}: no such {kind} in the inventory")
        resolved.extend(peer_address(h.address) for h in chosen if h.name != me)
    if peers and not resolved:  # no peers at all is fine for faults that shape a whole interface
        raise InjectionError(f"peers {list(peers)} leave nothing to cut this host off from")
    return list(dict.fromkeys(resolved))


def ms(seconds: float) -> str:
    """``0.1`` -> ``100ms`` for descriptions."""
    return f"{seconds * 1000:g}ms"
