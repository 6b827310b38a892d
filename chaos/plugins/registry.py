"""Where injectors and checks are found: the built-ins plus third-party entry points.

One way in, for built-ins and plugins alike: an injector module lists its classes in an ``INJECTORS`` tuple,
a check module registers its checks with :func:`chaos.plugins.check.register_check` when imported. The
built-in modules are named here (:data:`BUILTIN_INJECTOR_MODULES`, :data:`BUILTIN_CHECK_MODULES`, the one list:
``tests/unit/test_registry.py`` fails when a module defines an injector or check that is not registered);
third parties name theirs under the ``mlchaos.injectors`` entry-point group (a module with ``INJECTORS``, or
one Injector class) and ``mlchaos.checks`` (a module). A name registered twice is an error at build time,
never a silent override.
"""

from __future__ import annotations

import importlib
from functools import cache
from importlib.metadata import entry_points

from chaos.plugins.check import CHECKS, CheckSpec
from chaos.plugins.injector import Injector

BUILTIN_INJECTOR_MODULES = (
    "injectors.process.faults",
    "injectors.gradient",
    "injectors.hang",
    "injectors.crash",
    "injectors.collective",
    "injectors.tensor",
    "injectors.network.faults",
    "injectors.storage.injector",
    "injectors.checkpoint.injector",
    "injectors.node",
    "injectors.container",
    "injectors.gpu_xid",
    "injectors.slurm.faults",
    "injectors.clock.injector",
)
BUILTIN_CHECK_MODULES = (
    "chaos.checks.detection",
    "chaos.checks.recovery",
    "chaos.checks.progress",
    "chaos.checks.lineage",
    "chaos.checks.sdc",
    "chaos.checks.consistency",
    "chaos.checks.restarts",
    "chaos.checks.replicas",
    "chaos.checks.serving.verdicts",
    "chaos.checks.serving.stream_verdicts",
    "chaos.checks.serving.ladder_verdicts",
    "chaos.checks.slurm",
    "chaos.checks.checkpoint",
    "chaos.checks.hang",
    "chaos.checks.storage_recovery",
    "chaos.checks.link",
    "chaos.checks.rollback",
    "chaos.checks.rendezvous",
)
INJECTOR_GROUP = "mlchaos.injectors"
CHECK_GROUP = "mlchaos.checks"


class RegistryError(RuntimeError):
    """Two plugins claim one name, or a plugin does not load."""


@cache
def injectors() -> dict[str, type[Injector]]:
    """Every known injector class by its YAML ``type`` name."""
    found: dict[str, type[Injector]] = {}

    def add(cls: type[Injector], origin: str) -> None:
        name = cls.name
        if name in found and found[name] is not cls:
            raise RegistryError(f"injector name {name!r} is claimed twice ({found[name].__module__}, {origin})")
        found[name] = cls

    for module_name in BUILTIN_INJECTOR_MODULES:
        module = importlib.import_module(module_name)
        for cls in getattr(module, "INJECTORS", ()):
            add(cls, module_name)
    for ep in entry_points(group=INJECTOR_GROUP):
        try:
            loaded = ep.load()
        except Exception as exc:  # a broken plugin must be named, not crash with a bare traceback
            raise RegistryError(f"injector plugin {ep.name} ({ep.value}) failed to load: {exc}") from exc
        for cls in getattr(loaded, "INJECTORS", (loaded,)):  # a module with INJECTORS, or one class
            add(cls, ep.value)
    return dict(sorted(found.items()))


@cache
def checks() -> dict[str, CheckSpec]:
    """Every known check by its YAML ``type`` name."""
    for module_name in BUILTIN_CHECK_MODULES:
        importlib.import_module(module_name)
    for ep in entry_points(group=CHECK_GROUP):
        if ep.value.split(":")[0] in BUILTIN_CHECK_MODULES:
            continue
        try:
            ep.load()
        except ValueError as exc:
            raise RegistryError(str(exc)) from exc
        except Exception as exc:
            raise RegistryError(f"check plugin {ep.name} ({ep.value}) failed to load: {exc}") from exc
    return dict(sorted(CHECKS.items()))


def injector(name: str) -> Injector:
    """A fresh instance of the injector registered as ``name``."""
    return injectors()[name]()
