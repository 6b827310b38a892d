"""A scenario that names a job module by an old path (0.1's, or the reference jobs' ``chaos.targets.reference``
paths) loads with the new path and warns at the file:line that names it; the old Python import paths are gone."""

from __future__ import annotations

import importlib.util
import subprocess
import warnings
from pathlib import Path

import pytest
from support import CLI

from chaos.spec.renamed import RENAMED_MODULES, RenamedModuleWarning
from chaos.spec.roles import RolesTarget
from chaos.spec.scenario import CommandTarget, Scenario, TorchrunTarget, load_scenario, parse_scenario

OLD_TRAINER = """\
name: old-trainer
target:
  type: torchrun
  module: chaos.targets.ddp_trainer
  args: [--steps, 5]
checks:
  - type: completes
"""

OLD_ROLES = """\
name: old-serving
target:
  type: roles
  roles:
    gateway:
      command: ["{python}", -m, chaos.targets.serving.gateway, --config-file, gw.json]
    trainer:
      torchrun:
        module: chaos.targets.ddp_trainer
checks:
  - type: completes
"""

MOVED_ROLES = """\
name: moved-serving
target:
  type: roles
  roles:
    gateway:
      command: [python, -m, chaos.targets.reference.serving.gateway]
    primary:
      command: [python, -m, chaos.targets.reference.serving.model_server, --replica, primary]
    trainer:
      torchrun:
        module: chaos.targets.reference.trainer
checks:
  - type: completes
"""


def _load(text: str, file: str) -> tuple[Scenario, list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scenario = parse_scenario(text, file)
    return scenario, [w for w in caught if issubclass(w.category, RenamedModuleWarning)]


def test_the_old_trainer_path_loads_as_the_new_one_with_a_warning_at_its_line(tmp_path: Path) -> None:
    path = tmp_path / "old.yaml"
    path.write_text(OLD_TRAINER)
    with pytest.warns(RenamedModuleWarning) as caught:
        scenario = load_scenario(path)
    assert isinstance(scenario.target, TorchrunTarget)
    assert scenario.target.module == "chaos.reference.trainer"
    [warning] = caught.list
    assert (warning.filename, warning.lineno) == (str(path), 4)
    assert str(warning.message).startswith(
        "`chaos.targets.ddp_trainer` moved to `chaos.reference.trainer`; write the new path"
    )


def test_roles_torchrun_modules_and_dash_m_in_commands_are_renamed_too() -> None:
    scenario, caught = _load(OLD_ROLES, "roles.yaml")
    target = scenario.target
    assert isinstance(target, RolesTarget)
    assert target.roles["gateway"].command[2] == "chaos.reference.serving.gateway"
    assert target.roles["trainer"].torchrun is not None
    assert target.roles["trainer"].torchrun.module == "chaos.reference.trainer"
    assert [(w.filename, w.lineno) for w in caught] == [("roles.yaml", 6), ("roles.yaml", 9)]


def test_the_reference_jobs_old_package_paths_load_as_chaos_reference_with_a_warning_each() -> None:
    scenario, caught = _load(MOVED_ROLES, "moved.yaml")
    target = scenario.target
    assert isinstance(target, RolesTarget)
    assert target.roles["gateway"].command[2] == "chaos.reference.serving.gateway"
    assert target.roles["primary"].command[2] == "chaos.reference.serving.model_server"
    assert target.roles["trainer"].torchrun is not None
    assert target.roles["trainer"].torchrun.module == "chaos.reference.trainer"
    assert [(w.filename, w.lineno) for w in caught] == [("moved.yaml", 6), ("moved.yaml", 8), ("moved.yaml", 11)]
    assert str(caught[2].message).startswith("`chaos.targets.reference.trainer` moved to `chaos.reference.trainer`")


def test_every_runnable_reference_module_has_its_old_path_in_the_table_and_no_rename_chains() -> None:
    root = Path(__file__).resolve().parents[2]
    runnable = sorted(
        ".".join(path.relative_to(root).with_suffix("").parts)
        for path in (root / "chaos" / "reference").rglob("*.py")
        if 'if __name__ == "__main__":' in path.read_text()
    )
    assert {
        "chaos.reference.serving.gateway",
        "chaos.reference.serving.model_server",
        "chaos.reference.trainer",
    } <= set(runnable)
    for module in runnable:
        assert RENAMED_MODULES[module.replace("chaos.reference.", "chaos.targets.reference.", 1)] == module
    assert not set(RENAMED_MODULES.values()) & set(RENAMED_MODULES), "every old path maps straight to the new one"


def test_new_paths_and_other_modules_load_without_a_warning() -> None:
    _, caught = _load(OLD_TRAINER.replace("chaos.targets.ddp_trainer", "chaos.reference.trainer"), "new.yaml")
    assert caught == []
    command = "name: c\ntarget: {type: command, command: [python, -m, chaos.targets.ddp_trainerx, -m]}\n"
    scenario, caught = _load(command + "checks: [{type: completes}]\n", "cmd.yaml")
    assert caught == []
    assert isinstance(scenario.target, CommandTarget)


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its package is gone too
        return False


def test_every_new_path_is_a_module_and_no_old_path_imports() -> None:
    for old, new in RENAMED_MODULES.items():
        assert _importable(new), new
        assert not _importable(old), old


def test_mlchaos_validate_prints_the_warning_with_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "old.yaml"
    path.write_text(OLD_TRAINER)
    done = subprocess.run([*CLI, "validate", "--no-probe", str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{path}:4: RenamedModuleWarning: `chaos.targets.ddp_trainer` moved to" in done.stderr, done.stderr
