"""Network faults: ``partition``, ``packet_loss``, ``drop_large_packets``, ``flap`` (iptables) and
``bandwidth``, ``delay``, ``jitter`` (tc).

Every command runs on the fault's host through ``ctx.transport.run`` as an argv list, so the same code drives
this machine, a network namespace (:class:`chaos.cluster.netns.NetnsTransport`), an SSH host or a container.
Peers are IPv4 addresses or CIDRs. :func:`resolve_peers` is the seam where inventory groups will be mapped
to addresses; everything below it (:func:`filter_specs`, :func:`injectors.network.tc.shaping_plan`) takes resolved addresses.

iptables faults put their DROP rules only in per-op chains reached through tagged jumps, and tc faults add
one root qdisc with a per-op handle; :mod:`injectors.network.iptables` and :mod:`injectors.network.tc` hold those
disciplines (and why heal removes exactly ours). Where the host's ``iptables-restore`` uses the same backend
as its ``iptables`` (decided in ``prepare``, journaled as :attr:`FilterState.restore`), apply and heal are one
``iptables-restore --noflush`` each, fed through a temporary file (transports have no stdin); a runner that
sends a remote dead-man's arming (or cancelling) together with the fault takes :meth:`_FilterFault.apply_command`
and :meth:`_FilterFault.heal_command` instead: the same batch on stdin, one round trip per host per action.
``revert_command`` is a constant ``sh -c`` script that gets only validated, generated names as positional
parameters: it needs nothing but sh, iptables/tc on the host, which is what a dead-man switch can rely on
when the harness (and maybe Python) is gone.

Commands run as root; a non-root transport user with password-less sudo gets ``sudo -n`` in front of each.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import ClassVar, Literal

from pydantic import BaseModel, Field, JsonValue, model_validator

from chaos.plugins.injector import (
    Applied,
    FaultOp,
    InjectionContext,
    InjectionError,
    InjectorBase,
    PortName,
    Unsupported,
    flag,
    optional_int,
    optional_text,
    params_as,
    state_number,
    state_texts,
)
from chaos.safety.remote_deadman import HostCommand
from chaos.spec.units import Duration
from injectors import detached
from injectors.base import HeldFault, probe
from injectors.network import flap_helper as netflap
from injectors.network import iptables as netfilter
from injectors.network.helpers import start_helper, stop_helper
from injectors.network.host import (
    TIMEOUT_S,
    Host,
    Peers,
    Port,
    next_hop,
    port_numbers,
    probe_address,
    remembered,
    resolve_peers,
    shares_machine,
)
from injectors.network.iptables import ChainSpec
from injectors.network.shape_params import BandwidthParams, DelayParams, JitterParams, ShapeParams
from injectors.network.tc import BandwidthInjector, DelayInjector, JitterInjector

__all__ = [
    "BandwidthInjector",
    "BandwidthParams",
    "DelayInjector",
    "DelayParams",
    "DropLargePacketsInjector",
    "DropLargeParams",
    "DuplicateInjector",
    "DuplicateParams",
    "FilterParams",
    "FlapInjector",
    "FlapParams",
    "INJECTORS",
    "JitterInjector",
    "JitterParams",
    "PacketLossInjector",
    "PacketLossParams",
    "PartitionInjector",
    "PartitionParams",
    "ShapeParams",
    "filter_specs",
]

# -- parameters -------------------------------------------------------------------------------------------------


class FilterParams(Peers):
    """Which packets an iptables fault drops: traffic between this host and ``peers``."""

    peers: list[str] = Field(min_length=1, description="IPv4 addresses or CIDRs on the other side of the fault")
    direction: Literal["both", "in", "out"] = Field(
        default="both", description="both ways, only what peers send here (in), or only what this host sends (out)"
    )
    protocol: Literal["all", "tcp", "udp", "icmp"] = Field(default="all", description="only this IP protocol")
    ports: list[Port | PortName] = Field(
        default_factory=list,
        max_length=15,
        description="only these ports (source or destination); tcp and udp when protocol is all; rdzv: the "
        "rendezvous store's port of a multi-node torchrun job; a roles target's role: its port",
    )

    @model_validator(mode="after")
    def _ports_need_ports(self) -> FilterParams:
        if self.ports and self.protocol == "icmp":
            raise ValueError("icmp has no ports; drop `ports` or use protocol tcp/udp/all")
        return self


class PartitionParams(FilterParams):
    """Drop all (matching) traffic between this host and ``peers``."""


class PacketLossParams(FilterParams):
    """Drop a random share of the (matching) packets between this host and ``peers``."""

    probability: float = Field(ge=0, le=1, description="share of packets dropped in each direction, 0..1")


class DropLargeParams(FilterParams):
    """Drop packets of at least ``min_size`` bytes: small probes pass while bulk transfers stall (an MTU hole)."""

    min_size: int = Field(
        default=1024, ge=29, le=65535, description="smallest IP packet length (header included) that is dropped"
    )


class DuplicateParams(FilterParams):
    """Send a random share of what this host sends to ``peers`` twice (the iptables TEE target)."""

    probability: float = Field(gt=0, le=1, description="share of the packets sent to peers that are sent twice, 0..1")
    direction: Literal["out"] = Field(
        default="out", description="only what this host sends (a copy of a received packet cannot be delivered twice)"
    )


class FlapParams(FilterParams):
    """A partition that is down for ``down_fraction`` of every ``period`` for the fault's duration."""

    period: Duration = Field(default=2.0, gt=0, description="length of one down+up cycle, e.g. 500ms or 2s")
    down_fraction: float = Field(default=0.5, gt=0, lt=1, description="share of each period partitioned")


