"""What the tests share: the repository root, polling, throwaway processes and what /proc says of processes, the
CLI as a user runs it, scenarios written and run through the harness, testbeds' lifetimes, per-host transports,
small test doubles, hand-made histories, and readers of a written HTML report. Importable as ``support`` from
every test folder: tests/conftest.py sits in tests/ without an ``__init__.py``, so pytest puts tests/ on sys.path.

Helpers return what they saw and the tests decide, except where a test cannot go on: the HTML-report readers at
the end fail a test whose page does not parse, :func:`frozen_child` one whose child did not stop, and
:func:`dead_man_heal_seconds` one whose fault was never applied or never healed.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeAlias, TypeVar

import pytest
from pydantic import BaseModel

from chaos.cluster.base import Completed, TransportError
from chaos.cluster.local import LocalTransport, process_state
from chaos.history.timeline import Event
from chaos.injob.fault_events import FiringRules
from chaos.plugins.injector import Applied, FaultOp, InjectionContext, Unsupported
from chaos.spec.roles import RolesTarget

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

    from chaos.cluster.inventory import Inventory
    from chaos.run.result import RunResult
    from chaos.spec.scenario import Scenario

# tests/support.py -> the repository root, whatever folder a test module sits in.
ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "scenarios"
# `mlchaos` as a user runs it, without relying on the console script being on PATH.
CLI = [sys.executable, "-m", "chaos.cli.commands"]
# What runs inside the user's training process: torch and these mlchaos modules, nothing else of what the harness
# depends on (pydantic, yaml, docker, paramiko, typer, rich, matplotlib, prometheus_client, pytest, ...), nor the
# injector modules (pydantic models: the YAML schema). The layering test holds the imports to it; the public
# surface test, what a fresh interpreter loads.
IN_JOB_SURFACE = (
    "chaos.agent",
    "chaos.events",
    "chaos.event_kinds",
    "chaos.kernel",
    "chaos.injob",
    "chaos.guards",
    "chaos.plan.agent_plan",
    "chaos.plan.seeds",
)
_START_DOCKERD = ROOT / "scripts" / "start-dockerd.sh"


# A command target's program (``python -c REACH_SSHD ADDRESS N``, run inside one host's network namespace): a TCP
# connect to ADDRESS's sshd every 0.2 s, N times; prints ``ok I`` when it answers, ``unreachable I`` when not.
REACH_SSHD = (
    "import socket, sys, time\n"
    "for i in range(int(sys.argv[2])):\n"
    "    try:\n"
    "        socket.create_connection((sys.argv[1], 22), timeout=0.3).close(); print('ok', i, flush=True)\n"
    "    except OSError:\n"
    "        print('unreachable', i, flush=True)\n"
    "    time.sleep(0.2)\n"
)


def wait_for(predicate: Callable[[], object], timeout: float = 15.0, interval: float = 0.05) -> bool:
    """True as soon as ``predicate()`` is truthy, polling every ``interval`` s; after ``timeout`` s its last
    answer (one more look, so a condition met right at the deadline still counts)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


@contextmanager
def sleeper(marker: str = "") -> Iterator[subprocess.Popen[bytes]]:
    """A real child process that sleeps 60 s (``marker`` makes its command line unique); killed on exit."""
    proc = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep(60)  # {marker}"])
    try:
        yield proc
    finally:
        proc.kill()  # SIGKILL also ends a stopped process
        proc.wait()


@contextmanager
def frozen_child() -> Iterator[subprocess.Popen[bytes]]:
    """A :func:`sleeper` stopped by SIGSTOP (its /proc state ``T`` before it is yielded); killed on exit."""
    with sleeper() as proc:
        os.kill(proc.pid, signal.SIGSTOP)
        assert wait_for(lambda: process_state(proc.pid) == "T", 5)
        yield proc


