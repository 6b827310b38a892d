"""Running scenarios from pytest: settings precedence, overrides, and the ``chaos_run`` callable.

Both ways in share :func:`run_scenario`: a YAML file collected as a test item, and ``chaos_run(...)`` inside a
Python test. The heavy engine (pydantic models, the runner, the injector registry) is imported on first use,
never when pytest loads the plugin.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chaos.pytest_plugin.support import Layer, Resolved, apply_overrides, failure_text, resolve

if TYPE_CHECKING:
    from chaos.cluster.inventory import Inventory
    from chaos.run.result import RunResult
    from chaos.spec.scenario import Scenario

PathArg = str | os.PathLike[str]
DEFAULT_REPORT_DIR = "reports"
MARKER_KEYS = frozenset({"scenario", "seed", "inventory", "report_dir", "overrides", "golden"})


@dataclass(frozen=True)
class SessionLayers:
    """The session-wide layers of each setting (command-line option, environment, ini), read once.

    Relative paths are already resolved: options and environment against the invocation directory, ini
    values against the ini file's directory, the default report dir against the project dir (the ini file's
    dir, else the invocation dir).
    """

    report_dir: Mapping[Layer, Path | None]
    inventory: Mapping[Layer, Path | None]
    seed: Mapping[Layer, int | None]


@dataclass(frozen=True)
class RunSettings:
    """Where one run's reports go, which inventory and seed it uses, and where each came from."""

    report_dir: Resolved[Path]
    inventory: Resolved[Path]
    seed: Resolved[int]


def run_settings(
    layers: SessionLayers,
    *,
    call: Mapping[str, Path | int | None] | None = None,
    marker: Mapping[str, Path | int | None] | None = None,
) -> RunSettings:
    """Apply the precedence call > marker > option > env > ini (> scenario, applied by the runner when the
    value stays None) to each setting. ``call``/``marker`` hold ``report_dir``, ``inventory``, ``seed``."""
    call, marker = call or {}, marker or {}

    def pick(name: str, session: Mapping[Layer, Any]) -> Resolved[Any]:
        return resolve({"call": call.get(name), "marker": marker.get(name), **session})

    return RunSettings(
        pick("report_dir", layers.report_dir), pick("inventory", layers.inventory), pick("seed", layers.seed)
    )


# -- loading ----------------------------------------------------------------------------------------------------


def load_for_run(source: Scenario | Path, overrides: Mapping[str, object] | None, scratch: Path) -> Scenario:
    """The scenario to run: ``source`` loaded (a file) or taken as is, with ``overrides`` merged in.

    The source file is validated first, so its own mistakes are reported at its own file:line. The merged
    result is written to ``scratch/<name>.overridden.yaml`` and loaded from there, so a mistake in an
    override is reported at a position in a file that exists. Raises ScenarioError or OverrideError.
    """
    import yaml

    from chaos.spec.scenario import load_scenario

    if isinstance(source, Path):
        scenario = load_scenario(source)
        if not overrides:
            return scenario
        raw = yaml.safe_load(source.read_text(encoding="utf-8"))
        origin = str(source)
    else:
        if not overrides:
            return source
        raw = source.model_dump(mode="json")
        origin = f"Scenario {source.name!r} built in Python"
    merged = apply_overrides(raw, overrides)
    scratch.mkdir(parents=True, exist_ok=True)
    name = str(merged.get("name") or "scenario")
    digest = hashlib.sha256(repr(sorted(merged.items(), key=str)).encode()).hexdigest()[:8]
    target = scratch / f"{Path(name).name}-{digest}.overridden.yaml"
    header = f"# {origin} with chaos_run overrides (written by the mlchaos pytest plugin)\n"
    target.write_text(header + yaml.safe_dump(merged, sort_keys=False), encoding="utf-8")
    return load_scenario(target)


def inventory_file(inventory: PathArg | Inventory | None, report_root: Path) -> Path | None:
    """A path for the runner: a path as given, or an :class:`Inventory` object written to a file first."""
    if inventory is None:
        return None
    if isinstance(inventory, str | os.PathLike):
        return Path(inventory)
    from chaos.cluster.inventory import dump_inventory

    text = inventory.model_dump_json()
    folder = report_root / ".inventories"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"inventory-{hashlib.sha256(text.encode()).hexdigest()[:12]}.yaml"
    dump_inventory(inventory, path)
    return path


def run_scenario(
    scenario: Scenario, file: Path | None, settings: RunSettings, *, golden: bool, log: Callable[[str], None]
) -> RunResult:
    """Run ``scenario`` for real with the runner; ``file`` (the scenario's source) anchors relative paths."""
    from chaos.run.orchestrator import RunOptions, execute

    report_root = settings.report_dir.value or Path(DEFAULT_REPORT_DIR)
    report_root.mkdir(parents=True, exist_ok=True)
    options = RunOptions(
        report_root=report_root,
        seed=settings.seed.value,
        golden=golden,
        scenario_file=file,
        inventory=settings.inventory.value,
    )
    result = execute(scenario, options, log=log)
    if result.ended_by == "interrupted":
        # SIGINT/SIGTERM/SIGHUP reached the run: execute() healed its faults and wrote the reports, and took the
        # signal. Pass it on: swallowed here, pytest would go on to the next test (and the next fault).
        raise KeyboardInterrupt(
            f"mlchaos: run {scenario.name!r} interrupted; {result.error}; reports: {result.run_dir}"
        )
    return result


