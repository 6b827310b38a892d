"""Job module paths that older scenarios name, and where those modules are now.

A scenario names a module that a job runs with ``python -m``: a torchrun target's or a torchrun role's
``module:``, or the item after ``-m`` in a command (a command target's or a role's). Where it names an old path
of :data:`RENAMED_MODULES`, :func:`rename_modules` loads the scenario with the new path and warns with a
:class:`RenamedModuleWarning` at the file and line to change. No other old path is known any more.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

from chaos.spec.problems import Path_, position

# Old path -> new path, for the modules that run as a job (``python -m``): those of 0.1, and the reference jobs'
# paths from when they lived under ``chaos.targets.reference``.
RENAMED_MODULES: dict[str, str] = {
    "chaos.targets.ddp_trainer": "chaos.reference.trainer",
    "chaos.targets.serving.gateway": "chaos.reference.serving.gateway",
    "chaos.targets.serving.model_server": "chaos.reference.serving.model_server",
    "chaos.targets.reference.trainer": "chaos.reference.trainer",
    "chaos.targets.reference.serving.gateway": "chaos.reference.serving.gateway",
    "chaos.targets.reference.serving.model_server": "chaos.reference.serving.model_server",
}


class RenamedModuleWarning(FutureWarning):
    """A scenario names a job module by an old path (a FutureWarning: shown by default, to the user)."""


def _places(data: dict[str, Any]) -> Iterator[tuple[dict[str, Any] | list[Any], Any, Path_]]:
    """(container, key, YAML path) of every place in raw scenario ``data`` that holds a job's module name."""

    def in_command(command: object, at: Path_) -> Iterator[tuple[list[Any], int, Path_]]:
        if isinstance(command, list):
            for index in range(1, len(command)):
                if command[index - 1] == "-m":
                    yield command, index, (*at, index)

    target = data.get("target")
    if not isinstance(target, dict):
        return
    if "module" in target:
        yield target, "module", ("target", "module")
    yield from in_command(target.get("command"), ("target", "command"))
    roles = target.get("roles")
    for name, role in roles.items() if isinstance(roles, dict) else ():
        if not isinstance(role, dict):
            continue
        torchrun = role.get("torchrun")
        if isinstance(torchrun, dict) and "module" in torchrun:
            yield torchrun, "module", ("target", "roles", str(name), "torchrun", "module")
        yield from in_command(role.get("command"), ("target", "roles", str(name), "command"))


def rename_modules(data: dict[str, Any], marks: dict[Path_, tuple[int, int]], file: str) -> None:
    """Replace, in raw scenario ``data``, every job module named by an old path with its new path; each one
    warns (:class:`RenamedModuleWarning`) at ``file`` and the line that names it."""
    for container, key, at in list(_places(data)):
        old = container[key]
        new = RENAMED_MODULES.get(old) if isinstance(old, str) else None
        if new is None:
            continue
        container[key] = new
        line, _ = position(marks, at)
        message = f"`{old}` moved to `{new}`; write the new path (mlchaos runs the new one)"
        warnings.warn_explicit(message, RenamedModuleWarning, file, line)
