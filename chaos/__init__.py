"""mlchaos: fault injection and chaos testing for distributed ML training and serving.

The engine lives in this package; fault families live in the sibling ``injectors`` package. Data flows one way:
``spec`` -> ``plan`` -> ``run`` -> ``history`` -> ``checks`` -> ``report`` (see ``docs/architecture.md``).
At top level live only the modules users import in their own code: :mod:`chaos.agent`, :mod:`chaos.events`
and :mod:`chaos.strategies`.

Module paths of releases before 0.2 (``chaos.runner``, ``chaos.scenario``, ``injectors.netfilter``, ...) still
import, through :data:`MOVED_MODULES`, with a :class:`DeprecationWarning` naming the new path; they go in 0.3.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings
from collections.abc import Sequence

__version__ = "0.2.0"

# Old module path -> new module path (the layout redesign of 0.2). A key that names a package also maps its
# submodules (``chaos.targets.serving.gateway`` -> ``chaos.targets.reference.serving.gateway``).
MOVED_MODULES: dict[str, str] = {
    "chaos.agent_plan": "chaos.plan.agent_plan",
    "chaos.bitflip": "chaos.injob.bitflip",
    "chaos.checks.serving_windows": "chaos.checks.serving.windows",  # + SPLIT_MODULES
    "chaos.cli_console": "chaos.cli.console",
    "chaos.cli_ettr": "chaos.cli.ettr",
    "chaos.cli_gameday": "chaos.cli.gameday",
    "chaos.cli_sdc": "chaos.cli.sdc",
    "chaos.cli_suite": "chaos.cli.suite",
    "chaos.cli_testbed": "chaos.cli.testbed",
    "chaos.cluster.docker_image": "chaos.cluster.testbed.image",
    "chaos.cluster.docker_testbed": "chaos.cluster.testbed.containers",
    "chaos.cluster.shared_mounts": "chaos.cluster.testbed.shared_mounts",
    "chaos.cluster.testbed_sys": "chaos.cluster.testbed.system",
    "chaos.control": "chaos.run.control",
    "chaos.deadman": "chaos.safety.deadman",
    "chaos.ettr": "chaos.analysis.ettr",
    "chaos.golden": "chaos.run.golden",
    "chaos.hosts": "chaos.cluster.hosts",
    "chaos.injector": "chaos.plugins.injector",
    "chaos.journal": "chaos.safety.journal",
    "chaos.load.spec": "chaos.spec.load",
    "chaos.metrics": "chaos.suite.metrics",
    "chaos.pfi": "chaos.injob.pfi",
    "chaos.pytest_inject": "chaos.pytest_plugin.inject",
    "chaos.pytest_run": "chaos.pytest_plugin.run",
    "chaos.pytest_support": "chaos.pytest_plugin.support",
    "chaos.registry": "chaos.plugins.registry",
    "chaos.remote_deadman": "chaos.safety.remote_deadman",
    "chaos.run_store": "chaos.suite.store",
    "chaos.runner": "chaos.run.orchestrator",
    "chaos.scenario": "chaos.spec.scenario",
    "chaos.sdc_coverage": "chaos.analysis.sdc_coverage",
    "chaos.signals": "chaos.safety.signals",
    "chaos.targets.ddp_trainer": "chaos.targets.reference.trainer",
    "chaos.targets.serving.config": "chaos.spec.serving",
    "chaos.targets.serving": "chaos.targets.reference.serving",
    "chaos.units": "chaos.spec.units",
    "injectors.dutycycle": "injectors.process.dutycycle",
    "injectors.fuselayer": "injectors.storage.fuselayer",
    "injectors.netfilter": "injectors.network.iptables",
    "injectors.netflap": "injectors.network.flap_helper",
    "injectors.nethost": "injectors.network.host",
    "injectors.netshape": "injectors.network.tc",
    "injectors.tensor_apply": "chaos.injob.tensor_faults",
}
_MOVED_PACKAGES = ("chaos.targets.serving",)  # old packages: their submodules moved with them
# Old modules whose names now live in several modules: the proxy looks a name up in MOVED_MODULES' path first,
# then in these, in order.
SPLIT_MODULES: dict[str, tuple[str, ...]] = {
    "chaos.checks.serving_windows": ("chaos.checks.serving.events", "chaos.checks.serving.measures"),
}


def moved_to(old: str) -> str | None:
    """The new path of a pre-0.2 module path, or None if ``old`` did not move."""
    if old in MOVED_MODULES:
        return MOVED_MODULES[old]
    for package in _MOVED_PACKAGES:
        if old.startswith(package + "."):
            return MOVED_MODULES[package] + old[len(package) :]
    return None


def _warn_moved(old: str, new: str) -> None:
    warnings.warn(f"{old} moved to {new} in mlchaos 0.2; the old path goes in 0.3", DeprecationWarning, stacklevel=3)


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old module path as a thin proxy of its new module (attribute reads forward, with a warning once).

    A proxy, not the new module itself, so that importing the old name never rewrites the real module's
    ``__spec__`` or ``__name__`` (pickles, ``python -m`` and reloads keep seeing the real path)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if moved_to(fullname) is None:
            return None
        return importlib.util.spec_from_loader(fullname, self, is_package=fullname in _MOVED_PACKAGES)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        new = moved_to(spec.name)
        assert new is not None
        _warn_moved(spec.name, new)
        real = importlib.import_module(new)
        homes = [real, *(importlib.import_module(extra) for extra in SPLIT_MODULES.get(spec.name, ()))]

        def forward(name: str) -> object:  # PEP 562: the first new home that defines the name
            for home in homes:
                if not name.startswith("_") and hasattr(home, name):
                    return getattr(home, name)
            return getattr(real, name)  # raises the real module's AttributeError

        proxy = types.ModuleType(spec.name, real.__doc__)
        proxy.__getattr__ = forward  # type: ignore[method-assign]
        if spec.name in _MOVED_PACKAGES:
            proxy.__path__ = []  # a package: its old submodule paths come back through this finder too
        proxy.__dict__["__all__"] = getattr(real, "__all__", [n for n in vars(real) if not n.startswith("_")])
        return proxy

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def forward_moved_names(package: str, new_module: str) -> types.FunctionType:
    """A PEP 562 ``__getattr__`` for a package that replaced a module of the same name (``chaos.plan`` was a
    module, now a package): old ``from chaos.plan import make_plan`` keeps working, with a DeprecationWarning."""

    def __getattr__(name: str) -> object:
        if name.startswith("__"):
            raise AttributeError(name)
        if importlib.util.find_spec(f"{package}.{name}") is not None:
            # ``from chaos.plan import build``: a submodule of the new package, not a name of the old module
            return importlib.import_module(f"{package}.{name}")
        real = importlib.import_module(new_module)
        if not hasattr(real, name):
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        _warn_moved(f"{package}.{name}", f"{new_module}.{name}")
        value = getattr(real, name)
        setattr(sys.modules[package], name, value)  # warn once: ``from ... import`` looks a name up twice
        return value

    return __getattr__  # type: ignore[return-value]


if not any(isinstance(f, _MovedModuleFinder) for f in sys.meta_path):
    sys.meta_path.append(_MovedModuleFinder())  # last: a real module of the old name always wins
