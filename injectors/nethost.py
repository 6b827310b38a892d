"""What every network fault needs from its host: peer validation, privileges (root or ``sudo -n``), routes.

Shared by :mod:`injectors.network` (iptables faults) and :mod:`injectors.netshape` (tc faults). Every command
goes through the transport as an argv list; nothing here changes the host.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from chaos.cluster.base import Completed, Transport, TransportError
from chaos.cluster.local import LocalTransport
from chaos.cluster.netns import NetnsTransport
from chaos.injector import InjectionContext

TIMEOUT_S = 30.0
_P = TypeVar("_P", bound=BaseModel)


def peer_address(value: str) -> str:
    """An IPv4 address or CIDR in canonical form (``10.0.0.2``, ``10.0.1.0/24``); ValueError otherwise."""
    try:
        net = ipaddress.ip_network(value.strip(), strict=False)
    except ValueError:
        raise ValueError(f"{value!r} is not an IP address or CIDR (e.g. 10.0.0.2 or 10.0.1.0/24)") from None
    if net.version != 4:
        raise ValueError(f"{value!r}: only IPv4 peers are supported (ip6tables is not wired up yet)")
    return str(net.network_address) if net.prefixlen == 32 else str(net)


class Peers(BaseModel):
    """Base of every network fault's params: ``peers`` as canonical, de-duplicated IPv4 addresses/CIDRs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    peers: list[str] = Field(default_factory=list)

    @field_validator("peers")
    @classmethod
    def _canonical(cls, value: list[str]) -> list[str]:
        return list(dict.fromkeys(peer_address(item) for item in value))


def params_as(cls: type[_P], params: BaseModel) -> _P:
    """``params`` as ``cls`` (the runner may hand over an equal model of another class, e.g. after a reload)."""
    return params if isinstance(params, cls) else cls.model_validate(params.model_dump())


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
        try:
            done = self.transport.run(["ip", "-o", "-4", "route", "get", address], timeout=TIMEOUT_S)
        except TransportError:
            return None, None
        tokens = done.stdout.split() if done.ok else []
        found = {key: tokens[i + 1] for i, key in enumerate(tokens[:-1]) if key in ("dev", "src")}
        return found.get("dev"), found.get("src")


def probe_address(peer: str) -> str:
    """One address inside ``peer`` to ask the routing table about (the first host of a CIDR)."""
    net = ipaddress.ip_network(peer, strict=False)
    return str(net.network_address + 1) if net.num_addresses > 2 else str(net.network_address)


def resolve_peers(ctx: InjectionContext, peers: Sequence[str]) -> list[str]:
    """The addresses/CIDRs a fault's peers stand for. Today they are given as such; inventory groups map here."""
    return list(peers)


def ms(seconds: float) -> str:
    """``0.1`` -> ``100ms`` for descriptions."""
    return f"{seconds * 1000:g}ms"
