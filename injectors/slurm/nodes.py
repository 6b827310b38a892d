"""What the Slurm faults do to a node, and undo: shared by the injectors (apply, heal) and the dead-man
(``python -m injectors.slurm.nodes --state JSON``), so the crash path runs the same code as heal.

A testbed node ``hN`` is a network namespace of this machine whose ``slurmd`` the testbed started
(:mod:`chaos.testbed.slurm`); its daemon and its jobs' processes (``slurmstepd`` and every process
below) are found by that namespace, never by name alone. Restarting goes through the testbed's own start
(``nsenter`` into the namespace, the node's hostname and hosts file), so the node comes back exactly as ``up``
made it.

Resuming is careful: a node is resumed only while it is DOWN for want of its daemon (Slurm's own "Not
responding", or our fault's reason) or drained with OUR reason. A node a health check drained meanwhile
(``mlchaos-hc: ...``) stays drained: that drain is the behaviour under test.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from dataclasses import dataclass

from pydantic import JsonValue

from chaos.plugins.injector import InjectionError
from chaos.slurm.client import Node, SlurmClient, SlurmError
from chaos.slurm.locate import ClusterNotFound, SlurmCluster
from chaos.testbed import slurm_daemons as daemons
from chaos.testbed.slurm_daemons import SlurmLayout

MODULE = "injectors.slurm.nodes"
NOT_RESPONDING = "Not responding"  # the reason slurmctld gives a node whose slurmd went silent
_REGISTER_S = 20.0  # how long heal waits for a restarted slurmd to register


@dataclass(frozen=True)
class NodeFault:
    """The journal state of every Slurm fault: what was done to which node of which cluster."""

    action: str  # node_fail, slurmd_stop, drain
    node: str  # Slurm's node name
    cluster: SlurmCluster
    reason: str  # the reason we set (drain) or recognise as ours
    netns: str | None = None  # testbed: the node's network namespace

    def to_json(self) -> dict[str, JsonValue]:
        return {
            "action": self.action,
            "node": self.node,
            "cluster": self.cluster.to_json(),
            "reason": self.reason,
            "netns": self.netns,
        }

    @classmethod
    def from_json(cls, state: dict[str, JsonValue]) -> NodeFault:
        action, node, reason, netns = (state.get(k) for k in ("action", "node", "reason", "netns"))
        if (
            action not in ("node_fail", "slurmd_stop", "drain")
            or not isinstance(node, str)
            or not isinstance(reason, str)
        ):
            raise InjectionError(f"journal state is not a Slurm node fault: {state!r}")
        try:
            cluster = SlurmCluster.from_json(state.get("cluster"))
        except ValueError as exc:
            raise InjectionError(str(exc)) from None
        return cls(str(action), node, cluster, reason, netns if isinstance(netns, str) else None)

    def client(self) -> SlurmClient:
        try:
            return self.cluster.client(timeout=20.0)
        except ClusterNotFound as exc:
            raise InjectionError(f"cannot reach {self.cluster.describe()}: {exc}") from None


# -- the testbed's processes -----------------------------------------------------------------------------------


def _testbed(fault: NodeFault) -> tuple[SlurmLayout, str]:
    """(the testbed's Slurm layout, the node's namespace); InjectionError when it is not a testbed node."""
    from chaos.testbed import slurm as testbed

    if fault.cluster.kind != "testbed" or fault.cluster.state_dir is None or fault.netns is None:
        raise InjectionError(f"{fault.node} is not a node of a Slurm testbed of this machine")
    return testbed.slurm_layout(fault.cluster.state_dir), fault.netns


def slurmd_pids(fault: NodeFault) -> list[int]:
    """The node's slurmd (the testbed's own, in its namespace)."""
    layout, ns = _testbed(fault)
    return daemons.pids(layout, ("slurmd",), ns=ns)


def job_pids(fault: NodeFault) -> list[int]:
    """Every job process on the node: its slurmstepds and everything below them."""
    _, ns = _testbed(fault)
    try:
        inode = os.stat(f"/run/netns/{ns}").st_ino
    except OSError as exc:
        raise InjectionError(f"namespace {ns} is gone: {exc.strerror}") from None
    return daemons.job_pids({inode})


def kill(pids: list[int], signum: int) -> int:
    """Signal ``pids``; how many were there."""
    hit = 0
    for pid in pids:
        try:
            os.kill(pid, signum)
            hit += 1
        except ProcessLookupError:
            continue
    return hit


def start_slurmd(fault: NodeFault) -> bool:
    """Start the node's slurmd as the testbed starts it, unless it runs; True when one was started."""
    from chaos.testbed import slurm as testbed
    from chaos.testbed.system import TestbedError

    layout, ns = _testbed(fault)
    if daemons.pids(layout, ("slurmd",), ns=ns):
        return False
    if not layout.conf.exists():
        return False  # the testbed was taken down meanwhile: nothing to restart
    try:
        testbed._ensure_slurmd(layout, fault.node, ns, lambda _line: None)
    except TestbedError as exc:
        raise InjectionError(f"cannot restart slurmd of {fault.node}: {exc}") from None
    return True


# -- heal --------------------------------------------------------------------------------------------------------


def ours(node: Node, fault: NodeFault) -> bool:
    """Whether ``node``'s drain or down is this fault's doing (so resuming it undoes no one else's)."""
    if node.reason == fault.reason:
        return True
    return (
        fault.action != "drain" and not node.drained and node.state == "DOWN" and node.reason in (None, NOT_RESPONDING)
    )


def heal(fault: NodeFault, *, wait_s: float = _REGISTER_S) -> str:
    """Undo ``fault``: restart the node's slurmd (node_fail, slurmd_stop), then resume the node when it is
    drained or down by our doing. Idempotent; what it did, in words."""
    done = []
    if fault.action in ("node_fail", "slurmd_stop"):
        try:
            if start_slurmd(fault):
                done.append("restarted slurmd")
        except InjectionError as exc:
            if fault.cluster.state_dir is not None and fault.cluster.state_dir.exists():
                raise
            return f"testbed {fault.cluster.state_dir} is gone ({exc})"
    try:
        client = fault.client()
    except InjectionError:
        if fault.cluster.kind == "testbed":
            return ", ".join(done) or "testbed gone: nothing to resume"
        raise
    deadline = time.monotonic() + (wait_s if done else 0.0)
    while True:
        try:
            node = client.node(fault.node)
        except SlurmError as exc:
            raise InjectionError(f"cannot read node {fault.node}: {exc}") from None
        if node.responding or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    if (node.drained or node.state == "DOWN") and ours(node, fault):
        try:
            client.resume(fault.node)
        except SlurmError as exc:
            raise InjectionError(f"cannot resume {fault.node}: {exc}") from None
        done.append(f"resumed {fault.node}")
    elif node.drained or node.state == "DOWN":
        done.append(f"left {fault.node} {node.state} ({node.reason}): not our doing")
    return ", ".join(done) or "nothing to undo"


def revert_argv(state: dict[str, JsonValue]) -> list[str]:
    """The dead-man's revert of a Slurm fault: this module's :func:`heal`, on this machine."""
    return [sys.executable, "-m", MODULE, "--state", json.dumps(state, separators=(",", ":"))]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description="heal a Slurm node fault")
    parser.add_argument("--state", required=True, help="the fault's journal state (JSON)")
    args = parser.parse_args(argv)
    try:
        fault = NodeFault.from_json(json.loads(args.state))
        print(heal(fault), flush=True)
    except (InjectionError, ValueError) as exc:
        print(f"heal failed: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    sys.exit(main(sys.argv[1:]))
