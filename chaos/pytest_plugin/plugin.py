"""The mlchaos pytest plugin (entry point ``pytest11: mlchaos``): scenarios and chaos tests as pytest items.

- ``pytest scenarios/`` collects every mlchaos scenario file (a ``*.yaml``/``*.yml`` under a path given on the
  command line, or matching the ini ``chaos_scenario_glob``, whose top level has ``name`` and ``target``) as
  one test item that runs the scenario for real. Other YAML (CI configs …) is left alone.
- ``@pytest.mark.chaos(scenario=..., seed=..., inventory=..., report_dir=..., overrides=..., golden=...)``
  gives ``chaos_run`` its defaults in a Python test.
- Fixtures: ``chaos_run`` (run a scenario, :class:`chaos.pytest_plugin.run.ChaosRun`), ``chaos_inject`` (real faults
  as context managers, :class:`chaos.pytest_plugin.inject.ChaosInject`), ``chaos_testbed`` (a session-wide SSH
  testbed of network namespaces, yields its Inventory).
- Settings: ``--chaos-report-dir``/``MLCHAOS_REPORT_DIR``/ini ``chaos_report_dir`` (default ``reports``),
  ``--chaos-inventory``/``MLCHAOS_INVENTORY``/``chaos_inventory``, ``--chaos-seed``/``MLCHAOS_SEED``/
  ``chaos_seed``. Precedence: chaos_run argument > marker > option > environment > ini > scenario.

Every check of every run is printed in an "mlchaos checks" summary section and recorded as a JUnit property
``check:<name>`` = ``<status> measured=<m> bound=<b>``. This module loads in EVERY pytest run where mlchaos is
installed, so it imports nothing heavy at module level and does nothing unless a scenario file, a ``chaos``
marker or one of its fixtures is used.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import pytest

from chaos.pytest_plugin.inject import ChaosInject
from chaos.pytest_plugin.run import (
    DEFAULT_REPORT_DIR,
    MARKER_KEYS,
    ChaosRun,
    ChaosRunFailed,
    SessionLayers,
    run_scenario,
    run_settings,
)
from chaos.pytest_plugin.support import (
    failure_text,
    looks_like_scenario,
    parse_seed,
    run_properties,
    scenario_name,
    summary_lines,
    under_any,
)

if TYPE_CHECKING:
    from _pytest._code.code import TerminalRepr

    from chaos.cluster.inventory import Inventory
    from chaos.run.result import RunResult

ENV_REPORT_DIR, ENV_INVENTORY, ENV_SEED = "MLCHAOS_REPORT_DIR", "MLCHAOS_INVENTORY", "MLCHAOS_SEED"
_LAYERS = pytest.StashKey[SessionLayers]()
_SUMMARY = pytest.StashKey[list[tuple[str, list[str]]]]()
_RUN_COUNT = pytest.StashKey[int]()


# -- options and configuration ------------------------------------------------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("mlchaos", "mlchaos chaos testing")
    group.addoption(
        "--chaos-report-dir", default=None, help=f"where run reports go (env {ENV_REPORT_DIR}; default reports)"
    )
    group.addoption(
        "--chaos-inventory", default=None, help=f"SSH inventory for scenarios with hosts (env {ENV_INVENTORY})"
    )
    group.addoption("--chaos-seed", default=None, help=f"seed for every scenario run (env {ENV_SEED})")
    parser.addini("chaos_report_dir", "mlchaos report folder, relative to the ini file (default reports)", default="")
    parser.addini("chaos_inventory", "mlchaos SSH inventory file, relative to the ini file", default="")
    parser.addini("chaos_seed", "seed for every mlchaos scenario run", default="")
    parser.addini(
        "chaos_scenario_glob",
        "glob(s) over paths relative to the rootdir (or file names) of YAML scenarios to collect from any path",
        type="args",
        default=[],
    )
    parser.addini("chaos_testbed_hosts", "hosts in the chaos_testbed fixture's testbed (default 3)", default="3")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "chaos(scenario=None, seed=None, inventory=None, report_dir=None, overrides=None, golden=True): "
        "defaults for the chaos_run fixture (mlchaos)",
    )
    try:
        config.stash[_LAYERS] = _session_layers(config)
    except ValueError as exc:
        raise pytest.UsageError(f"mlchaos: {exc}") from None
    config.stash[_SUMMARY] = []


def project_dir(config: pytest.Config) -> Path:
    """Where default reports go and relative scenario names are looked up: the ini file's directory, else the
    invocation directory. Not pytest's rootdir: without an ini file that is the common ancestor of every
    argument that names a path, option values included, so ``--chaos-inventory /etc/x.yaml`` made it ``/``."""
    return config.inipath.parent if config.inipath is not None else config.invocation_params.dir


def _session_layers(config: pytest.Config) -> SessionLayers:
    """Read the option, environment and ini layers once; relative paths become absolute here (options and
    environment against the invocation dir, ini values against the ini file's dir)."""
    here = config.invocation_params.dir
    project = project_dir(config)  # ini values are relative to it, and the default report dir is in it

    def path(value: object, base: Path) -> Path | None:
        return base / str(value) if isinstance(value, str) and value.strip() else None

    def ini(name: str) -> str:
        value = config.getini(name)
        return value if isinstance(value, str) else ""

    option_seed = config.getoption("chaos_seed")
    return SessionLayers(
        report_dir={
            "option": path(config.getoption("chaos_report_dir"), here),
            "env": path(os.environ.get(ENV_REPORT_DIR), here),
            "ini": path(ini("chaos_report_dir"), project),
            "default": project / DEFAULT_REPORT_DIR,
        },
        inventory={
            "option": path(config.getoption("chaos_inventory"), here),
            "env": path(os.environ.get(ENV_INVENTORY), here),
            "ini": path(ini("chaos_inventory"), project),
        },
        seed={
            "option": parse_seed(option_seed if isinstance(option_seed, str) else None, "--chaos-seed"),
            "env": parse_seed(os.environ.get(ENV_SEED), ENV_SEED),
            "ini": parse_seed(ini("chaos_seed"), "chaos_seed"),
        },
    )


# -- scenario files as test items ---------------------------------------------------------------------------------


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> ScenarioFile | None:
    if file_path.suffix not in (".yaml", ".yml") or not _wanted(parent.config, file_path):
        return None
    if not looks_like_scenario(file_path):
        return None
    return ScenarioFile.from_parent(parent, path=file_path)


def _wanted(config: pytest.Config, path: Path) -> bool:
    """A YAML file is a candidate when it lies under a path typed on the command line (not testpaths, not
    the bare invocation dir: an unrelated ``pytest`` run never starts running YAML files) or matches a glob."""
    if config.args_source == pytest.Config.ArgsSource.ARGS:
        here = config.invocation_params.dir
        roots = [(here / arg.split("::", 1)[0]).resolve() for arg in config.args]
        if under_any(path.resolve(), roots):
            return True
    patterns = config.getini("chaos_scenario_glob")
    if not isinstance(patterns, list) or not patterns:
        return False
    try:
        relative = path.resolve().relative_to(config.rootpath.resolve()).as_posix()
    except ValueError:
        relative = path.as_posix()
    return any(fnmatch.fnmatch(relative, str(p)) or fnmatch.fnmatch(path.name, str(p)) for p in patterns)


class ScenarioFile(pytest.File):
    """A YAML scenario file: one item, named after the scenario."""

    def collect(self) -> Iterator[ScenarioItem]:
        yield ScenarioItem.from_parent(self, name=scenario_name(self.path))


class ScenarioItem(pytest.Item):
    """Runs one scenario file for real. Passes on verdict ``pass``; a load error fails it with file:line, a
    failing check with its measured value and bound (and the run directory)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_marker("chaos")  # so `-m chaos` / `-m "not chaos"` select scenario items too

    def runtest(self) -> None:
        from chaos.cluster.hosts import needs_inventory
        from chaos.spec.scenario import load_scenario

        scenario = load_scenario(self.path)  # ScenarioError: reported by repr_failure with file:line
        settings = run_settings(self.config.stash[_LAYERS])
        if settings.inventory.value is None and scenario.cluster.inventory is None and needs_inventory(scenario):
            # Not a failure of the scenario: this session has no hosts for it. Say how to give it some.
            pytest.skip(
                f"mlchaos: {scenario.name} runs on inventory hosts and no inventory was given: pass "
                "--chaos-inventory=FILE (`mlchaos testbed up --hosts 3` writes one on this machine), set "
                f"{ENV_INVENTORY}, or the chaos_inventory ini setting"
            )
        result = run_scenario(scenario, self.path, settings, golden=True, log=_log)
        _record(self, result)
        if result.verdict != "pass":
            raise ChaosRunFailed(failure_text(result))

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str | TerminalRepr:
        from chaos.spec.scenario import ScenarioError

        if isinstance(excinfo.value, ScenarioError | ChaosRunFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, 0, f"mlchaos scenario {self.name}"


def _log(line: str) -> None:
    print(f"mlchaos: {line}", flush=True)


def _record(node: pytest.Item, result: RunResult) -> None:
    """Make one run visible: JUnit properties, a report section, and lines in the terminal summary."""
    count = node.stash.get(_RUN_COUNT, 0) + 1
    node.stash[_RUN_COUNT] = count
    node.user_properties.extend(run_properties(result, "" if count == 1 else f"run{count}/"))
    lines = [*summary_lines(result), f"  run dir: {result.run_dir}"]
    node.add_report_section("call", "mlchaos" if count == 1 else f"mlchaos run {count}", "\n".join(lines))
    node.config.stash[_SUMMARY].append((node.nodeid, lines))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    runs = config.stash.get(_SUMMARY, [])
    if not runs:
        return
    terminalreporter.write_sep("-", "mlchaos checks")
    for nodeid, lines in runs:
        head = lines[0]
        name = head.partition(":")[0]
        if nodeid.endswith(f"::{name}"):  # a scenario item is already named after its scenario
            head = head.partition(": ")[2]
        terminalreporter.write_line(f"{nodeid}: {head}")
        for line in lines[1:]:
            terminalreporter.write_line(line)


# -- fixtures -----------------------------------------------------------------------------------------------------


@pytest.fixture
def chaos_run(request: pytest.FixtureRequest) -> ChaosRun:
    """Run a scenario for real: ``chaos_run(path_or_scenario, *, seed=None, overrides=None, inventory=None,
    golden=None, report_dir=None) -> RunResult``; ``chaos_run.assert_passed(result)`` fails the test with the
    failing checks. Defaults come from ``@pytest.mark.chaos(...)``; see :class:`chaos.pytest_plugin.run.ChaosRun`."""
    marker = request.node.get_closest_marker("chaos")
    kwargs: dict[str, Any] = {}
    if marker is not None:
        kwargs = dict(marker.kwargs)
        if marker.args:
            kwargs.setdefault("scenario", marker.args[0])
        unknown = sorted(set(kwargs) - MARKER_KEYS)
        if unknown:
            raise TypeError(
                f"@pytest.mark.chaos got unknown argument(s) {', '.join(unknown)}; use {sorted(MARKER_KEYS)}"
            )
    node = request.node
    if not isinstance(node, pytest.Item):
        raise TypeError("chaos_run is a function-scoped fixture for test items")
    return ChaosRun(
        layers=request.config.stash[_LAYERS],
        marker=kwargs,
        test_dir=request.path.parent,
        project_dir=project_dir(request.config),
        record=lambda result: _record(node, result),
    )


@pytest.fixture
def chaos_inject(request: pytest.FixtureRequest) -> Iterator[ChaosInject]:
    """Real faults as context managers (``kill``, ``freeze``, ``slow``, ``partition``, ``fault``, ``bitflip``,
    ``grad_corrupt``), each undone on exit; a fault this machine cannot apply skips the test with the reason."""
    inject = ChaosInject(request.node.name, unsupported=_skip)
    try:
        yield inject
    finally:
        inject.close()


def _skip(reason: str) -> NoReturn:
    pytest.skip(f"mlchaos: {reason}")


@pytest.fixture(scope="session")
def chaos_testbed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Inventory]:
    """A session-wide SSH testbed on this machine (network namespaces on a bridge, one real sshd each; as
    ``mlchaos testbed up``), ``chaos_testbed_hosts`` hosts (ini, default 3). Yields its Inventory, also
    written to ``<basetemp>/chaos-testbed*/inventory.yaml``; pass it to ``chaos_run(..., inventory=...)``.
    Skips with the reason where it cannot be built (not root, no ``ip netns``, no sshd); torn down in
    ``finally``, also when building failed half way."""
    from chaos.testbed import namespaces as testbed

    reason = testbed.unsupported_reason()
    if reason is not None:
        pytest.skip(f"chaos_testbed: {reason}")
    raw = request.config.getini("chaos_testbed_hosts")
    try:
        hosts = int(str(raw))
    except ValueError:
        raise pytest.UsageError(f"chaos_testbed_hosts = {raw!r} is not an integer") from None
    state = tmp_path_factory.mktemp("chaos-testbed")
    try:
        yield testbed.up(hosts, state)
    finally:
        testbed.down(state)