# -- chaos_run ----------------------------------------------------------------------------------------------------


class ChaosRunFailed(AssertionError):
    """Raised by :meth:`ChaosRun.assert_passed`; the message lists the failing checks and the run dir."""


def _print_log(line: str) -> None:
    print(f"mlchaos: {line}", flush=True)  # captured by pytest; shown with the test's output on failure


@dataclass
class ChaosRun:
    """The ``chaos_run`` fixture's value: ``chaos_run(scenario_or_path, *, seed=None, overrides=None,
    inventory=None, golden=None, report_dir=None) -> RunResult``.

    Runs a scenario file or a :class:`~chaos.spec.scenario.Scenario` for real and returns the result; it does not
    fail the test by itself (use :meth:`assert_passed`, or assert on ``result.results``). Every argument
    left at None falls back to the test's ``@pytest.mark.chaos(...)`` marker, then ``--chaos-*`` options,
    then ``MLCHAOS_*`` variables, then ``chaos_*`` ini settings, then the scenario (``golden``: marker, then
    True). Marker ``overrides`` are merged first and the call's ``overrides`` on top of them. Relative scenario and inventory paths are
    looked up next to the test module first, then in the project dir (the ini file's dir, else the invocation
    dir); relative report dirs are under the project dir.
    Each run adds ``check:<name>`` JUnit properties to the test (``check:run2/<name>`` for a second run).
    """

    layers: SessionLayers
    marker: Mapping[str, Any]
    test_dir: Path
    project_dir: Path
    record: Callable[[RunResult], None]
    results: list[RunResult] = field(default_factory=list)

    def __call__(
        self,
        scenario: Scenario | PathArg | None = None,
        *,
        seed: int | None = None,
        overrides: Mapping[str, object] | None = None,
        inventory: PathArg | Inventory | None = None,
        golden: bool | None = None,
        report_dir: PathArg | None = None,
    ) -> RunResult:
        source = scenario if scenario is not None else self.marker.get("scenario")
        if source is None:
            raise TypeError("chaos_run needs a scenario (an argument, or @pytest.mark.chaos(scenario=...))")
        file: Path | None = None
        if isinstance(source, str | os.PathLike):
            file = self._input_path(source)
            loaded: Scenario | Path = file
        else:
            loaded = source
        merged_overrides = {**_dict(self.marker.get("overrides"))}
        merged_overrides = apply_overrides(merged_overrides, _dict(overrides)) if overrides else merged_overrides
        call_report = self._output_path(report_dir)
        marker_report = self._output_path(self.marker.get("report_dir"))
        # The report dir first: an Inventory object is written under it before the inventory is resolved.
        report_root = resolve({"call": call_report, "marker": marker_report, **self.layers.report_dir}).value
        report_root = report_root or self.project_dir / DEFAULT_REPORT_DIR
        settings = run_settings(
            self.layers,
            call={"report_dir": call_report, "inventory": self._inventory(inventory, report_root), "seed": seed},
            marker={
                "report_dir": marker_report,
                "inventory": self._inventory(self.marker.get("inventory"), report_root),
                "seed": _seed(self.marker.get("seed")),
            },
        )
        loaded_scenario = load_for_run(loaded, merged_overrides, report_root / ".overrides")
        use_golden = golden if golden is not None else bool(self.marker.get("golden", True))
        result = run_scenario(loaded_scenario, file, settings, golden=use_golden, log=_print_log)
        self.results.append(result)
        self.record(result)
        return result

    @staticmethod
    def assert_passed(result: RunResult) -> None:
        """Raise :class:`ChaosRunFailed` with every failing check's measured value, bound and evidence
        (and the run dir) unless the run's verdict is ``pass``."""
        if result.verdict != "pass":
            raise ChaosRunFailed(failure_text(result))

    def _input_path(self, value: PathArg) -> Path:
        path = Path(value)
        if path.is_absolute():
            return path
        for base in (self.test_dir, self.project_dir):
            if (base / path).exists():
                return base / path
        return self.test_dir / path  # absent everywhere: the loader names this path in its error

    def _output_path(self, value: object) -> Path | None:
        if value is None:
            return None
        if not isinstance(value, str | os.PathLike):
            raise TypeError(f"report_dir must be a path, not {type(value).__name__}")
        path = Path(value)
        return path if path.is_absolute() else self.project_dir / path

    def _inventory(self, value: object, report_root: Path) -> Path | None:
        if value is None:
            return None
        if isinstance(value, str | os.PathLike):
            return self._input_path(value)
        from chaos.cluster.inventory import Inventory

        if not isinstance(value, Inventory):
            raise TypeError(f"inventory must be a path or an Inventory, not {type(value).__name__}")
        return inventory_file(value, report_root)


def _seed(value: object) -> int | None:
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise TypeError(f"seed must be an int, not {type(value).__name__}")


def _dict(value: object) -> dict[str, object]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(f"overrides must be a mapping (like the scenario's YAML), not {type(value).__name__}")
    return {str(k): v for k, v in value.items()}
