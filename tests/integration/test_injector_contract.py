"""The injector contract, held to every registered harness-side injector on the real kernel features here.

For each one, on a real victim (a process, a private network namespace, a directory, a log file, a process with
the clock shim preloaded):

- ``prepare`` changes nothing (the world observed before and after it is the same) and its record round-trips
  as the journal writes it;
- ``apply`` changes the world (a fault that fires and changes nothing is a defect too);
- ``heal`` restores it, and a second ``heal`` is harmless;
- a heal from the journal alone, in a fresh process (``chaos.safety.cleanup.heal_leftovers``, what ``mlchaos
  cleanup`` runs), restores it;
- ``revert_command`` (what the dead-man runs without the harness) restores it, its helper included; a one-shot
  fault has none, nor has a fault whose undo needs its journal record (:data:`JOURNAL_ONLY`).

``delay`` and ``jitter`` run through tc netem where the kernel has it, else through the NFQUEUE packet holder
(this kernel: no netem). Injectors whose victims need a whole testbed are held to the same contract where that testbed is
built (:data:`ELSEWHERE` names where). A planted defect (an injector whose heal forgets a rule) fails it.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from capabilities import requires
from support import sleeper, wait_for

from chaos.cluster.base import Transport
from chaos.cluster.local import LocalTransport, process_state
from chaos.cluster.netns import NetnsTransport
from chaos.history.timeline import History
from chaos.plugins import registry
from chaos.plugins.injector import Applied, FaultOp, InjectionContext, Injector
from chaos.reference import checkpoint_store as store
from chaos.safety.journal import Journal
from injectors.clock import shim

pytestmark = requires("root", "ip", "iptables", "tc")

Observe = Callable[[], object]


@dataclass
class World:
    """One injector's victim: where it runs, its params, how to observe what the fault changes."""

    transport: Transport
    params: dict[str, Any]
    observe: Observe
    history: History | None = None
    run_in: list[str] | None = None  # argv prefix that runs a revert command where the fault is (a namespace)
    run_dir: Path | None = None  # the run's folder, for faults that keep their files there (clock)


def _cmdlines_with(text: str) -> list[str]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                line = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in line:
                found.append(line)
    return sorted(found)


@contextmanager
def _victim(tmp: Path, op_id: str, params: Callable[[int], dict[str, Any]]) -> Iterator[World]:
    with sleeper(op_id) as child:

        def observe() -> object:
            state = process_state(child.pid)
            cgroup = Path(f"/proc/{child.pid}/cgroup").read_text() if state else ""
            alive = "stopped" if state in ("T", "t") else "gone" if state in (None, "Z", "X") else "running"
            return (alive, cgroup, _cmdlines_with(f"--op-id {op_id}"))

        yield World(LocalTransport(), params(child.pid), observe)


@contextmanager
def _netns(tmp: Path, op_id: str, params: dict[str, Any]) -> Iterator[World]:
    """A private network namespace (its own iptables and qdiscs, so parallel tests never see each other's)."""
    name = f"chaos-ct-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        for argv in (
            ["ip", "link", "set", "lo", "up"],
            ["ip", "link", "add", "d0", "type", "veth", "peer", "name", "d1"],
            ["ip", "addr", "add", "10.77.0.1/24", "dev", "d0"],
            ["ip", "link", "set", "d0", "up"],
            ["ip", "link", "set", "d1", "up"],
        ):
            subprocess.run(["ip", "netns", "exec", name, *argv], check=True)

        def observe() -> object:
            rules = subprocess.run(["ip", "netns", "exec", name, "iptables", "-S"], capture_output=True, text=True)
            qdiscs = subprocess.run(
                ["ip", "netns", "exec", name, "tc", "qdisc", "show", "dev", "d0"], capture_output=True, text=True
            )
            return (rules.stdout, qdiscs.stdout.split(" refcnt")[0], _cmdlines_with(f"--op-id {op_id}"))

        yield World(NetnsTransport(name), params, observe, run_in=["ip", "netns", "exec", name])
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


@contextmanager
def _storage(tmp: Path, op_id: str) -> Iterator[World]:
    (tmp / "data").mkdir()
    (tmp / "data" / "file").write_text("x")

    def observe() -> object:
        mounts = [line for line in Path("/proc/mounts").read_text().splitlines() if str(tmp) in line]
        return (mounts, _cmdlines_with(f"--op-id {op_id}"))

    yield World(LocalTransport(), {"path": str(tmp / "data"), "mode": "latency", "latency": 0.01}, observe)


@contextmanager
def _xid_log(tmp: Path, op_id: str) -> Iterator[World]:
    log = tmp / "kern.log"
    log.write_text("an earlier line\n")
    yield World(LocalTransport(), {"code": 79, "log": str(log)}, log.read_text)


