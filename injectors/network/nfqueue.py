"""``delay`` and ``jitter`` where the host's kernel has no tc netem: iptables rules steer the fault's packets to
an NFQUEUE queue, and a detached holder (:mod:`injectors.network.nfq_holder`) releases each after its delay.

The same discipline as the other iptables faults (:mod:`injectors.network.iptables`): the op's own tagged
chain, jumped to from OUTPUT (tc shapes what a host sends; so does this). Each rule ends in ``-j NFQUEUE
--queue-num N --queue-bypass``: while no holder is bound, packets pass undelayed (fail-open). Apply starts the
holder, waits until the kernel lists its queue as bound, then installs the chain; heal removes the chain
first (no new packet is held), then stops the holder (it releases what it holds as it leaves). The dead-man's
revert stops the holder, then runs the iptables revert.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from pydantic import JsonValue

from chaos.cluster.base import TransportError
from chaos.plugins.injector import (
    Applied,
    InjectionContext,
    InjectionError,
    flag,
    optional_int,
    optional_text,
    state_number,
)
from injectors import detached
from injectors.network import iptables as netfilter
from injectors.network import nfq_holder
from injectors.network.helpers import start_helper, stop_helper
from injectors.network.host import TIMEOUT_S, Host, shares_machine
from injectors.network.iptables import ChainSpec, Run

MODULE = nfq_holder.__name__
QUEUES = "/proc/net/netfilter/nfnetlink_queue"
OPEN_ENDED_S = 24 * 3600.0  # a duration-less fault's holder deadline (the dead-man ends it at the run's end)
BIND_WAIT_S = 10.0
DISTRIBUTIONS = ("uniform", "normal")  # what the holder draws; netem's pareto tables need netem


def queue_number(op_id: str, host: str) -> int:
    """A queue number for one op (4096-61439, from its id, host and the time): distinct from other ops'."""
    digest = int(hashlib.sha256(f"{op_id}\0{host}\0{time.time_ns()}".encode()).hexdigest()[:8], 16)
    return 0x1000 + digest % 0xE000


def queue_rules(
    peers: Sequence[str],
    interface: str | None,
    queue: int,
    ports: Sequence[int] = (),
    protocol: str = "all",
    direction: str = "out",
) -> list[list[str]]:
    """Rules per peer (out: ``-d`` in OUTPUT, in: ``-s`` in INPUT; to destination ``ports`` and ``protocol``
    only, when given), or one for everything leaving (``-o``) or reaching (``-i``) ``interface``."""
    target = ["-j", "NFQUEUE", "--queue-num", str(queue), "--queue-bypass"]
    if peers:
        return netfilter.drop_rules(direction, peers, protocol, ports, [], port_match="--dports", target=target)
    if interface is None:
        raise InjectionError("an NFQUEUE delay needs peers or an interface")
    return [["-i" if direction == "in" else "-o", interface, *target]]


def missing(run: Run) -> str | None:
    """Why this host cannot hold packets in an NFQUEUE queue, or None. Changes nothing: the iptables rule is
    added in a throwaway network namespace (``unshare --net``), where the kernel loads or refuses the target."""
    probe = ["unshare", "--net", "--", *netfilter.iptables("-A", "OUTPUT", "-j", "NFQUEUE", "--queue-num", "1")]
    try:
        done = run([*probe, "--queue-bypass"])
    except TransportError as exc:
        return f"cannot probe for NFQUEUE: {exc}"
    if not done.ok:
        return f"iptables cannot add an NFQUEUE rule: {(done.stderr or done.stdout).strip()[:200]}"
    return None


def holder_missing(ctx: InjectionContext) -> str | None:
    """Why the holder cannot run on the fault's host (its python cannot import it), or None."""
    if shares_machine(ctx.transport):
        return None
    try:
        done = ctx.transport.run(detached.import_argv(ctx.transport, MODULE), timeout=TIMEOUT_S)
    except TransportError as exc:
        return f"cannot run the host's python on {ctx.transport.host}: {exc}"
    return None if done.ok else f"mlchaos is not importable by python3 on {ctx.transport.host} (the packet holder)"


