"""One round trip per host per action, on real testbed hosts: a partition is armed (its dead-man switch) and
applied by ONE SSH command, healed and its switch cancelled by one more, and none of the guarantees moves: the
switch runs before the world changes, heal removes exactly our rules, nothing is left on the host, and when a
one-command step fails (it changes nothing) the long way still heals everything.

The constant scripts are also run here on this machine: a switch that does not start never lets the fault's
command run, and a cancel never signals a process that does not carry the switch's marker.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from support import sleeper, wait_for

from chaos.cluster.base import Completed
from chaos.cluster.inventory import Host, Inventory
from chaos.cluster.ssh import SshTransport
from chaos.plugins.injector import Applied, FaultOp, InjectionContext
from chaos.run.lifecycle import heal_and_disarm
from chaos.run.switch import DeadMan, one_command
from chaos.safety import remote_deadman
from chaos.spec.scenario import SafetySpec
from injectors.network import iptables as netfilter
from injectors.network.faults import FilterState, FlapInjector, PartitionInjector, PartitionParams

pytestmark = pytest.mark.usefixtures("isolated_state_dir")


class _Counting(SshTransport):
    commands: list[list[str]]

    def run(self, argv: list[str], *, timeout: float = 30.0, check: bool = False) -> Completed:
        self.commands.append(argv)
        return super().run(argv, timeout=timeout, check=check)

    def put(self, data: bytes, path: str) -> None:
        self.commands.append(["put", path])
        super().put(data, path)


def _transport(testbed: Inventory, name: str) -> _Counting:
    transport = _Counting(
        testbed.host(name), known_hosts=testbed.known_hosts, accept_unknown=testbed.accept_unknown_host_keys
    )
    transport.commands = []
    return transport


def _in_ns(testbed: Inventory, name: str, *argv: str) -> str:
    """``argv`` on host ``name`` through a transport of its own (not counted)."""
    observer = SshTransport.for_host(testbed, name)
    try:
        return observer.run(list(argv), check=True).stdout
    finally:
        observer.close()


def _group(pid: int) -> list[str]:
    """Processes of process group ``pid`` (a switch and its ``sleep``) on this machine (testbed hosts share it)."""
    found = subprocess.run(["pgrep", "-g", str(pid)], capture_output=True, text=True, check=False)
    return found.stdout.split()


def _prepare(testbed: Inventory, transport: _Counting, op_id: str) -> tuple[InjectionContext, Applied]:
    ctx = InjectionContext(transport, extras={"host": transport.host, "inventory": testbed})
    op = FaultOp(op_id=op_id, fault="cut", injector="partition", params=PartitionParams(peers=["group:all"]))
    return ctx, PartitionInjector().prepare(ctx, op).model_copy(update={"host": transport.host})


def test_armed_and_applied_in_one_command_healed_in_one_more(testbed: Inventory) -> None:
    transport = _transport(testbed, "h1")
    injector = PartitionInjector()
    ctx, applied = _prepare(testbed, transport, "one@h1")
    chains = FilterState.from_json(applied.state).chain_names
    transport.commands.clear()
    switch = DeadMan.arm(
        ctx,
        Path("unused"),
        "one@h1",
        injector.revert_command(applied),
        30.0,
        SafetySpec(),
        local=False,
        then=one_command(injector, applied, "apply"),
    )
    try:
        assert switch is not None and switch.applied_with_arm and switch.remote_pid is not None
        assert len(transport.commands) == 1, transport.commands
        rules = _in_ns(testbed, "h1", "iptables", "-S")
        assert all(chain in rules for chain in chains) and "mlchaos:one@h1" in rules
        assert _group(switch.remote_pid), "the switch is not running on the host"
        pid = switch.remote_pid
        transport.commands.clear()
        heal_and_disarm(injector, ctx, applied, switch)
        assert len(transport.commands) == 1, transport.commands
        left = _in_ns(testbed, "h1", "iptables", "-S")
        assert "CHAOS-" not in left and "mlchaos" not in left
        assert wait_for(lambda: not _group(pid), 5), "the switch (or its sleep) is still there"
    finally:
        injector.heal(ctx, applied)
        remote_deadman.disarm(transport, remote_deadman.marker("one@h1"))
        transport.close()


def test_failed_one_command_steps_change_nothing_and_the_long_way_heals(testbed: Inventory) -> None:
    """A retried apply (its chains exist: the batch fails) falls back to the command path, which adds no second
    jump; a heal batch that cannot commit (an extra copy of a jump) keeps the switch, and heal removes every copy."""
    transport = _transport(testbed, "h2")
    injector = PartitionInjector()
    ctx, applied = _prepare(testbed, transport, "retry@h2")
    state = FilterState.from_json(applied.state)
    revert = injector.revert_command(applied)
    then = one_command(injector, applied, "apply")
    first = DeadMan.arm(ctx, Path("unused"), "retry@h2", revert, 30.0, SafetySpec(), local=False, then=then)
    try:
        assert first is not None and first.applied_with_arm
        again = DeadMan.arm(ctx, Path("unused"), "retry@h2", revert, 30.0, SafetySpec(), local=False, then=then)
        assert again is not None and not again.applied_with_arm and again.remote_pid is not None
        injector.apply(ctx, applied)  # what the runner does then
        jumps = [line for line in _in_ns(testbed, "h2", "iptables", "-S").splitlines() if "mlchaos:retry@h2" in line]
        assert len(jumps) == len(state.chains), jumps
        spec = state.chains[0]
        extra = ["-I", spec.hook, "1", "-m", "comment", "--comment", "mlchaos:retry@h2", "-j", spec.chain]
        _in_ns(testbed, "h2", *netfilter.iptables(*extra))
        heal_and_disarm(injector, ctx, applied, again)
        left = _in_ns(testbed, "h2", "iptables", "-S")
        assert "CHAOS-" not in left and "mlchaos" not in left
        assert wait_for(lambda: not _group(first.remote_pid or 0) and not _group(again.remote_pid or 0), 5)
    finally:
        injector.heal(ctx, applied)
        remote_deadman.disarm(transport, remote_deadman.marker("retry@h2"))
        transport.close()


def test_the_command_never_runs_when_the_switch_does_not_start(tmp_path: Path) -> None:
    landed = tmp_path / "landed"
    argv = ["sh", "-c", remote_deadman.ARMED_SCRIPT, "mlchaos-armed", "1", "", "false", "touch", str(landed)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert done.returncode == remote_deadman.ARMED_FAILED and "did not start" in done.stderr
    assert not landed.exists()


def test_a_cancel_never_signals_a_process_without_the_marker() -> None:
    mark = remote_deadman.marker("nobody")
    then = remote_deadman.HostCommand(["true"])
    with sleeper() as proc:  # a process that happens to hold the pid a switch once had
        done = subprocess.run(remote_deadman.disarmed_argv(mark, proc.pid, then), capture_output=True, check=False)
        assert done.returncode == 0 and proc.poll() is None


def test_one_command_only_where_it_is_whole_and_fits() -> None:
    """A batch too big for one argv word, a host without a usable iptables-restore, and flap (whose helper starts
    after the chains) all take the long way: no one-command apply or heal."""

    class _Root:
        host = "h1"

        def run(self, argv: list[str], *, timeout: float = 30.0, check: bool = False) -> Completed:
            out = {"id": "0\n", "ip": "10.0.0.1 dev eth0 src 10.0.0.1\n"}.get(argv[0], "iptables v1.8.9 (nf_tables)\n")
            return Completed(tuple(argv), 0, out, "")

    def applied(peers: int) -> Applied:
        hosts = [Host(name=f"h{i}", address=f"10.{i // 250}.{i % 250}.1") for i in range(1, peers + 2)]
        ctx = InjectionContext(_Root(), extras={"host": "h1", "inventory": Inventory(hosts=hosts)})  # type: ignore[arg-type]
        op = FaultOp(op_id="big@h1", fault="cut", injector="partition", params=PartitionParams(peers=["group:all"]))
        return PartitionInjector().prepare(ctx, op)

    small, big = applied(10), applied(1500)
    injector = PartitionInjector()
    assert one_command(injector, small, "apply") is not None and one_command(injector, small, "heal") is not None
    assert one_command(injector, big, "apply") is None  # > MAX_INPUT: the file path (3 more round trips)
    no_restore = small.model_copy(update={"state": {**small.state, "restore": False}})
    assert one_command(injector, no_restore, "apply") is None and one_command(injector, no_restore, "heal") is None
    assert one_command(FlapInjector(), small, "apply") is None and one_command(FlapInjector(), small, "heal") is None


def _validated(tmp_path: Path, inventory: Inventory, name: str) -> list[str]:
    """``mlchaos validate --inventory`` (probing) of a partition of h2 from h3, against ``inventory``."""
    from chaos.cli.preflight import check_files
    from chaos.cluster.inventory import dump_inventory

    inventory_file = tmp_path / f"{name}.inventory.yaml"
    dump_inventory(inventory, inventory_file)
    scenario = tmp_path / f"{name}.yaml"
    scenario.write_text(
        "name: cut\ntarget: {type: command, command: [sleep, '5']}\nfaults:\n"
        "  - {name: cut, type: partition, params: {peers: [host:h3]}, hosts: {host: h2}, trigger: {after: 1s}, duration: 1s}\n"
        "checks: [{type: completes}]\n"
    )
    return [str(p) for p in check_files([scenario], inventory=inventory_file, hosts=True, probe=True).problems]


def test_validate_with_an_inventory_reaches_the_hosts_as_run_does(testbed: Inventory, tmp_path: Path) -> None:
    assert _validated(tmp_path, testbed, "ok") == []
    # A changed host key: the run refuses it, and now so does validate, at the fault's hosts line.
    assert testbed.known_hosts is not None
    forged = tmp_path / "known_hosts"
    address = testbed.host("h2").address
    lines = testbed.known_hosts.read_text().splitlines()
    other = next(line for line in lines if not line.startswith(address + " ")).split(" ", 1)[1]  # another host's key
    forged.write_text(
        "\n".join([line for line in lines if not line.startswith(address + " ")] + [f"{address} {other}"]) + "\n"
    )
    [problem] = _validated(tmp_path, testbed.model_copy(update={"known_hosts": forged}), "key")
    assert ":4:" in problem and "host h2" in problem and "cannot be reached" in problem, problem
    assert "fix: check its address, user, key and known_hosts" in problem
    # An address nothing answers on.
    hosts = [h.model_copy(update={"address": "127.0.0.1", "port": 1}) if h.name == "h2" else h for h in testbed.hosts]
    [problem] = _validated(tmp_path, testbed.model_copy(update={"hosts": hosts}), "gone")
    assert "host h2 (127.0.0.1) cannot be reached" in problem, problem