def _between(local: str, peers: Sequence[str], direction: str) -> str:
    arrow, note = {"both": ("<->", "both directions"), "in": ("<-", "incoming only"), "out": ("->", "outgoing only")}[
        direction
    ]
    return f"{local} {arrow} {', '.join(peers)} ({note})"


def _selection(params: FilterParams) -> str:
    if params.ports:
        protocol = "tcp+udp" if params.protocol == "all" else params.protocol
        plural = "s" if len(params.ports) > 1 else ""
        return f", {protocol} port{plural} {','.join(str(port) for port in params.ports)}"
    return "" if params.protocol == "all" else f", {params.protocol} only"


# -- iptables faults --------------------------------------------------------------------------------------------


def filter_specs(
    chains: dict[str, str], peers: Sequence[str], protocol: str, ports: Sequence[int], extra: Sequence[str]
) -> list[ChainSpec]:
    """The chains of one iptables fault between this host and resolved ``peers``; ``chains`` maps direction
    (``in``/``out``) to chain name and decides which directions are cut."""
    return [
        ChainSpec(chain, netfilter.HOOKS[direction], netfilter.drop_rules(direction, peers, protocol, ports, extra))
        for direction, chain in chains.items()
    ]


@dataclass(frozen=True)
class FilterState:
    """The journal state of an iptables fault: its chains, the tag on our jumps, and how to run iptables.

    ``restore`` says whether ``iptables-restore`` shares ``backend`` with ``iptables`` (one-batch loading).
    ``comment`` is None only in a malformed record: heal then removes jumps by chain name alone.
    """

    chains: tuple[ChainSpec, ...]
    comment: str | None
    sudo: bool
    backend: str
    restore: bool
    peers: tuple[str, ...]

    def to_json(self) -> dict[str, JsonValue]:
        chains: list[JsonValue] = [spec.to_json() for spec in self.chains]
        return {
            "chains": chains,
            "comment": self.comment,
            "sudo": self.sudo,
            "backend": self.backend,
            "restore": self.restore,
            "peers": list(self.peers),
        }

    @classmethod
    def from_json(cls, state: dict[str, JsonValue]) -> FilterState:
        """InjectionError when the chains are not ours or not what we write (see :class:`ChainSpec`)."""
        return cls(
            tuple(netfilter.chains_from_state(state)),
            optional_text(state, "comment"),
            flag(state, "sudo"),
            optional_text(state, "backend") or "",
            flag(state, "restore"),
            state_texts(state, "peers") if "peers" in state else (),
        )

    @property
    def chain_names(self) -> list[str]:
        return [spec.chain for spec in self.chains]

    def required_comment(self) -> str:
        """The jump tag, for apply; InjectionError when the record has none."""
        if self.comment is None:
            raise InjectionError("journal state has no rule comment")
        return self.comment


@dataclass(frozen=True)
class FlapState:
    """The journal state of ``flap``: the partition's, the cycle, and (once applied) the helper's pid."""

    filter: FilterState
    period_s: float
    down_fraction: float
    helper_pid: int | None = None

    def to_json(self) -> dict[str, JsonValue]:
        state = {**self.filter.to_json(), "period_s": self.period_s, "down_fraction": self.down_fraction}
        return state if self.helper_pid is None else {**state, "helper_pid": self.helper_pid}

    @classmethod
    def from_json(cls, state: dict[str, JsonValue]) -> FlapState:
        return cls(
            FilterState.from_json(state),
            state_number(state, "period_s"),
            state_number(state, "down_fraction"),
            optional_int(state, "helper_pid"),
        )


