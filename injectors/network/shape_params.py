"""The parameters of the shaping faults (``bandwidth``, ``delay``, ``jitter``): where they shape and how, validated
when a scenario is read. The plumbing that applies them is :mod:`injectors.network.tc` (tc) and
:mod:`injectors.network.nfqueue` (the packet holder)."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator

from chaos.plugins.injector import InjectionError, PortName
from chaos.spec.units import Duration
from injectors.network.host import Peers, Port

_INTERFACE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.@-]{0,14}$")


def checked_interface(name: object) -> str:
    """``name`` if it is a plausible interface name (what we pass to tc); InjectionError otherwise."""
    if not isinstance(name, str) or not _INTERFACE.match(name):
        raise InjectionError(f"{name!r} is not a valid network interface name")
    return name


def _rate(value: object) -> int:
    """``10mbit``/``500kbit``/``1gbit``/``8000bit`` or a plain number of bits per second -> bits per second."""
    if isinstance(value, int) and not isinstance(value, bool):
        bits = value
    else:
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(bit|kbit|mbit|gbit)\s*", str(value), re.IGNORECASE)
        if not match:
            raise ValueError(f"{value!r} is not a rate; write e.g. 500kbit, 10mbit or 1gbit (1 kbit = 1000 bit/s)")
        scale = {"bit": 1, "kbit": 1_000, "mbit": 1_000_000, "gbit": 1_000_000_000}[match.group(2).lower()]
        bits = int(float(match.group(1)) * scale)
    if bits < 8_000:
        raise ValueError(f"rate {value!r} is below 8kbit; tc cannot shape that slowly")
    return bits


Rate = Annotated[int, BeforeValidator(_rate)]


class ShapeParams(Peers):
    """Where a tc fault shapes: what this host sends on ``interface`` (to ``peers`` only, when given)."""

    peers: list[str] = Field(
        default_factory=list, description="only traffic to these IPv4 addresses/CIDRs; empty: all of it"
    )
    interface: str | None = Field(
        default=None, description="interface to shape; default: the one that routes to the first peer"
    )
    direction: Literal["out", "in"] = Field(
        default="out",
        description="out: what this host sends; in (delay, jitter): what it receives, through the NFQUEUE holder",
    )
    ports: list[Port | PortName] = Field(
        default_factory=list,
        max_length=15,
        description="only what is sent to these destination ports (needs peers): numbers, or a roles target's role "
        "(its port)",
    )
    protocol: Literal["all", "tcp", "udp"] = Field(default="all", description="only this IP protocol")

    @field_validator("interface")
    @classmethod
    def _interface(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                checked_interface(value)
            except InjectionError as exc:
                raise ValueError(str(exc)) from None
        return value

    @model_validator(mode="after")
    def _somewhere(self) -> ShapeParams:
        if not self.peers and self.interface is None:
            raise ValueError("give `peers` or an `interface` (without peers, all of its traffic is shaped)")
        if (self.ports or self.protocol != "all") and not self.peers:
            raise ValueError("`ports` and `protocol` select traffic to `peers`: give peers too")
        return self


class BandwidthParams(ShapeParams):
    """Limit the rate of what this host sends (token bucket; excess waits up to ``latency``, then drops)."""

    rate: Rate = Field(description="e.g. 10mbit, 500kbit, 1gbit (tc units: 1 kbit = 1000 bit/s)")
    burst: int | None = Field(
        default=None, ge=1500, description="bucket size in bytes; default max(32 KiB, 10 ms worth of rate)"
    )
    latency: Duration = Field(default=0.05, gt=0, description="longest a packet may wait for tokens")

    @model_validator(mode="after")
    def _outgoing(self) -> BandwidthParams:
        if self.direction != "out":
            raise ValueError("bandwidth shapes what a host sends (tc): limit the peers instead of `direction: in`")
        return self


_Distribution = Literal["uniform", "normal", "pareto", "paretonormal"]


class DelayParams(ShapeParams):
    """Delay what this host sends by ``delay`` (± ``jitter``), some share at once (``reorder``): tc netem, or the
    NFQUEUE packet holder where the kernel has no netem."""

    delay: Duration = Field(gt=0, description="added one-way latency, e.g. 100ms")
    jitter: Duration = Field(default=0.0, ge=0, description="random variation around delay, e.g. 10ms")
    correlation: float = Field(default=0.0, ge=0, le=100, description="percent each delay depends on the last")
    distribution: _Distribution = Field(default="uniform", description="shape of the jitter")
    reorder: float = Field(
        default=0.0, ge=0, lt=100, description="percent of packets sent at once, overtaking the delayed ones"
    )

    @model_validator(mode="after")
    def _shape_needs_jitter(self) -> DelayParams:
        if self.distribution != "uniform" and self.jitter == 0:
            raise ValueError(f"distribution {self.distribution} needs a jitter > 0")
        return self


class JitterParams(ShapeParams):
    """Randomly vary the latency of what this host sends; needs tc netem in the host kernel."""

    jitter: Duration = Field(gt=0, description="spread of the added latency, e.g. 20ms")
    delay: Duration | None = Field(default=None, ge=0, description="mean added latency; default: equal to jitter")
    correlation: float = Field(default=0.0, ge=0, le=100, description="percent each delay depends on the last")
    distribution: _Distribution = Field(default="normal", description="shape of the jitter")
