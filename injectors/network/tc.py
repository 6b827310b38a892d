"""The tc faults of the network family (``bandwidth``, ``delay``, ``jitter``) and their plumbing: one root qdisc
per op that heal removes exactly. :mod:`injectors.network.faults` registers them with the iptables faults.

* We install only on an interface whose root qdisc is the kernel's default (handle ``0:``: noqueue,
  pfifo_fast, mq, fq_codel …). Anything else is someone's configuration that ``tc qdisc del root`` would
  destroy, so :func:`foreign_root` lets ``check()`` refuse up front (and ``tc qdisc add`` without replace
  would refuse to overwrite it anyway).
* Our root qdisc gets a handle derived from the op (``0x1000``–``0xdfff``, never the kernel's automatic
  ``8001:``-style handles on a default root). Heal deletes with ``tc qdisc del dev IF root handle H:``: the
  kernel itself refuses when the root's handle is not ``H``, so a qdisc someone put there after us is never
  removed, even in a race.
* Without peers the root is the shaping qdisc itself (tbf or netem). With peers it is an htb whose
  ``default 0`` lets unclassified traffic bypass shaping; one class, u32 filters on the peers' destination
  addresses, and the shaping qdisc (tbf or netem) as that class's leaf.

tc shapes what an interface SENDS; ingress shaping would need an ifb device, which these faults do not use.
``delay`` and ``jitter`` need the kernel's sch_netem: their ``check()`` probes for it without side effects
(:func:`netem_missing`) and refuses before anything is applied.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from pydantic import BaseModel, JsonValue

from chaos.cluster.base import Completed, TransportError
from chaos.plugins.injector import (
    Applied,
    FaultOp,
    InjectionContext,
    InjectionError,
    InjectorBase,
    Unsupported,
    flag,
    params_as,
)
from injectors.network import nfqueue
from injectors.network.host import Host, ms, port_numbers, probe_address, remembered, resolve_peers
from injectors.network.iptables import Run
from injectors.network.shape_params import (
    BandwidthParams,
    DelayParams,
    JitterParams,
    ShapeParams,
    checked_interface,
)

_HANDLE = re.compile(r"^[0-9a-f]{1,4}:$")
_UNSHAPED_RATE = "100gbit"  # the htb class that selects the peers' traffic must not itself limit the rate
_UNSHAPED_BURST = "10mb"
_QUANTUM = "60000"
_IP_PROTOCOLS = {
    "tcp": "6",
    "udp": "17",
}  # explicit: htb derives rate/r2q otherwise, and warns that 100gbit/10 is absurdly big


def checked_handle(handle: object) -> str:
    """``handle`` if it has the shape of the root handles we generate; InjectionError otherwise."""
    if not isinstance(handle, str) or not _HANDLE.match(handle):
        raise InjectionError(f"{handle!r} is not a qdisc handle such as 1a2b:")
    return handle


def handles(op_id: str, host: str) -> tuple[str, str]:
    """(root, leaf) qdisc handles for one op, e.g. ``("1a2b:", "1a2c:")``."""
    digest = int(hashlib.sha256(f"{op_id}\0{host}\0{time.time_ns()}".encode()).hexdigest()[:8], 16)
    major = 0x1000 + digest % 0xD000
    return f"{major:x}:", f"{major + 1:x}:"


def _run(run: Run, argv: list[str]) -> Completed:
    try:
        return run(argv)
    except TransportError as exc:
        raise InjectionError(f"cannot run {' '.join(argv[:4])}: {exc}") from exc


def root_qdisc(run: Run, interface: str) -> tuple[str, str] | None:
    """(kind, handle) of ``interface``'s root qdisc, or None when the interface does not exist."""
    done = _run(run, ["tc", "qdisc", "show", "dev", interface])
    if not done.ok:
        return None
    for line in done.stdout.splitlines():
        tokens = line.split()
        if len(tokens) >= 4 and tokens[0] == "qdisc" and "root" in tokens[3:6]:  # "dev IF" precedes it in some versions
            return tokens[1], tokens[2]
    return ("noqueue", "0:")  # an interface with no root line is on the kernel's default


def foreign_root(run: Run, interface: str) -> str | None:
    """Why we must not touch ``interface``'s root (it is configured by someone, or missing), or None."""
    root = root_qdisc(run, interface)
    if root is None:
        return f"interface {interface} does not exist"
    kind, handle = root
    if handle != "0:":
        return (
            f"interface {interface} already has a configured root qdisc ({kind} {handle}); replacing it would "
            "destroy that configuration"
        )
    return None