@contextmanager
def _checkpoints(tmp: Path, op_id: str, params: dict[str, Any]) -> Iterator[World]:
    directory = tmp / "ckpt"
    for step in (10, 20):
        parts = [
            store.write_part(directory, step, rank, {"w": torch.full((8,), float(step + rank))}) for rank in (0, 1)
        ]
        store.commit(directory, step, parts, 2)
    history = History()
    history.record("target.checkpoint", step=20, path=str(store.step_dir(directory, 20)))

    def observe() -> object:
        return sorted(
            (str(p.relative_to(directory)), hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "")
            for p in directory.rglob("*")
        )

    yield World(LocalTransport(), {"path": str(directory), **params}, observe, history=history)


@contextmanager
def _preloaded(tmp: Path, op_id: str) -> Iterator[World]:
    """A process with the clock shim preloaded as a run's job has it, writing its wall clock every 20 ms: the world
    is how many minutes that clock is ahead of ours."""
    if not shim.library().is_file():
        pytest.skip(f"the clock shim is not built ({shim.library()}): run make setup")
    clock = tmp / "their-clock"
    code = (
        "import os, sys, time\nwhile True:\n    open(sys.argv[1] + '.tmp', 'w').write(repr(time.time()))\n"
        "    os.replace(sys.argv[1] + '.tmp', sys.argv[1]); time.sleep(0.02)"
    )
    env = {**os.environ, **shim.job_env(tmp)}
    child = subprocess.Popen([sys.executable, "-c", code, str(clock), op_id], env=env)
    try:
        assert wait_for(clock.exists, 30), "the preloaded process never wrote its clock"

        def observe() -> object:
            return round((float(clock.read_text()) - time.time()) / 60)

        yield World(LocalTransport(), {"jump": "+1h"}, observe, run_dir=tmp)
    finally:
        child.kill()
        child.wait(timeout=10)


Setup = Callable[[Path, str], AbstractContextManager[World]]
CASES: dict[str, Setup] = {
    "kill": lambda tmp, op: _victim(tmp, op, lambda pid: {"pid": pid, "signal": "SIGTERM"}),
    "freeze": lambda tmp, op: _victim(tmp, op, lambda pid: {"pid": pid}),
    "slow": lambda tmp, op: _victim(tmp, op, lambda pid: {"pid": pid, "stopped_fraction": 0.9, "period": 0.5}),
    "cpu_throttle": lambda tmp, op: _victim(tmp, op, lambda pid: {"pid": pid, "fraction": 0.2}),
    "memory_pressure": lambda tmp, op: _victim(tmp, op, lambda pid: {"megabytes": 16}),
    "partition": lambda tmp, op: _netns(tmp, op, {"peers": ["10.77.0.9"]}),
    "packet_loss": lambda tmp, op: _netns(tmp, op, {"peers": ["10.77.0.9"], "probability": 0.5}),
    "drop_large_packets": lambda tmp, op: _netns(tmp, op, {"peers": ["10.77.0.9"], "min_size": 512}),
    "flap": lambda tmp, op: _netns(tmp, op, {"peers": ["10.77.0.9"], "period": 0.5}),
    "duplicate": lambda tmp, op: _netns(tmp, op, {"peers": ["10.77.0.9"], "probability": 0.5}),
    "bandwidth": lambda tmp, op: _netns(tmp, op, {"interface": "d0", "rate": "1mbit"}),
    "delay": lambda tmp, op: _netns(tmp, op, {"interface": "d0", "delay": 0.1}),
    "jitter": lambda tmp, op: _netns(tmp, op, {"interface": "d0", "jitter": 0.01}),
    "storage": _storage,
    "gpu_xid": _xid_log,
    "clock": _preloaded,
    "checkpoint_corrupt": lambda tmp, op: _checkpoints(tmp, op, {"files": "rank-1.pt", "bytes": 8}),
    "checkpoint_drop_shard": lambda tmp, op: _checkpoints(tmp, op, {"files": "*/rank-1.pt"}),
    "checkpoint_stale_pointer": lambda tmp, op: _checkpoints(tmp, op, {}),
}
# Reversible, but only with what their journal record keeps (the bytes a corruption replaced, a removed shard, the
# pointer's old text): ``heal`` and ``mlchaos cleanup`` (the next run's start too) restore them; there is no
# command for a dead-man, so after a killed harness they stay changed until one of those runs.
JOURNAL_ONLY = ("checkpoint_corrupt", "checkpoint_drop_shard", "checkpoint_stale_pointer")
# Held to the same contract where their victims are built: a whole testbed, a Docker daemon, a writer to trace.
ELSEWHERE = {
    "checkpoint_torn_write": "tests/integration/test_checkpoint_injectors.py (a real writer process it cuts)",
    **{
        name: "tests/integration/test_container_injectors.py (the Docker testbed)"
        for name in ("container_kill", "container_stop", "container_restart", "container_pause", "container_cpu")
    },
    **{
        name: "tests/integration/test_slurm_testbed.py and scripts/kill_trials.py --slurm-trials (the Slurm testbed)"
        for name in ("node_fail", "slurmd_stop", "drain")
    },
}


