"""The floor plan as an executable contract: every import in ``chaos/`` and ``injectors/`` points down the layers
below, and no module imports itself back through others (no circles).

Imports are read from the source (every ``import``/``from ... import``, in functions and ``TYPE_CHECKING``
blocks too), so a lazy import cannot hide an upward edge. ``docs/architecture.md`` draws the same layers.
"""

from __future__ import annotations

import ast
import warnings
from collections.abc import Iterable
from pathlib import Path

from support import IN_JOB_SURFACE

ROOT = Path(__file__).resolve().parents[2]

# Lowest first. A module belongs to the most specific prefix listed; a module may import modules of its own
# package, and of any package in a LOWER layer, nothing else. Two packages in one layer never import each other.
LAYERS: list[tuple[str, ...]] = [
    # foundation: leaves that import nothing of mlchaos (chaos.event_kinds: every event kind, declared once)
    (
        "chaos",
        "chaos.events",
        "chaos.event_kinds",
        "chaos.kernel",
        "chaos.safety.state",
        "chaos.spec.units",
        "chaos.injob.bitflip",
        "chaos.plan.seeds",
    ),
    ("chaos.history", "chaos.cluster.base", "chaos.injob.fault_specs"),  # fault_specs: the in-job faults' params
    ("chaos.plugins",),  # the Injector and Check contracts, the entry-point registry
    ("chaos.spec",),  # the typed scenario
    ("chaos.plan",),  # triggers -> ops, seeds, the in-job plan file
    ("chaos.cluster", "chaos.safety", "chaos.load"),  # transports; journal, dead-man; load generator
    ("chaos.slurm",),  # the Slurm client, accounting, the node health check
    ("chaos.testbed",),  # testbeds on this machine (namespaces, containers, a Slurm cluster) over transports
    ("chaos.slurm.locate",),  # which cluster a scenario talks to: an existing one or the testbed's
    ("injectors",),  # fault families
    ("chaos.injob", "chaos.guards"),  # what runs inside the user's job: fault engine, detectors
    ("chaos.agent", "chaos.strategies"),  # the public in-job API over them
    ("chaos.integrations",),  # the agent as frameworks take it (a Lightning callback)
    # job adapters; reference jobs (started by module path, never imported by an adapter); assertion modules;
    # detectors beside the job (hang watch, link probe)
    ("chaos.targets", "chaos.reference", "chaos.checks", "chaos.detect"),
    ("chaos.run.result", "chaos.analysis"),  # a run's outcome as data; ETTR and SDC coverage
    ("chaos.report",),
    ("chaos.run",),  # the orchestrator
    ("chaos.suite", "chaos.gameday", "chaos.pytest_plugin"),  # ways in
    ("chaos.cli",),
]

# What runs inside the user's process may import only these (it must stay importable with torch alone).
IN_JOB = ("chaos.injob", "chaos.guards", "chaos.agent", "chaos.integrations")
IN_JOB_MAY_IMPORT = ("chaos", *IN_JOB_SURFACE)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for top in ("chaos", "injectors") for p in sorted((ROOT / top).rglob("*.py"))}


def imports_of(path: Path, known: Iterable[str]) -> set[str]:
    """The project modules ``path`` imports (``from a import b`` counts as ``a.b`` when that is a module)."""
    known = set(known)
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                found.add(full if full in known else node.module)
    return {name for name in found if name in known}


def owner(module: str) -> tuple[int, str]:
    """(layer index, the prefix that places it): the most specific prefix of any layer."""
    best: tuple[int, str] | None = None
    for index, layer in enumerate(LAYERS):
        for prefix in layer:
            if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > len(best[1])):
                best = (index, prefix)
    if best is None:
        raise AssertionError(f"{module} is in no layer of tests/unit/test_layering.py: add its package to LAYERS")
    return best


def layering_violations(graph: dict[str, set[str]]) -> list[str]:
    problems = []
    for module, targets in sorted(graph.items()):
        layer, prefix = owner(module)
        for target in sorted(targets):
            target_layer, target_prefix = owner(target)
            if target_prefix == prefix or target_layer < layer:
                continue
            if prefix == "chaos" and target_layer == 0:
                continue
            problems.append(
                f"{module} (layer {layer}, {prefix}) imports {target} (layer {target_layer}, {target_prefix})"
            )
        if prefix in IN_JOB or module.startswith(IN_JOB):
            for target in sorted(targets):
                if (
                    not any(target == ok or target.startswith(ok + ".") for ok in IN_JOB_MAY_IMPORT if ok != "chaos")
                    and target != "chaos"
                ):
                    problems.append(f"{module} runs in the user's job but imports {target}")
    return problems


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imports_of(path, modules) - {name} for name, path in modules.items()}