def cont(pid: int) -> list[str]:
    """The revert command that continues a stopped ``pid`` (what a dead-man switch of a freeze runs)."""
    return ["kill", "-s", "CONT", str(pid)]


def sampled_states(pid: int, seconds: float) -> list[str | None]:
    """The states /proc shows for ``pid`` (``R``, ``S``, ``T``, ...; None once it is gone), read every 10 ms for
    ``seconds`` s."""
    seen = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        seen.append(process_state(pid))
        time.sleep(0.01)
    return seen


@dataclass(frozen=True)
class Proc:
    """One process as /proc shows it."""

    pid: int
    comm: str
    state: str  # R, S, T, Z, ...
    ppid: int
    cmdline: bytes  # NUL-separated


def live_processes() -> list[Proc]:
    """Every process on this machine that is not a zombie (one that ends while /proc is read is left out)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue  # gone while we looked
        state, ppid = stat[stat.rindex(")") + 2 :].split()[:2]
        if state != "Z":
            found.append(Proc(int(entry), stat[stat.index("(") + 1 : stat.rindex(")")], state, int(ppid), cmdline))
    return found


def pids_where(match: Callable[[bytes], bool]) -> list[int]:
    """Pids of the processes whose raw ``/proc/PID/cmdline`` (NUL-separated) ``match`` accepts."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and match(Path(f"/proc/{entry}/cmdline").read_bytes()):
                found.append(int(entry))
        except OSError:
            continue  # gone while we looked
    return found


def pids_running(argv: list[str]) -> list[int]:
    """Pids of the processes whose command line is exactly ``argv``."""
    wanted = ("\0".join(argv) + "\0").encode()
    return pids_where(lambda cmdline: cmdline == wanted)


def pids_mentioning(marker: str) -> list[int]:
    """Pids of the processes whose command line contains ``marker`` anywhere."""
    return pids_where(lambda cmdline: marker.encode() in cmdline)


def root_chains() -> set[str]:
    """The mlchaos iptables chains (``CHAOS-…``) in this machine's root network namespace now."""
    rules = subprocess.run(["iptables", "-S"], capture_output=True, text=True, check=False).stdout
    return {line.split()[1] for line in rules.splitlines() if line.startswith("-N CHAOS")}


def chains_left_since(before: set[str], grace: float = 30.0) -> set[str]:
    """Chains that appeared in the root namespace since ``before`` and are still there after ``grace`` s.

    Parallel test workers (and other runs on the machine) hold chains of their own for a while; a chain this
    test leaked never goes away, so only one that outlives the grace is left behind."""
    wait_for(lambda: not (root_chains() - before), timeout=grace, interval=0.5)
    return root_chains() - before