def harness_side() -> list[str]:
    return sorted(name for name, cls in registry.injectors().items() if not getattr(cls, "in_job", False))


def test_every_harness_side_injector_is_held_to_the_contract() -> None:
    missing = [name for name in harness_side() if name not in CASES and name not in ELSEWHERE]
    assert missing == [], f"add a case to CASES (or say where in ELSEWHERE): {missing}"


def _started(name: str, world: World, op_id: str) -> tuple[Injector, InjectionContext, FaultOp]:
    inj = registry.injector(name)
    ctx = InjectionContext(world.transport, history=world.history or History(), run_dir=world.run_dir)
    op = FaultOp(
        op_id=op_id, fault=op_id[:-2], injector=name, params=inj.Params.model_validate(world.params), duration_s=30
    )
    inj.check(ctx, op.params)
    return inj, ctx, op


def _heal_in_a_fresh_process(applied: Applied, world: World, state_dir: Path) -> None:
    """Journal the op as the runner does, then heal it from that journal alone in a new interpreter."""
    with Journal.for_run(f"contract-{uuid.uuid4().hex[:6]}", root=state_dir) as journal:
        journal.intent(applied)
        journal.applied(applied.op_id, applied.state)
    namespace = world.run_in[-1] if world.run_in else None
    code = (
        "import sys; from pathlib import Path\n"
        "from chaos.safety.cleanup import heal_leftovers\n"
        "from chaos.cluster.local import LocalTransport\nfrom chaos.cluster.netns import NetnsTransport\n"
        "t = NetnsTransport(sys.argv[2]) if sys.argv[2] else LocalTransport()\n"
        "print(heal_leftovers(t, state_dir=Path(sys.argv[1]), only_dead_owners=False))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(state_dir), namespace or ""],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "MLCHAOS_STATE_DIR": str(state_dir)},
    )
    assert done.returncode == 0 and "healed" in done.stdout, done.stdout + done.stderr


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("heal_by", ["heal", "journal", "revert_command"])
def test_prepare_changes_nothing_apply_changes_and_each_way_of_healing_restores(
    name: str, heal_by: str, tmp_path: Path
) -> None:
    op_id = f"contract-{name}-{uuid.uuid4().hex[:8]}#1"
    with CASES[name](tmp_path, op_id) as world:
        inj, ctx, op = _started(name, world, op_id)
        before = world.observe()
        applied = inj.prepare(ctx, op)
        assert world.observe() == before, "prepare changed the world"
        assert Applied.model_validate_json(applied.model_dump_json()) == applied, "the record does not round-trip"
        try:
            inj.apply(ctx, applied)
            assert wait_for(lambda: world.observe() != before, 5), "apply changed nothing"
            if not applied.reversible:  # one-shot: nothing to undo, and undoing must be harmless
                assert inj.revert_command(applied) is None
                inj.heal(ctx, applied)
                inj.heal(ctx, applied)
                return
            if heal_by == "heal":
                inj.heal(ctx, applied)
                assert wait_for(lambda: world.observe() == before, 10), f"heal left {world.observe()} (was {before})"
                inj.heal(ctx, applied)  # a second heal is harmless
            elif heal_by == "journal":
                _heal_in_a_fresh_process(applied, world, tmp_path / "state")
            elif name in JOURNAL_ONLY:
                assert inj.revert_command(applied) is None
                return
            else:
                argv = inj.revert_command(applied)
                assert argv is not None, "a reversible fault without a revert command: the dead-man cannot undo it"
                subprocess.run([*(world.run_in or []), *argv], capture_output=True, timeout=60, check=False)
            assert wait_for(lambda: world.observe() == before, 10), f"{heal_by} left {world.observe()} (was {before})"
        finally:
            inj.heal(ctx, applied)  # whatever happened above, leave nothing


class _ForgetfulPartition:
    """A planted defect: a partition whose heal does nothing."""

    def __init__(self) -> None:
        self.real = registry.injector("partition")
        self.name, self.Params, self.summary = "partition", self.real.Params, "planted"

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.real, attr)

    def heal(self, ctx: InjectionContext, applied: Applied) -> None:
        return None


def test_a_planted_heal_that_forgets_its_rules_fails_the_contract(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    forgetful = _ForgetfulPartition()
    monkeypatch.setattr(registry, "injector", lambda name: forgetful if name == "partition" else None)
    with pytest.raises(AssertionError, match="heal left"):  # (its namespace, rules and all, is deleted after)
        test_prepare_changes_nothing_apply_changes_and_each_way_of_healing_restores("partition", "heal", tmp_path)