class _FilterFault(InjectorBase):
    """Shared life of the iptables faults; subclasses say which extra matches their DROP rules carry."""

    def _extra(self, params: FilterParams) -> list[str]:
        return []

    def _what(self, params: FilterParams) -> str:
        return self.name

    def _specs(self, host: Host, chains: dict[str, str], peers: Sequence[str], params: FilterParams) -> list[ChainSpec]:
        return filter_specs(chains, peers, params.protocol, port_numbers(params.ports), self._extra(params))

    def check(self, ctx: InjectionContext, params: BaseModel) -> None:
        """Unsupported unless iptables runs here with root (or sudo) and knows every match the fault uses."""
        host = Host.open(ctx.transport, refuse=Unsupported)
        why = netfilter.probe(host.run, self._extra(params_as(FilterParams, params)))
        if why is not None:
            raise Unsupported(f"iptables cannot be used on {ctx.transport.host}: {why}")

    def prepare(self, ctx: InjectionContext, op: FaultOp) -> Applied:
        """Choose chain names and rules; changes nothing. InjectionError without root/sudo or iptables."""
        state, description = self._plan(ctx, op)
        return op.record(self.name, ctx.transport.host, state.to_json(), description)

    def _plan(self, ctx: InjectionContext, op: FaultOp) -> tuple[FilterState, str]:
        """The journal state and description of ``op`` (what :meth:`prepare` records)."""
        params = op.params_as(FilterParams)
        params = params.model_copy(update={"ports": [ctx.port(port) for port in params.ports]})  # rdzv: a number
        host = Host.open(ctx.transport, refuse=InjectionError)
        peers = resolve_peers(ctx, params.peers)
        directions = ["in", "out"] if params.direction == "both" else [params.direction]
        chains = netfilter.chain_names(op.op_id, ctx.transport.host, directions)
        specs = self._specs(host, chains, peers, params)
        local = host.route(probe_address(peers[0]))[1] or ctx.transport.host
        backend = remembered(ctx.transport, ("iptables", str(host.sudo)), lambda: netfilter.backend(host.run), bool)
        restore = remembered(
            ctx.transport, ("iptables-restore", str(host.sudo)), lambda: netfilter.restore_backend(host.run), bool
        )
        state = FilterState(
            tuple(specs), netfilter.comment_for(op.op_id), host.sudo, backend, restore == backend, tuple(peers)
        )
        return state, f"{self._what(params)} {_between(local, peers, params.direction)}{_selection(params)}"

    @staticmethod
    def _restore(ctx: InjectionContext, applied: Applied, state: FilterState, host: Host) -> netfilter.Restore | None:
        """One-batch loading for this op, or None when prepare found no usable ``iptables-restore``."""
        if not state.restore:
            return None
        return netfilter.file_restore(host.run, ctx.transport.put, f"{applied.op_id}-{ctx.transport.host}")

    def apply(self, ctx: InjectionContext, applied: Applied) -> None:
        """Create and fill the op's chains, then jump to them; InjectionError on a failing command (the
        runner then heals, which removes whatever part was installed). Repeating it adds no second jump."""
        state = FilterState.from_json(applied.state)
        host = Host(ctx.transport, state.sudo)
        restore = self._restore(ctx, applied, state, host)
        netfilter.install(host.run, list(state.chains), state.required_comment(), restore=restore)

    def heal(self, ctx: InjectionContext, applied: Applied) -> None:
        """Remove every jump to the op's chains and the chains themselves; idempotent, needs only the state."""
        state = FilterState.from_json(applied.state)
        host = Host(ctx.transport, state.sudo)
        restore = self._restore(ctx, applied, state, host)
        netfilter.uninstall(host.run, list(state.chains), state.comment, restore=restore)

    def apply_command(self, applied: Applied) -> HostCommand | None:
        """The whole :meth:`apply` as one command: the :func:`~injectors.network.iptables.install_text` batch on
        ``iptables-restore``'s stdin. None where prepare found no usable ``iptables-restore`` or the text is too
        big for one argv word; a runner then calls :meth:`apply`, as it does when this command fails (a failed
        batch changes nothing: e.g. a retried apply whose chain already exists)."""
        state = FilterState.from_json(applied.state)
        return _batch(state, lambda comment: netfilter.install_text(list(state.chains), comment))

    def heal_command(self, applied: Applied) -> HostCommand | None:
        """The whole :meth:`heal` as one command (:func:`~injectors.network.iptables.uninstall_text`), as
        :meth:`apply_command`; when it fails (an extra copy of a jump, say), :meth:`heal` removes every copy."""
        state = FilterState.from_json(applied.state)
        return _batch(state, lambda comment: netfilter.uninstall_text(list(state.chains), comment))

    def revert_command(self, applied: Applied) -> list[str] | None:
        """``sh -c <constant script> mlchaos-netrevert CHAIN...``: see :data:`injectors.network.iptables.REVERT_SCRIPT`."""
        state = FilterState.from_json(applied.state)
        return netfilter.revert_argv(state.chain_names, sudo=state.sudo)