def shaping_commands(
    interface: str,
    root: str,
    leaf: str,
    peers: Sequence[str],
    qdisc: list[str],
    ports: Sequence[int] = (),
    protocol: str = "all",
) -> list[list[str]]:
    """The tc argvs of one shaping op, in order: ``qdisc`` (kind + args, e.g. tbf or netem) as the root, or,
    with peers, as the leaf of an htb class that only the peers' traffic is filtered into (to ``ports`` only,
    and only ``protocol``, when given).

    The htb class itself is unlimited: the leaf does the shaping, so tbf keeps splitting GSO super-packets
    (a plain fifo leaf would drop any that exceed its byte limit and stall TCP on retransmit timeouts).
    """
    dev = ["dev", interface]
    if not peers:
        return [["tc", "qdisc", "add", *dev, "root", "handle", root, *qdisc]]
    major = root.rstrip(":")
    commands = [
        ["tc", "qdisc", "add", *dev, "root", "handle", root, "htb"],  # default 0: unclassified is not shaped
        [
            "tc",
            "class",
            "add",
            *dev,
            "parent",
            root,
            "classid",
            f"{major}:1",
            "htb",
            "rate",
            _UNSHAPED_RATE,
            "ceil",
            _UNSHAPED_RATE,
            "burst",
            _UNSHAPED_BURST,
            "cburst",
            _UNSHAPED_BURST,
            "quantum",
            _QUANTUM,
        ],
        ["tc", "qdisc", "add", *dev, "parent", f"{major}:1", "handle", leaf, *qdisc],
    ]
    protocol_match = [] if protocol == "all" else ["match", "ip", "protocol", _IP_PROTOCOLS[protocol], "0xff"]
    port_matches = [["match", "ip", "dport", str(port), "0xffff"] for port in ports] or [[]]
    for peer in peers:
        for port_match in port_matches:
            commands.append(
                [
                    *("tc", "filter", "add", *dev, "parent", root, "protocol", "ip", "prio", "1", "u32"),
                    *("match", "ip", "dst", peer, *protocol_match, *port_match, "flowid", f"{major}:1"),
                ]
            )
    return commands


def install(run: Run, commands: Sequence[Sequence[str]]) -> None:
    """Run the op's tc commands in order; InjectionError on the first failure (the caller heals)."""
    for argv in commands:
        done = _run(run, list(argv))
        if not done.ok:
            raise InjectionError(f"{' '.join(argv)} failed: {(done.stderr or done.stdout).strip()[:300]}")


def remove(run: Run, interface: str, root: str, kind: str) -> bool:
    """Delete our root qdisc if it is still ours (handle AND kind); True when something was deleted.

    Idempotent: an interface that vanished, or a root that is no longer ours, leaves nothing to do.
    """
    interface, root = checked_interface(interface), checked_handle(root)
    current = root_qdisc(run, interface)
    if current is None or current != (kind, root):
        return False
    done = _run(run, ["tc", "qdisc", "del", "dev", interface, "root", "handle", root])
    if not done.ok and root_qdisc(run, interface) == (kind, root):
        raise InjectionError(f"cannot delete qdisc {root} on {interface}: {done.stderr.strip()[:300]}")
    return done.ok


def commands_from_state(state: dict[str, JsonValue]) -> list[list[str]]:
    raw = state.get("commands")
    if not isinstance(raw, list) or not all(
        isinstance(argv, list) and argv[:1] == ["tc"] and all(isinstance(part, str) for part in argv) for argv in raw
    ):
        raise InjectionError("journal state holds no list of tc commands")
    return [[part for part in argv if isinstance(part, str)] for argv in raw if isinstance(argv, list)]


# The dead-man's revert: a constant script; $1 (interface) and $2 (handle) arrive as positional parameters,
# are validated before the argv is built, and are only ever used quoted. The kernel's handle check in
# `tc qdisc del ... root handle H:` is what keeps it from deleting anyone else's qdisc. Already gone (healed,
# or interface removed) counts as success; our qdisc still in place afterwards is a failure.
REVERT_SCRIPT = """\
tc qdisc del dev "$1" root handle "$2" 2>/dev/null && exit 0
case "$(tc qdisc show dev "$1" 2>/dev/null)" in
  *" $2 root"*) exit 1 ;;
esac
exit 0
"""


def revert_argv(interface: str, root: str, *, sudo: bool) -> list[str]:
    """``sh -c REVERT_SCRIPT mlchaos-tcrevert IFACE HANDLE`` (behind ``sudo -n`` when the op needed it)."""
    args = [checked_interface(interface), checked_handle(root)]
    return [*(["sudo", "-n"] if sudo else []), "sh", "-c", REVERT_SCRIPT, "mlchaos-tcrevert", *args]