def mlchaos(
    *args: str | Path, cwd: Path = ROOT, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``mlchaos ARGS`` run to its end, output captured as text."""
    return subprocess.run(
        [*CLI, *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def run_scenario_file(
    name: str, *args: str | Path, cwd: Path = ROOT, timeout: float = 420
) -> subprocess.CompletedProcess[str]:
    """``mlchaos run scenarios/NAME.yaml ARGS`` with a wide terminal (so the summary is not wrapped)."""
    return mlchaos(
        "run", SCENARIOS / f"{name}.yaml", *args, cwd=cwd, env={**os.environ, "COLUMNS": "200"}, timeout=timeout
    )


def spawn_harness(*args: str | Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """``mlchaos ARGS`` started in the background, output discarded: a harness the test will signal."""
    return subprocess.Popen(
        [*CLI, *map(str, args)], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def dead_man_heal_seconds(
    scenario: Path, inventory: Inventory, folder: Path, faulted: Callable[[], bool], *, heal_within: float
) -> float:
    """``mlchaos run SCENARIO --inventory`` ``inventory`` started in the background (its inventory file, reports
    and state dir under ``folder``) and SIGKILLed as soon as ``faulted()`` holds: the seconds from the kill until
    ``faulted()`` no longer holds, a heal nobody but a dead-man switch can have done. Fails the test where the
    harness dies first or the fault is not applied within 90 s, or not healed within ``heal_within`` s of the
    kill. Whatever happens, the harness is killed and ``mlchaos cleanup`` heals what the journal holds."""
    inventory_file = write_inventory(inventory, folder)
    env = {"MLCHAOS_STATE_DIR": str(folder / "state"), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "COLUMNS": "200"}
    harness = spawn_harness("run", scenario, "--inventory", inventory_file, "--report-dir", folder / "reports", env=env)
    try:
        deadline = time.monotonic() + 90
        while not faulted():
            assert harness.poll() is None and time.monotonic() < deadline, "the fault was never applied"
            time.sleep(0.1)
        killed = time.monotonic()
        harness.send_signal(signal.SIGKILL)
        harness.wait(timeout=10)
        while faulted():
            assert time.monotonic() - killed < heal_within, "the fault outlived the harness: no dead-man healed it"
            time.sleep(0.2)
        return time.monotonic() - killed
    finally:
        if harness.poll() is None:
            harness.kill()
        mlchaos("cleanup", "--inventory", inventory_file, env=env, timeout=60)


def reported_run_dir(done: subprocess.CompletedProcess[str]) -> Path:
    """The run folder ``mlchaos run`` named on its last ``reports:`` line (one report root may hold many)."""
    found = re.findall(r"reports: (\S+)", done.stdout)
    assert found, done.stdout[-2000:]
    return Path(found[-1])


def written_run(done: subprocess.CompletedProcess[str]) -> tuple[Path, dict[str, Any], list[dict[str, Any]]]:
    """What a finished ``mlchaos run`` wrote: its run folder (:func:`reported_run_dir`), ``run.json`` and the
    history's events."""
    run_dir = reported_run_dir(done)
    return run_dir, json.loads((run_dir / "run.json").read_text()), read_jsonl(run_dir / "history.jsonl")


def write_inventory(inventory: Any, folder: Path) -> Path:
    """``inventory`` written as ``FOLDER/inventory.yaml`` (what ``--inventory`` takes); its path."""
    from chaos.cluster.inventory import dump_inventory

    path = folder / "inventory.yaml"
    dump_inventory(inventory, path)
    return path


def scenario_yaml(
    name: str,
    seed: int,
    target: dict[str, Any],
    *,
    safety: dict[str, Any],
    faults: list[dict[str, Any]] | None = None,
    checks: list[dict[str, Any]] | None = None,
    cluster: dict[str, Any] | None = None,
) -> str:
    """A scenario file's text: one top-level key a line, each value written as JSON (which YAML reads as flow
    style), so a value needs no YAML escaping and a test may still edit the text (``.replace("checks:", ...)``).
    A section left None is left out, as a scenario without it would be written. A scenario with no checks says
    ``allow_no_checks: true`` (without it, one that can only pass is refused)."""
    sections = {"name": name, "seed": seed, "allow_no_checks": None if checks else True, "cluster": cluster}
    sections |= {"target": target}
    sections |= {"faults": faults, "checks": checks, "safety": safety}
    return "".join(f"{key}: {json.dumps(value)}\n" for key, value in sections.items() if value is not None)


def ticker(
    ticks: int,
    *,
    say: str = "print('tick', i, flush=True)",
    then: str = "",
    step: str = r"tick (?P<step>\d+)",
    matchers: tuple[dict[str, str], ...] = (),
) -> dict[str, Any]:
    """A command target that runs ``say`` (a line that names the step ``i``) every 0.1 s for ``ticks`` steps,
    then the Python line ``then``; ``step`` is the regex that makes a line a ``target.step``."""
    code = f"import time\nfor i in range({ticks}): {say}; time.sleep(0.1)" + (f"\n{then}" if then else "")
    steps = {"pattern": step, "event": "target.step"}
    return {"type": "command", "command": [sys.executable, "-c", code], "matchers": [steps, *matchers]}


def edited_script(script: Path, out: Path, insert: dict[str, str], drop: str | None = None) -> Path:
    """``script`` written to ``out`` with ``insert[key]`` (a line) added after the line whose stripped text is
    ``key``, and without the line ``drop`` (a mutant): a user's script plus exactly those edits, which this
    asserts, so a test that says "one line" cannot drift."""
    lines = script.read_text().splitlines(keepends=True)
    edited: list[str] = []
    for line in lines:
        if line.strip() != drop:
            edited.append(line)
        if line.strip() in insert:
            edited.append(insert[line.strip()] + "\n")
    expected = len(lines) + len(insert) - (drop is not None)
    assert len(edited) == expected, (
        f"{script.name} changed: its edits ({sorted(insert)}, drop {drop!r}) no longer apply"
    )
    out.write_text("".join(edited))
    return out


def attached_script(
    script: Path, out: Path, attach: str, drop: str | None = None, after: str = "ddp = DistributedDataParallel(model)"
) -> Path:
    """A user's DDP script (``import torch`` ... ``ddp = DistributedDataParallel(model)``, or the line ``after``)
    written to ``out`` with exactly the one-line tier's two edits: ``import chaos.agent``, and
    ``agent = <attach>`` after the DDP wrap (and, for a mutant, without the line ``drop``): see
    :func:`edited_script`."""
    insert = {"import torch": "import chaos.agent", after: f"    agent = {attach}  # the one line"}
    return edited_script(script, out, insert, drop)


def write_and_run(
    report_root: Path, folder: Path, name: str, seed: int, target: dict[str, Any], **sections: Any
) -> RunResult:
    """``scenario_yaml(name, seed, target, **sections)`` saved as ``FOLDER/NAME.yaml``, as a user would write it,
    and run through the whole harness (``execute``, golden run and all)."""
    from chaos.run.orchestrator import RunOptions, execute
    from chaos.spec.scenario import load_scenario

    source = folder / f"{name}.yaml"
    source.write_text(scenario_yaml(name, seed, target, **sections))
    return execute(load_scenario(source), RunOptions(report_root=report_root, scenario_file=source))


def run_user_script(
    report_root: Path,
    folder: Path,
    name: str,
    script: Path,
    args: list[str | float],
    fault: dict[str, Any] | list[dict[str, Any]],
    checks: list[dict[str, Any]],
) -> RunResult:
    """``script`` (a user's training script) as a 2-rank torchrun target with 2 restarts, one ``fault`` (or a
    list of them) and ``checks``, through the whole harness: see :func:`write_and_run`."""
    target = {"type": "torchrun", "script": str(script), "nproc_per_node": 2, "max_restarts": 2, "args": args}
    safety = {"max_duration": "150s", "no_progress_timeout": "60s"}
    faults = fault if isinstance(fault, list) else [fault]
    return write_and_run(report_root, folder, name, 5, target, faults=faults, checks=checks, safety=safety)


def verdicts(result: RunResult) -> dict[str, tuple[str, str]]:
    """Each check's (status, reason), by check type."""
    return {r.check: (r.status, r.reason) for r in result.results}


def verdicts_by_name(result: RunResult) -> dict[str, tuple[str, str]]:
    """Each check's (status, reason), by its own name (``detected_within[kill-group-1]``: one fault's)."""
    return {r.name: (r.status, r.reason) for r in result.results}


def detected_and_recovered(fault: str, detected: str, recovered: str) -> list[dict[str, Any]]:
    """The checks ``detected_within`` ``detected`` and ``recovered_within`` ``recovered`` of the fault ``fault``."""
    return [
        {"type": "detected_within", "params": {"fault": fault, "within": detected}},
        {"type": "recovered_within", "params": {"fault": fault, "within": recovered}},
    ]


def cut_off(host: str, *, after: str, duration: float) -> dict[str, Any]:
    """A partition fault named ``cut-<host>`` that cuts ``host`` from every other host for ``duration`` s."""
    hosts, peers = {"host": host}, {"peers": ["group:all"]}
    return {
        "name": f"cut-{host}",
        "type": "partition",
        "hosts": hosts,
        "params": peers,
        "trigger": {"after": after},
        "duration": f"{duration}s",
    }


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines file (a run's ``history.jsonl``), in order."""
    return [json.loads(line) for line in path.read_text().splitlines()]


def docker_unavailable() -> str | None:
    """Why no Docker daemon can be used here (the start script's own words), or None when one answers."""
    try:
        done = subprocess.run(["bash", str(_START_DOCKERD)], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot run {_START_DOCKERD.name}: {exc}"
    if done.returncode != 0:
        return f"no Docker daemon: {(done.stdout + done.stderr).strip() or f'{_START_DOCKERD.name} exited {done.returncode}'}"
    return None


_Bed = TypeVar("_Bed")


def standing(reason: str | None, up: Callable[[], _Bed], down: Callable[[], object]) -> Iterator[_Bed]:
    """A testbed's whole life, for a fixture to ``yield from``: skip with ``reason`` when it cannot be built, else
    ``up`` and, whatever happened (a half-built one too), ``down``."""
    if reason is not None:
        pytest.skip(reason)
    try:
        yield up()
    finally:
        down()


class _Closable(Protocol):
    def close(self) -> None: ...


_T = TypeVar("_T", bound=_Closable)


@contextmanager
def transports_per_host(inventory: Any, connect: Callable[[Any, str], _T]) -> Iterator[dict[str, _T]]:
    """One transport per host of ``inventory`` (``connect(inventory, name)``), all closed on exit."""
    transports = {host.name: connect(inventory, host.name) for host in inventory.hosts}
    try:
        yield transports
    finally:
        for transport in transports.values():
            transport.close()


class FakeClock:
    """A clock the test moves by hand: ``clock.now += 0.3``."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Recorder:
    """An ``emit`` that keeps events in memory (picklable, so results come back from spawned ranks)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int | None, dict[str, Any]]] = []

    def __call__(self, kind: str, *, rank: int | None = None, **data: Any) -> None:
        self.events.append((kind, rank, data))


class PseudoRemote:
    """This machine reached as if it were remote, as over SSH: an injector runs commands on it (the hold
    registry's sh script, ``cat`` and ``ps`` for /proc, ``kill``) instead of its Python code for the local host.
    ``kill_binary`` stands in for the ``kill`` command."""

    host = "pseudo-remote"

    def __init__(self, kill_binary: str = "kill") -> None:
        self._local = LocalTransport()
        self._kill = kill_binary

    def run(self, argv: list[str], *, timeout: float = 30.0, check: bool = False) -> Completed:
        if argv[0] == "kill":
            argv = [self._kill, *argv[1:]]
        return self._local.run(argv, timeout=timeout, check=check)

    def spawn(self, argv: list[str], **kwargs: object) -> subprocess.Popen[bytes]:
        raise TransportError("not needed by these tests")

    def put(self, data: bytes, path: str) -> None:
        self._local.put(data, path)

    def clock_offset(self) -> float:
        return 0.0


class _NoParams(BaseModel):
    pass


class RefusingInjector:
    """A ``kill`` fault family whose capability probe always refuses, as tc netem does on a kernel without
    sch_netem (patch it in as ``registry.injectors``): nothing may be prepared or applied after that."""

    name: ClassVar[str] = "kill"
    Params: ClassVar[type[BaseModel]] = _NoParams
    summary: ClassVar[str] = "refuses"

    def check(self, ctx: InjectionContext, params: BaseModel) -> None:
        raise Unsupported("this kernel lacks the feature")

    def prepare(self, ctx: InjectionContext, op: FaultOp) -> Applied:
        raise AssertionError("nothing may be prepared after check refused")

    def apply(self, ctx: InjectionContext, applied: Applied) -> None:
        raise AssertionError("nothing may be applied after check refused")

    def heal(self, ctx: InjectionContext, applied: Applied) -> None:
        pass

    def revert_command(self, applied: Applied) -> list[str] | None:
        return None


# -- building histories by hand (the check unit tests) ----------------------------------------------------------

SECOND = 1_000_000_000  # nanoseconds


def ns(t: float) -> int:
    """``t`` seconds as the nanoseconds an Event carries."""
    return round(t * SECOND)


def ev(t: float, kind: str, rank: int | None = None, source: str = "target", **data: Any) -> Event:
    """An Event at ``t`` seconds (from the target unless ``source`` says otherwise)."""
    return Event(ts_ns=ns(t), kind=kind, source=source, rank=rank, data=data)


_Run = TypeVar("_Run")


def runs_in_worlds(
    build: Callable[..., _Run], worlds: SearchStrategy[int], rank: str, **fields: SearchStrategy[Any]
) -> SearchStrategy[_Run]:
    """``build(world=W, RANK=R, **drawn fields)``, W drawn from ``worlds`` and R one of its ranks: a simulated run
    whose fault hits one rank of a world of any size."""
    from hypothesis import strategies as st

    def in_world(world: int) -> SearchStrategy[_Run]:
        return st.builds(build, world=st.just(world), **{rank: st.integers(0, world - 1)}, **fields)

    return worlds.flatmap(in_world)


# -- reading a written HTML report (these helpers assert: a page that does not parse is a failure) -------------

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class Page(HTMLParser):
    """Parses a page, checking every opened element is closed in order; keeps images and visible text."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.problems: list[str] = []
        self.images: list[dict[str, str | None]] = []
        self.text: list[str] = []
        self.tags: list[str] = []
        self.feed(text)
        self.close()
        self.problems += [f"<{tag}> never closed" for tag in self.stack]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        if tag == "img":
            self.images.append(dict(attrs))
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self.problems.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
            return
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    @property
    def all_text(self) -> str:
        return "".join(self.text)


def parsed(page: str) -> Page:
    result = Page(page)
    assert result.problems == [], result.problems[:5]
    assert page.startswith("<!DOCTYPE html>")
    return result


def timeline_png(page: Page) -> bytes:
    (src,) = [img["src"] for img in page.images if (img.get("src") or "").startswith("data:image/png;base64,")]
    assert src is not None
    png = base64.b64decode(src.removeprefix("data:image/png;base64,"), validate=True)
    assert png.startswith(PNG_SIGNATURE)
    return png


def png_size(png: bytes) -> tuple[int, int]:
    width, height = struct.unpack(">II", png[16:24])
    return width, height


# A preflight test's scenario: a 2-rank torchrun job (COMMAND: a plain command) whose FAULTS line a test replaces
# with its fault list; line 7 is the first fault's first line.
TORCHRUN = """\
name: t
target:
  type: torchrun
  module: chaos.reference.trainer
  nproc_per_node: 2
faults:
FAULTS
checks: [{type: completes}]
"""
COMMAND = TORCHRUN.replace(
    "  type: torchrun\n  module: chaos.reference.trainer\n  nproc_per_node: 2\n",
    "  type: command\n  command: [sleep, '30']\n  env: {}\n",
)
# TORCHRUN's fault list for the in-job one-shot faults: each fires on rank 1 at step 7.
CRASH_FAULT = (
    "  - {name: boom, type: crash, params: {rank: 1, kind: segfault, phase: allreduce}, trigger: {at_step: 7, rank: 1}}"
)
COLLECTIVE_FAULT = (
    "  - {name: cf, type: collective_fault, params: {rank: 1, kind: abort, index: 1}, trigger: {at_step: 7, rank: 1}}"
)


# A mark for the tests of a fleet behind Debian's HAProxy: skipped, with the reason, where haproxy is not installed.
NEEDS_HAPROXY = pytest.mark.skipif(
    shutil.which("haproxy") is None,
    reason="haproxy is not installed (apt-get install haproxy; scripts/setup.sh does as root)",
)


# A test module's runs of one scenario, by name (what its module-scoped ``runs`` fixture gives every test).
Runs: TypeAlias = "dict[str, RunResult]"


def balancer_runs(
    scenario_file: Path, configs: dict[str, str | None], tmp_path_factory: pytest.TempPathFactory
) -> Runs:
    """Run ``scenario_file`` once per entry of ``configs`` (name -> the ``lb`` role's HAProxy config file, None:
    as shipped), one after another, each with its own report folder: the results by name."""
    from chaos.run.orchestrator import RunOptions, execute
    from chaos.spec.scenario import load_scenario

    scenario = load_scenario(scenario_file)
    out = {}
    for name, config in configs.items():
        spec = scenario if config is None else with_balancer_config(scenario, config)
        out[name] = execute(spec, RunOptions(report_root=tmp_path_factory.mktemp(name), scenario_file=scenario_file))
    return out


def streamed_requests(result: RunResult) -> list[Event]:
    """A run's streamed requests (``load.request`` with ``stream: true``), in the order they were scheduled."""
    from chaos.load.summary import scheduled_ns

    found = [e for e in result.history.of("load.request") if e.data.get("stream") is True]
    return sorted(found, key=scheduled_ns)


def with_balancer_config(scenario: Scenario, config: str) -> Scenario:
    """The scenario with the ``lb`` role's HAProxy config file replaced."""
    target = scenario.target
    assert isinstance(target, RolesTarget)
    lb = target.roles["lb"]
    assert lb.command is not None and lb.command[-1].endswith(".cfg")
    roles = {**target.roles, "lb": lb.model_copy(update={"command": [*lb.command[:-1], config]})}
    return scenario.model_copy(update={"target": target.model_copy(update={"roles": roles})})


def leftovers_on_testbed(inventory: Inventory, run_dir: Path) -> list[str]:
    """What a run left on a namespace testbed: our iptables rules on any host, mounts and processes of its run dir."""
    found = []
    for host in inventory.hosts:
        rules = subprocess.run(
            ["ip", "netns", "exec", host.labels["netns"], "iptables-save"], capture_output=True, text=True
        ).stdout
        if "CHAOS" in rules or "mlchaos" in rules:
            found.append(f"iptables rules left on {host.name}")
    with open("/proc/self/mounts", encoding="utf-8") as mounts:
        found += [f"mount left: {line.strip()}" for line in mounts if str(run_dir) in line]
    ps = subprocess.run(["ps", "-eo", "pid=,stat=,args="], capture_output=True, text=True).stdout
    found += [f"process left: {line.strip()}" for line in ps.splitlines() if str(run_dir) in line]
    return found


class AgentRank:
    """One rank's agent-side view for the in-job fault families' tests: its step, the events it emitted, and
    fire-once markers that outlive a 'restart' (pass the same set to the next AgentRank)."""

    def __init__(self, rank: int = 1, markers: set[str] | None = None) -> None:
        self.rank = rank
        self.step = 0
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.markers = markers if markers is not None else set()

    def rules(self, *, has_ddp: bool) -> FiringRules:
        """The agent's FiringRules for this rank: its ops are those for its rank, events land in :attr:`events`."""
        return FiringRules(
            mine=lambda op: op.params.get("rank") == self.rank,
            rank=self.rank,
            step=lambda: self.step,
            emit=lambda kind, **data: self.events.append((kind, data)),
            already_fired=lambda op: op.op_id in self.markers,
            mark_fired=lambda op: self.markers.add(op.op_id),
            has_ddp=has_ddp,
        )