def test_every_import_points_down_the_layers() -> None:
    problems = layering_violations(import_graph())
    assert not problems, "upward or sideways imports:\n" + "\n".join(problems)


def test_no_import_circles() -> None:
    found = circles(import_graph())
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_top_level_chaos_holds_only_the_public_modules() -> None:
    public = {"__init__.py", "agent.py", "event_kinds.py", "events.py", "strategies.py"}
    loose = sorted(p.name for p in (ROOT / "chaos").glob("*.py") if p.name not in public)
    assert not loose, f"chaos/ top level holds only the public modules; move {loose} into a package"


# A module past REVIEW_LINES is named for a look at its cohesion; MAX_LINES is a hard stop.
REVIEW_LINES, MAX_LINES = 600, 800
# Where the formatter's word is final (``make test`` runs ``ruff format --check`` on the same folders).
FORMATTED = ("chaos", "injectors", "tests", "benchmarks", "scripts")
SKIP_MARKERS = ("fmt: " + "skip", "fmt: " + "off")  # spelled apart, so this file does not hold them


def packed_files(root: Path) -> list[str]:
    """The Python files under ``root``'s formatted folders that carry a formatter-skip marker."""
    files = (path for top in FORMATTED for path in sorted((root / top).rglob("*.py")))
    return [str(path.relative_to(root)) for path in files if any(m in path.read_text() for m in SKIP_MARKERS)]


def test_modules_stay_cohesive_in_size_and_are_not_packed() -> None:
    """A module over MAX_LINES fails (split it by what it does, not to fit); one over REVIEW_LINES is named in a
    warning for review. Code is never packed to fit: no formatter-skip markers anywhere the formatter runs."""
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in project_modules().values()}
    too_long = {path: n for path, n in sizes.items() if n > MAX_LINES}
    assert not too_long, f"modules over {MAX_LINES} lines (split them by what they do): {too_long}"
    packed = packed_files(ROOT)
    assert not packed, f"formatter markers that pack code: {packed}"
    review = {path: n for path, n in sorted(sizes.items()) if n > REVIEW_LINES}
    if review:
        warnings.warn(f"modules over {REVIEW_LINES} lines, worth a look at their cohesion: {review}", stacklevel=1)


def test_a_planted_marker_is_found(tmp_path: Path) -> None:
    """The packing check can fail: a test file holding a skip marker is named."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "packed.py").write_text("x = [1,\n     2]  # " + SKIP_MARKERS[0] + "\n")
    (tmp_path / "tests" / "clean.py").write_text("x = [1, 2]\n")
    assert packed_files(tmp_path) == ["tests/packed.py"]


def test_the_contract_catches_an_upward_import_and_a_circle() -> None:
    """The checks above must be able to fail: a spec module importing the orchestrator, and a two-module circle."""
    graph = import_graph()
    graph["chaos.spec.scenario"] = graph["chaos.spec.scenario"] | {"chaos.run.orchestrator"}
    assert any("chaos.spec.scenario" in p and "chaos.run.orchestrator" in p for p in layering_violations(graph))
    graph["chaos.history.timeline"] = graph["chaos.history.timeline"] | {"chaos.spec.scenario"}
    graph["chaos.spec.scenario"] = graph["chaos.spec.scenario"] | {"chaos.history.timeline"}
    assert any({"chaos.spec.scenario", "chaos.history.timeline"} <= set(c) for c in circles(graph))


def render_layers() -> str:
    """The layer table as ``docs/architecture.md`` draws it: highest first, one line per layer."""
    return "\n".join(f"{index:>2}  {'  '.join(layer)}" for index, layer in reversed(list(enumerate(LAYERS))))


def test_docs_architecture_draws_the_same_layers() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    start = doc.index("<!-- layers:")
    block = doc[start : doc.index("<!-- /layers -->")].split("```")[1].strip("\n")
    assert block == render_layers(), "docs/architecture.md's layer block is stale; paste:\n" + render_layers()