def netem_missing(run: Run) -> str | None:
    """Why tc netem cannot be used on this host, or None when it can. Changes nothing on the host.

    The authoritative probe adds a netem qdisc to the loopback of a throwaway network namespace
    (``unshare --net``): the kernel loads or refuses sch_netem exactly as it would for the real fault, and
    the namespace, with its qdisc, disappears when the probe exits. Where unshare cannot run, a loaded or
    loadable module (``/sys/module/sch_netem``, ``modprobe -n``) is taken as support.
    """
    probe = ["unshare", "--net", "--", "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"]
    try:
        done = run(probe)
        said = (done.stderr or done.stdout).strip()
        if done.ok:
            return None
        if "unknown" in said.lower() or "not supported" in said.lower():
            return f"`{' '.join(probe[3:])}` says {said!r}"
        first = f"unshare probe failed ({said[:200]!r})"
    except TransportError as exc:
        first = f"unshare probe could not run ({exc})"
    fallbacks = (["test", "-d", "/sys/module/sch_netem"], ["modprobe", "-n", "-q", "sch_netem"])
    for argv in fallbacks:
        try:
            if run(argv).ok:
                return None
        except TransportError:
            continue
    return f"{first}; sch_netem is neither loaded nor loadable"


def _to_ports(params: ShapeParams) -> str:
    """``, tcp port 80`` (what a shaping fault selects beyond its peers), or nothing."""
    protocol = "" if params.protocol == "all" else f"{params.protocol} "
    if not params.ports:
        return f", {params.protocol} only" if protocol else ""
    plural = "s" if len(params.ports) > 1 else ""
    return f", {protocol or 'tcp+udp '}port{plural} {','.join(str(port) for port in params.ports)}"


def _rate_text(bits: int) -> str:
    for unit, scale in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if bits >= scale:
            return f"{bits / scale:g}{unit}"
    return f"{bits}bit"


# -- faults --------------------------------------------------------------------------------------------------