@dataclass(frozen=True)
class HolderState:
    """The journal state of an NFQUEUE delay: its chain, queue, the holder's settings and (once applied) pid."""

    chain: ChainSpec
    comment: str
    sudo: bool
    queue: int
    delay_us: int
    jitter_us: int
    distribution: str
    correlation: float
    seed: int
    reorder: float = 0.0
    helper_pid: int | None = None

    def to_json(self) -> dict[str, JsonValue]:
        state: dict[str, JsonValue] = {
            "backend": "nfqueue",
            "chains": [self.chain.to_json()],
            "comment": self.comment,
            "sudo": self.sudo,
            "queue": self.queue,
            "delay_us": self.delay_us,
            "jitter_us": self.jitter_us,
            "distribution": self.distribution,
            "correlation": self.correlation,
            "seed": self.seed,
            "reorder": self.reorder,
        }
        return state if self.helper_pid is None else {**state, "helper_pid": self.helper_pid}

    @classmethod
    def from_json(cls, state: dict[str, JsonValue]) -> HolderState:
        """InjectionError when the chain is not ours or a number is missing (a corrupt or foreign record)."""
        chains = netfilter.chains_from_state(state)
        if len(chains) != 1:
            raise InjectionError(f"journal state holds {len(chains)} chains, not the one an NFQUEUE delay adds")
        return cls(
            chains[0],
            optional_text(state, "comment") or "",
            flag(state, "sudo"),
            int(state_number(state, "queue")),
            int(state_number(state, "delay_us")),
            int(state_number(state, "jitter_us")),
            optional_text(state, "distribution") or "uniform",
            state_number(state, "correlation"),
            int(state_number(state, "seed")),
            state_number(state, "reorder") if "reorder" in state else 0.0,
            optional_int(state, "helper_pid"),
        )


def is_holder_state(state: dict[str, JsonValue]) -> bool:
    return state.get("backend") == "nfqueue"


def plan(
    op_id: str,
    host: Host,
    peers: Sequence[str],
    interface: str | None,
    ports: Sequence[int],
    protocol: str,
    delay_s: float,
    jitter_s: float,
    distribution: str,
    correlation: float,
    reorder: float = 0.0,
    direction: str = "out",
) -> HolderState:
    """The state of one NFQUEUE delay of what the host sends (``out``) or receives (``in``); changes nothing."""
    queue = queue_number(op_id, host.transport.host)
    chain = netfilter.chain_names(op_id, host.transport.host, [direction])[direction]
    rules = queue_rules(peers, interface, queue, ports, protocol, direction)
    spec = ChainSpec(chain, netfilter.HOOKS[direction], rules)
    seed = int(hashlib.sha256(op_id.encode()).hexdigest()[:8], 16)
    return HolderState(
        spec,
        netfilter.comment_for(op_id),
        host.sudo,
        queue,
        round(delay_s * 1e6),
        round(jitter_s * 1e6),
        distribution,
        correlation,
        seed,
        reorder,
    )


def bound_queues(run: Run) -> set[int]:
    """The queue numbers bound on the host now (its network namespace's), from the kernel's own list."""
    try:
        done = run(["cat", QUEUES])
    except TransportError:
        return set()
    return {int(line.split()[0]) for line in done.stdout.splitlines() if line.split() and line.split()[0].isdigit()}


def apply(ctx: InjectionContext, applied: Applied) -> None:
    """Start the holder, wait until its queue is bound, then install the chain; records the holder's pid."""
    state = HolderState.from_json(applied.state)
    host = Host(ctx.transport, state.sudo)
    if state.queue in bound_queues(host.run):
        raise InjectionError(f"NFQUEUE queue {state.queue} is already bound on {ctx.transport.host}")
    until_ns = detached.host_deadline_ns(ctx.transport, applied.duration_s or OPEN_ENDED_S)
    pid = start_helper(
        ctx,
        host,
        MODULE,
        applied.op_id,
        "packet holder",
        queue=state.queue,
        delay_us=state.delay_us,
        jitter_us=state.jitter_us,
        distribution=state.distribution,
        correlation=state.correlation,
        seed=state.seed,
        reorder_pct=state.reorder,
        until_ns=until_ns,
    )
    applied.state.update(replace(state, helper_pid=pid).to_json())
    deadline = time.monotonic() + BIND_WAIT_S
    while state.queue not in bound_queues(host.run):
        if not _alive(host, pid):
            raise InjectionError(f"the packet holder exited before binding NFQUEUE queue {state.queue} (see its log)")
        if time.monotonic() > deadline:
            raise InjectionError(f"the packet holder did not bind NFQUEUE queue {state.queue} within {BIND_WAIT_S:g}s")
        time.sleep(0.02)
    netfilter.install(host.run, [state.chain], state.comment)


def _alive(host: Host, pid: int) -> bool:
    try:
        return host.run(["kill", "-0", str(pid)]).ok
    except TransportError:
        return True  # unknown: the bind deadline decides


def heal(ctx: InjectionContext, applied: Applied) -> None:
    """Remove the chain (no packet is held any more), then stop the holder (it releases what it holds)."""
    state = HolderState.from_json(applied.state)
    host = Host(ctx.transport, state.sudo)
    netfilter.remove(host.run, [state.chain.chain])
    stop_helper(host, MODULE, applied.op_id, state.helper_pid)


def revert_command(applied: Applied) -> list[str]:
    """Stop the holder, then remove the chain (``sh`` and iptables only: see :func:`detached.stop_then`)."""
    state = HolderState.from_json(applied.state)
    return detached.stop_then(MODULE, applied.op_id, netfilter.revert_argv([state.chain.chain], sudo=state.sudo))