def _batch(state: FilterState, text: Callable[[str], str]) -> HostCommand | None:
    """``iptables-restore --noflush`` reading ``text(comment)`` from stdin, or None (see ``apply_command``)."""
    if not state.restore or state.comment is None:
        return None
    try:
        command = HostCommand([*(["sudo", "-n"] if state.sudo else []), *netfilter.restore_argv()], text(state.comment))
    except InjectionError:
        return None  # a word that cannot be written into a batch: the command path reports it precisely
    return command if command.fits() else None


class PartitionInjector(_FilterFault, name="partition", params=PartitionParams):
    """cut this host off from peer addresses (iptables DROP, both ways or one way)

    Drop traffic between this host and its peers (both ways, or one way) until healed."""


class _RandomShareFault(_FilterFault):
    """A filter fault on a random share of the packets (iptables statistic match): each chosen one is ``verb``-ed."""

    Params: ClassVar[type[PacketLossParams] | type[DuplicateParams]]
    verb: ClassVar[str]  # as in "drop 5% of packets"

    def _extra(self, params: FilterParams) -> list[str]:
        probability = params_as(self.Params, params).probability
        return ["-m", "statistic", "--mode", "random", "--probability", f"{probability:.6f}"]

    def _what(self, params: FilterParams) -> str:
        return f"{self.verb} {params_as(self.Params, params).probability:.0%} of packets"


class PacketLossInjector(_RandomShareFault, name="packet_loss", params=PacketLossParams):
    """drop a random share of the packets to/from peer addresses (iptables statistic)

    Drop each matching packet with a fixed probability (iptables statistic match)."""

    verb: ClassVar[str] = "drop"


class DropLargePacketsInjector(_FilterFault, name="drop_large_packets", params=DropLargeParams):
    """drop packets of at least N bytes to/from peers (small probes pass, bulk stalls)

    Drop packets at or above a size: the silent >1 KB loss that 64-byte health probes never notice."""

    def _extra(self, params: FilterParams) -> list[str]:
        return ["-m", "length", "--length", f"{params_as(DropLargeParams, params).min_size}:65535"]

    def _what(self, params: FilterParams) -> str:
        return f"drop packets >= {params_as(DropLargeParams, params).min_size} bytes"


class DuplicateInjector(_RandomShareFault, name="duplicate", params=DuplicateParams):
    """send a random share of the packets to peers twice (iptables statistic + TEE)

    Duplicate a random share of what this host sends to its peers: the kernel's TEE target clones each chosen
    packet and hands the copy to the peer's next hop (the peer itself on-link), so the peer receives it twice.
    The same on a kernel with or without tc netem."""

    verb: ClassVar[str] = "duplicate"

    def check(self, ctx: InjectionContext, params: BaseModel) -> None:
        """Unsupported unless iptables here has the statistic match and the TEE target."""
        host = Host.open(ctx.transport, refuse=Unsupported)
        target = ["-j", "TEE", "--gateway", "127.0.0.1"]
        why = netfilter.probe(host.run, self._extra(params_as(FilterParams, params)), target)
        if why is not None:
            raise Unsupported(f"iptables cannot duplicate packets on {ctx.transport.host} (TEE target): {why}")

    def _specs(self, host: Host, chains: dict[str, str], peers: Sequence[str], params: FilterParams) -> list[ChainSpec]:
        rules: list[list[str]] = []
        for peer in peers:
            hop = next_hop(host, peer)
            if hop is None:
                raise InjectionError(
                    f"duplicate: no single next hop from {host.transport.host} to {peer} (no route, or a CIDR "
                    "on-link); name the peers' addresses"
                )
            target = ("-j", "TEE", "--gateway", hop)
            rules += netfilter.drop_rules(
                "out",
                [peer],
                params.protocol,
                port_numbers(params.ports),
                self._extra(params),
                port_match="--dports",
                target=target,
            )
        return [ChainSpec(chains["out"], netfilter.HOOKS["out"], rules)]


