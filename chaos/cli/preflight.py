"""What ``mlchaos validate`` and ``mlchaos run`` check before anything runs, file by file.

Both load every file and run the scenario's preflight (:func:`chaos.spec.preflight.preflight`, the function the
orchestrator runs too) on it as it will run (``--nodes`` applied). ``validate`` also checks what a run would
refuse at its start that needs more than the file: the inventory's host selections (when ``--inventory`` or
``cluster.inventory`` names one) and, for faults that land on this machine, this kernel's capabilities
(each injector's ``check``). Every problem names file:line:column and a fix.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from chaos.cluster.hosts import LOCAL, HostsError, HostSet, needs_inventory
from chaos.cluster.local import LocalTransport
from chaos.plugins import registry
from chaos.plugins.injector import InjectionContext, Unsupported, is_in_job
from chaos.run.triggers import STEP_SOURCES
from chaos.spec.matchers import reports_steps
from chaos.spec.preflight import capability_problems, fault_ranks, preflight, unsupported
from chaos.spec.problems import Problem
from chaos.spec.roles import RolesTarget
from chaos.spec.scenario import CommandTarget, HostSelector, Scenario, ScenarioError, TorchrunTarget, load_scenario
from chaos.targets.factory import TargetSpecError, on_nodes
from chaos.targets.interpreter import command_scripts, script_needs, torchrun_entry


@dataclass
class Checked:
    """The scenarios that passed (as loaded: ``--nodes`` is the run's to apply), every problem found (in file
    order per file), and notes (what was not checked)."""

    scenarios: list[tuple[Path, Scenario]] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def check_files(
    files: list[Path],
    *,
    nodes: HostSelector | None = None,
    inventory: Path | None = None,
    hosts: bool = False,
    probe: bool = False,
) -> Checked:
    """Load and preflight ``files``. ``validate`` adds ``hosts`` (resolve the host selections against the
    inventory) and ``probe`` (this machine's capabilities, for the faults that land on it)."""
    checked = Checked()
    for file in files:
        try:
            loaded = scenario = load_scenario(file)
        except ScenarioError as exc:
            checked.problems.extend(exc.problems)
            continue
        if nodes is not None:
            try:
                scenario = on_nodes(scenario, nodes)
            except TargetSpecError as exc:
                checked.problems.append(Problem(*scenario.located(("target", "type")), str(exc), "drop --nodes"))
                continue
        found = preflight(scenario) or entry_point_problems(scenario)
        if hosts and not found:
            found = _inventory_problems(file, scenario, inventory, checked.notes, probe=probe)
        if probe and not found:
            found = capability_problems(scenario, LocalTransport())
        if found:
            checked.problems.extend(found)
        else:
            checked.scenarios.append((file, loaded))
            checked.notes.extend(f"{file}: {note}" for note in step_source_notes(scenario))
    return checked


def entry_point_problems(scenario: Scenario) -> list[Problem]:
    """The job's entry points that do not exist on this machine, where the job runs here: a torchrun target's or
    a torchrun role's ``script`` (relative to the directory mlchaos runs in, as torchrun reads it), a module whose
    top-level package the job's interpreter (mlchaos's own) cannot find. A path with a placeholder, a job on other
    hosts, or a role with its own ``python`` is left to the run (the host may have it where this one does not)."""
    entries: list[tuple[tuple[str | int, ...], str | None, str | None]] = []
    target = scenario.target
    if isinstance(target, TorchrunTarget) and target.nodes is None:
        entries.append((("target",), target.script, target.module))
    if isinstance(target, RolesTarget):
        for name, role in target.roles.items():
            if role.torchrun is not None and role.host is None and role.python is None:
                entries.append((("target", "roles", name, "torchrun"), role.torchrun.script, role.torchrun.module))
    problems: list[Problem] = []
    for at, script, module in entries:
        if script is not None and "{" not in script and not os.path.isfile(script):
            where = "" if os.path.isabs(script) else f" (relative to {os.getcwd()}, where mlchaos runs)"
            problems.append(
                Problem(
                    *scenario.located((*at, "script")),
                    f"script {script!r} does not exist{where}: torchrun would start and every rank fail with code 1",
                    "give the script's path from the directory you run mlchaos in, or an absolute one",
                )
            )
        if module is not None and importlib.util.find_spec(module.split(".")[0]) is None:
            problems.append(
                Problem(
                    *scenario.located((*at, "module")),
                    f"module {module!r}: no package {module.split('.')[0]!r} for {sys.executable}, which runs the job",
                    "install it into that interpreter, or give the script's path instead",
                )
            )
    return problems


def step_source_notes(scenario: Scenario) -> list[str]:
    """A note when faults wait for a step (``at_step`` fired by the harness) and nothing this file shows reports
    the job's steps: no ``target.step`` matcher, no mlchaos import in the job's script(s), and no zero-line step
    reporter (``optimizer_steps`` on a torchrun or command target on this host). A note, not a refusal: a job
    may report steps in ways a reading of its files cannot see."""
    waiting = [
        f.name
        for f in scenario.faults
        if f.trigger.at_step is not None and f.trigger.phase is None and not is_in_job(registry.injectors()[f.type])
    ]  # (the job's agent fires in-job and phase faults itself: it is their step source)
    target = scenario.target
    if not waiting or not isinstance(target, TorchrunTarget | CommandTarget):
        return []
    if reports_steps(target.matchers):
        return []
    local = isinstance(target, CommandTarget) or target.nodes is None
    if target.optimizer_steps and local:
        return []
    scripts = command_scripts(target) if isinstance(target, CommandTarget) else [torchrun_entry(target)]
    if any(any(need.startswith("chaos") for need in script_needs(s)) for s in scripts):
        return []
    why = "optimizer_steps is off" if local else "the zero-line step reporter runs only on this host"
    return [
        f"fault(s) {', '.join(waiting)} fire at a step, but nothing here reports the job's steps ({why}, no "
        f"matcher reports target.step, the script imports nothing of mlchaos): {STEP_SOURCES}"
    ]


def _inventory_problems(
    file: Path, scenario: Scenario, inventory: Path | None, notes: list[str], *, probe: bool = False
) -> list[Problem]:
    """The host selections a run would refuse at its start, resolved against the inventory (none when the
    scenario names none and ``--inventory`` is not given: then a note says the hosts were not checked)."""
    if inventory is None and scenario.cluster.inventory is None:
        if needs_inventory(scenario):
            notes.append(
                f"{file}: uses inventory hosts; they were not checked (pass --inventory FILE, as to `mlchaos run`)"
            )
        return []
    at = ("cluster", "inventory") if inventory is None else ()
    try:
        hosts = HostSet.for_scenario(scenario, inventory, file.parent)
    except ScenarioError as exc:  # the inventory file's own problems, at their own file:line
        return list(exc.problems)
    except (HostsError, ValueError) as exc:  # ValueError: an inventory file that is not UTF-8 text
        return [Problem(*scenario.located(at), str(exc), "check the inventory")]
    problems: list[Problem] = []
    spec_nodes = getattr(scenario.target, "nodes", None)
    job_nodes: list[str] | None = None
    if isinstance(spec_nodes, HostSelector):
        try:
            job_nodes = [name for name, _ in hosts.job_nodes(spec_nodes, scenario.seed)]
        except HostsError as exc:
            problems.append(Problem(*scenario.located(("target", "nodes")), str(exc), "select inventory hosts"))
    if job_nodes is not None and isinstance(scenario.target, TorchrunTarget):
        size = len(job_nodes) * scenario.target.nproc_per_node  # the world the inventory gives the job
        for index, fault in enumerate(scenario.faults):
            for path, rank in fault_ranks(fault, ("faults", index)):
                if rank is not None and rank >= size:
                    problems.append(
                        Problem(
                            *scenario.located(path),
                            f"rank {rank} does not exist: the job runs "
                            f"{size} rank(s) ({len(job_nodes)} inventory node(s) x nproc_per_node "
                            f"{scenario.target.nproc_per_node}), 0..{size - 1}",
                            "aim at a rank below the world size, or select more nodes",
                        )
                    )
    reached: dict[tuple[str | int, ...], list[str]] = {("target", "nodes"): job_nodes or []}
    for index, fault in enumerate(scenario.faults):
        rank = fault.hosts.rank if fault.hosts is not None else getattr(fault.params, "rank", None)
        try:
            if job_nodes is not None and isinstance(rank, int):
                hosts.refuse_protected(fault, job_nodes)  # the rank may run on any job node, as the run checks
                reached[("faults", index, "hosts")] = job_nodes
            elif fault.hosts is not None and fault.hosts.rank is None:
                reached[("faults", index, "hosts")] = hosts.resolve(fault, f"{fault.name}#1", scenario.seed)
        except HostsError as exc:
            problems.append(Problem(*scenario.located(("faults", index, "hosts")), str(exc), "select inventory hosts"))
    try:
        if probe and not problems:
            problems = _host_problems(scenario, hosts, reached)
    finally:
        hosts.close()
    return problems


def _host_problems(
    scenario: Scenario, hosts: HostSet, reached: dict[tuple[str | int, ...], list[str]]
) -> list[Problem]:
    """What ``run`` checks on the inventory hosts before it starts, at validate: each host the job or a fault
    lands on answers (its address, its host key, the login), and each fault's injector is supported there."""
    problems: list[Problem] = []
    answered: dict[str, str | None] = {}  # host -> why it did not answer (None: it did)
    for at, names in reached.items():
        for name in names:
            if name == LOCAL or name in answered and answered[name] is None:
                continue
            if name not in answered:
                try:
                    hosts.transport(name).run(["true"], timeout=15, check=True)
                    answered[name] = None
                except Exception as exc:  # noqa: BLE001 - a wrong key, a refused login, no route: all a problem here
                    answered[name] = f"{type(exc).__name__}: {exc}"[:300]
            why = answered[name]
            if why is not None:
                problems.append(
                    Problem(
                        *scenario.located(at),
                        f"host {name} ({hosts.address(name)}) cannot be reached: {why}",
                        "check its address, user, key and known_hosts in the inventory (the run refuses it too)",
                    )
                )
    for at, names in reached.items():
        if at[0] != "faults" or any(answered.get(name) for name in names):
            continue
        fault = scenario.faults[int(at[1])]
        for name in names:
            ctx = InjectionContext(hosts.transport(name), extras={"host": name, "inventory": hosts.inventory})
            try:
                registry.injector(fault.type).check(ctx, fault.params)
            except Unsupported as exc:
                problems.append(
                    Problem(
                        *scenario.located(at),
                        unsupported(fault, exc) + f" (on {name})",
                        "aim it at hosts that have it, or drop the fault",
                    )
                )
    return problems