def shaping_plan(
    interface: str, root: str, leaf: str, peers: Sequence[str], params: ShapeParams
) -> tuple[str, list[list[str]]]:
    """(root qdisc kind, tc argvs) of one shaping fault on ``interface`` towards resolved ``peers``."""
    if isinstance(params, BandwidthParams):
        burst = params.burst or max(32 * 1024, params.rate // 8 // 100)
        qdisc = ["tbf", "rate", f"{params.rate}bit", "burst", str(burst), "latency", ms(params.latency)]
        kind = "tbf"
    else:
        qdisc, kind = ["netem", *_netem_args(params)], "netem"
    return ("htb" if peers else kind), shaping_commands(
        interface, root, leaf, peers, qdisc, port_numbers(params.ports), params.protocol
    )


def _delay_and_jitter(params: ShapeParams) -> tuple[float, float]:
    """(mean added delay, jitter) in seconds of a delay or jitter fault."""
    if isinstance(params, DelayParams):
        return params.delay, params.jitter
    if isinstance(params, JitterParams):
        return (params.jitter if params.delay is None else params.delay), params.jitter
    raise TypeError(f"no delay in {type(params).__name__}")


def _netem_args(params: ShapeParams) -> list[str]:
    if not isinstance(params, DelayParams | JitterParams):
        raise TypeError(f"no netem arguments for {type(params).__name__}")
    delay, jitter = _delay_and_jitter(params)
    args = ["delay", f"{round(delay * 1e6)}us"]
    if jitter > 0:
        args.append(f"{round(jitter * 1e6)}us")
        if params.correlation > 0:
            args.append(f"{params.correlation:g}%")
        if params.distribution != "uniform":
            args += ["distribution", params.distribution]
    if isinstance(params, DelayParams) and params.reorder > 0:
        args += ["reorder", f"{params.reorder:g}%"]
    return args


@dataclass(frozen=True)
class ShapeState:
    """The journal state of a tc fault: our root qdisc (interface, handle, kind), the commands that build it,
    and whether they run behind ``sudo -n``.
    """

    interface: str
    handle: str
    kind: str
    commands: tuple[tuple[str, ...], ...]
    sudo: bool

    def to_json(self) -> dict[str, JsonValue]:
        commands: list[JsonValue] = [list(argv) for argv in self.commands]
        return {
            "interface": self.interface,
            "handle": self.handle,
            "kind": self.kind,
            "commands": commands,
            "sudo": self.sudo,
        }

    @classmethod
    def from_json(cls, state: dict[str, JsonValue]) -> ShapeState:
        """InjectionError when the interface or handle is not one we could have written (they reach the
        dead-man's script) or the commands are not ``tc`` argv lists."""
        interface, handle = checked_interface(state.get("interface")), checked_handle(state.get("handle"))
        commands = tuple(tuple(argv) for argv in commands_from_state(state))
        return cls(interface, handle, str(state.get("kind")), commands, flag(state, "sudo"))


class _ShapeFault(InjectorBase):
    """Shared life of the tc faults: one root qdisc with an op-derived handle on one interface."""

    needs_netem: ClassVar[bool] = False

    def _interface(self, ctx: InjectionContext, host: Host, params: ShapeParams, refuse: type[Exception]) -> str:
        if params.interface is not None:
            return params.interface
        first_peer = resolve_peers(ctx, params.peers)[0]
        interface = host.route(probe_address(first_peer))[0]
        if interface is None:
            raise refuse(f"no route from {host.transport.host} to {first_peer}; name the `interface`")
        return interface

    def check(self, ctx: InjectionContext, params: BaseModel) -> None:
        """Unsupported without root/sudo or tc, for an interface that is missing or already has a configured
        root qdisc (we would clobber it), and, for netem faults, when the kernel lacks sch_netem."""
        shape = params_as(ShapeParams, params)
        host = Host.open(ctx.transport, refuse=Unsupported)
        try:
            tc = host.run(["tc", "-V"])
        except TransportError as exc:
            raise Unsupported(f"tc (iproute2) is not installed on {ctx.transport.host}: {exc}") from exc
        if not tc.ok:
            raise Unsupported(f"tc does not run on {ctx.transport.host}: {tc.stderr.strip()[:200]}")
        if self.needs_netem and shape.direction == "in":
            if (fallback := self._holder_refusal(ctx, host, shape)) is not None:
                raise Unsupported(f"delaying what a host receives needs the NFQUEUE packet holder: {fallback}")
            return  # tc shapes only what an interface sends: incoming packets are always held by the holder
        if self.needs_netem and (why := netem_missing(host.run)) is not None:
            fallback = self._holder_refusal(ctx, host, shape)
            if fallback is None:
                return  # delayed by the NFQUEUE packet holder instead (injectors.network.nfqueue)
            raise Unsupported(
                f"tc netem is not available on this kernel: {why}; nor is the NFQUEUE packet holder: {fallback}; "
                "use bandwidth or packet_loss instead"
            )
        try:
            why = foreign_root(host.run, self._interface(ctx, host, shape, Unsupported))
        except InjectionError as exc:
            raise Unsupported(str(exc)) from exc
        if why is not None:
            raise Unsupported(f"{why} (on {ctx.transport.host})")

    def _holder_refusal(self, ctx: InjectionContext, host: Host, params: ShapeParams) -> str | None:
        """Why the NFQUEUE packet holder cannot stand in for netem here, or None when it can."""
        distribution = getattr(params, "distribution", "uniform")
        if distribution not in nfqueue.DISTRIBUTIONS:
            return f"it draws {' or '.join(nfqueue.DISTRIBUTIONS)} jitter, not {distribution}"
        return nfqueue.missing(host.run) or nfqueue.holder_missing(ctx)

    def _netem_here(self, ctx: InjectionContext, host: Host) -> bool:
        key = ("netem", str(host.sudo))
        return remembered(ctx.transport, key, lambda: netem_missing(host.run) is None, lambda here: here)

    def prepare(self, ctx: InjectionContext, op: FaultOp) -> Applied:
        """Choose interface, handles and tc commands (or, for delay and jitter on a host without netem, the
        NFQUEUE chain and queue); changes nothing."""
        params = op.params_as(ShapeParams)
        params = params.model_copy(update={"ports": [ctx.port(port) for port in params.ports]})  # a role: a number
        host = Host.open(ctx.transport, refuse=InjectionError)
        peers = resolve_peers(ctx, params.peers)
        if self.needs_netem and (params.direction == "in" or not self._netem_here(ctx, host)):
            return self._prepare_holder(ctx, op, host, peers, params)
        interface = self._interface(ctx, host, params, InjectionError)
        root, leaf = handles(op.op_id, ctx.transport.host)
        kind, commands = shaping_plan(interface, root, leaf, peers, params)
        local = (host.route(probe_address(peers[0]))[1] if peers else None) or ctx.transport.host
        where = f"{local} -> {', '.join(peers)}{_to_ports(params)}" if peers else f"everything {local} sends"
        state = ShapeState(interface, root, kind, tuple(tuple(argv) for argv in commands), host.sudo)
        return op.record(
            self.name, ctx.transport.host, state.to_json(), f"{self._what(params)} {where} on {interface} (outgoing)"
        )

    def _prepare_holder(
        self, ctx: InjectionContext, op: FaultOp, host: Host, peers: list[str], params: ShapeParams
    ) -> Applied:
        delay, jitter = _delay_and_jitter(params)
        state = nfqueue.plan(
            op.op_id,
            host,
            peers,
            params.interface,
            port_numbers(params.ports),
            params.protocol,
            delay,
            jitter,
            getattr(params, "distribution", "uniform"),
            getattr(params, "correlation", 0.0),
            getattr(params, "reorder", 0.0),
            params.direction,
        )
        local = (host.route(probe_address(peers[0]))[1] if peers else None) or ctx.transport.host
        incoming = params.direction == "in"
        ends = f"{', '.join(peers)} -> {local}" if incoming else f"{local} -> {', '.join(peers)}"
        where = f"{ends}{_to_ports(params)}" if peers else f"everything {local} {'receives' if incoming else 'sends'}"
        why = "tc shapes only what a host sends" if incoming else "this kernel has no tc netem"
        description = (
            f"{self._what(params)} {where}{'' if peers else f' on {params.interface}'} "
            f"({'incoming' if incoming else 'outgoing'}; NFQUEUE packet holder: {why})"
        )
        return op.record(self.name, ctx.transport.host, state.to_json(), description)

    def _what(self, params: ShapeParams) -> str:
        return self.name

    def apply(self, ctx: InjectionContext, applied: Applied) -> None:
        """Run the planned tc commands; InjectionError on a failing one (heal then deletes our root, if any)."""
        if nfqueue.is_holder_state(applied.state):
            return nfqueue.apply(ctx, applied)
        state = ShapeState.from_json(applied.state)
        install(Host(ctx.transport, state.sudo).run, state.commands)

    def heal(self, ctx: InjectionContext, applied: Applied) -> None:
        """Delete our root qdisc if it is still ours (handle and kind); idempotent, fine if the interface went."""
        if nfqueue.is_holder_state(applied.state):
            return nfqueue.heal(ctx, applied)
        state = ShapeState.from_json(applied.state)
        remove(Host(ctx.transport, state.sudo).run, state.interface, state.handle, state.kind)

    def revert_command(self, applied: Applied) -> list[str] | None:
        """``sh -c <constant script> mlchaos-tcrevert IFACE HANDLE``: see :data:`REVERT_SCRIPT` (or the NFQUEUE
        holder's: stop it, then remove its chain)."""
        if nfqueue.is_holder_state(applied.state):
            return nfqueue.revert_command(applied)
        state = ShapeState.from_json(applied.state)
        return revert_argv(state.interface, state.handle, sudo=state.sudo)


class BandwidthInjector(_ShapeFault, name="bandwidth", params=BandwidthParams):
    """limit the send rate towards peers or on an interface (tc tbf/htb)

    Limit what this host sends (to peers, or everything on an interface) with tbf / htb."""

    def _what(self, params: ShapeParams) -> str:
        return f"limit to {_rate_text(params_as(BandwidthParams, params).rate)}:"


class DelayInjector(_ShapeFault, name="delay", params=DelayParams):
    """add latency to what this host sends to peers (tc netem, else an NFQUEUE packet holder)

    Add latency (optionally with jitter) to what this host sends: tc netem, or the NFQUEUE packet holder."""

    needs_netem: ClassVar[bool] = True

    def _what(self, params: ShapeParams) -> str:
        delay = params_as(DelayParams, params)
        spread = f" ± {ms(delay.jitter)}" if delay.jitter else ""
        return f"delay by {ms(delay.delay)}{spread}:"


class JitterInjector(_ShapeFault, name="jitter", params=JitterParams):
    """vary the latency of what this host sends to peers (tc netem, else an NFQUEUE holder)

    Randomly vary the latency of what this host sends: tc netem, or the NFQUEUE packet holder."""

    needs_netem: ClassVar[bool] = True

    def _what(self, params: ShapeParams) -> str:
        jitter = params_as(JitterParams, params)
        mean = jitter.jitter if jitter.delay is None else jitter.delay
        return f"jitter {ms(mean)} ± {ms(jitter.jitter)} ({jitter.distribution}):"