class FlapInjector(HeldFault, _FilterFault, name="flap", params=FlapParams):
    """partition from peers for part of every period (down/up cycle), healed at the end

    A partition switched down and up by a detached helper on the host (:mod:`injectors.network.flap_helper`).

    The chains are installed with a RETURN bypass (not yet in force); the helper toggles it every period and
    removes everything at the op's deadline or on SIGTERM. ``apply`` records ``helper_pid`` in the state;
    heal stops the helper (found by its ``--op-id`` when that record is missing), then removes the chains.
    ``revert_command`` stops the helper, then is the partition one (were the helper left, its toggles would fail
    harmlessly once the chains are gone, but it would outlive the revert until its own deadline).
    """

    def check(self, ctx: InjectionContext, params: BaseModel) -> None:
        super().check(ctx, params)
        if not shares_machine(ctx.transport):
            argv = detached.import_argv(ctx.transport, netflap.MODULE)
            fails = "mlchaos is not importable by python3 on {host} (needed for flap)"
            probe(ctx.transport, argv, "cannot run the host's python on", fails, timeout=TIMEOUT_S)

    def prepare(self, ctx: InjectionContext, op: FaultOp) -> Applied:
        """As partition, plus the cycle; InjectionError without a duration (the helper needs a deadline)."""
        duration = self.duration(op)
        partition, description = self._plan(ctx, op)
        params = op.params_as(FlapParams)
        state = FlapState(partition, params.period, params.down_fraction)
        description = (
            f"flap {description.removeprefix(self.name + ' ')}: down {params.down_fraction:.0%} of every "
            f"{params.period:g}s for {duration:g}s"
        )
        return op.record(self.name, ctx.transport.host, state.to_json(), description)

    def apply(self, ctx: InjectionContext, applied: Applied) -> None:
        """Install the chains bypassed, then start the detached helper; records its pid in the state."""
        state = FlapState.from_json(applied.state)
        host = Host(ctx.transport, state.filter.sudo)
        restore = self._restore(ctx, applied, state.filter, host)
        netfilter.install(
            host.run, list(state.filter.chains), state.filter.required_comment(), bypass=True, restore=restore
        )
        until_ns = detached.host_deadline_ns(ctx.transport, applied.duration_s or 0.0)
        helper = start_helper(
            ctx,
            host,
            netflap.MODULE,
            applied.op_id,
            "flap helper",
            chains=",".join(state.filter.chain_names),
            period=state.period_s,
            down_fraction=state.down_fraction,
            until_ns=until_ns,
        )
        applied.state.update(replace(state, helper_pid=helper).to_json())

    def apply_command(self, applied: Applied) -> HostCommand | None:
        """None: the helper starts after the chains, which :meth:`apply` does."""
        return None

    def heal_command(self, applied: Applied) -> HostCommand | None:
        """None: the helper must be stopped first, which :meth:`heal` does."""
        return None

    def heal(self, ctx: InjectionContext, applied: Applied) -> None:
        """Stop the helper (it removes the chains as it leaves), then remove whatever is still there."""
        state = FlapState.from_json(applied.state)
        host = Host(ctx.transport, state.filter.sudo)
        stop_helper(host, netflap.MODULE, applied.op_id, state.helper_pid)
        # The helper removes the chains as it leaves, so look before deleting (no batch that would only fail).
        netfilter.remove(host.run, state.filter.chain_names)

    def revert_command(self, applied: Applied) -> list[str] | None:
        """Stop the helper first (left running, it would outlive the revert until its own deadline), then remove
        the chains as a partition's revert does."""
        return detached.stop_then(netflap.MODULE, applied.op_id, super().revert_command(applied) or ())


INJECTORS = (
    PartitionInjector,
    PacketLossInjector,
    DropLargePacketsInjector,
    FlapInjector,
    DuplicateInjector,
    BandwidthInjector,
    DelayInjector,
    JitterInjector,
)
