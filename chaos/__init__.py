"""mlchaos: fault injection and chaos testing for distributed ML training and serving.

The engine lives in this package; fault families live in the sibling ``injectors`` package. Data flows one way:
``spec`` -> ``plan`` -> ``run`` -> ``history`` -> ``checks`` -> ``report`` (see ``docs/architecture.md``).
At top level live only the modules users import in their own code: :mod:`chaos.agent`, :mod:`chaos.events`
and :mod:`chaos.strategies`.

Module paths of releases before 0.2 (``chaos.runner``, ``chaos.scenario``, ``injectors.netfilter``, ...) still
import, through :data:`MOVED_MODULES`, with a :class:`DeprecationWarning` naming the new path; they go in 0.3.
Each is a stub file in a ``_moved`` folder that the package appends to its ``__path__`` (no import hook: a
training process that imports ``chaos.agent`` gets nothing on ``sys.meta_path``).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
import warnings

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


def become_moved(old: str) -> None:
    """Turn the stub module ``old`` (a file under a ``_moved`` folder) into a thin proxy of its new module:
    attribute reads forward (to the first new home that defines the name), with a DeprecationWarning once.

    A proxy, not the new module itself, so that importing the old name never rewrites the real module's
    ``__spec__`` or ``__name__`` (pickles, ``python -m`` and reloads keep seeing the real path)."""
    new = moved_to(old)
    assert new is not None, old
    _warn_moved(old, new)
    real = importlib.import_module(new)
    homes = [real, *(importlib.import_module(extra) for extra in SPLIT_MODULES.get(old, ()))]

    def forward(name: str) -> object:  # PEP 562: the first new home that defines the name
        for home in homes:
            if not name.startswith("_") and hasattr(home, name):
                return getattr(home, name)
        return getattr(real, name)  # raises the real module's AttributeError

    stub = sys.modules[old]
    proxy = types.ModuleType(old, real.__doc__)
    proxy.__getattr__ = forward  # type: ignore[method-assign]
    proxy.__spec__ = stub.__spec__
    if old in _MOVED_PACKAGES:
        proxy.__path__ = list(stub.__path__)  # its old submodules' stubs sit beside it
    proxy.__dict__["__all__"] = getattr(real, "__all__", [n for n in vars(real) if not n.startswith("_")])
    sys.modules[old] = proxy  # what the import statement returns


def with_moved(path: list[str]) -> None:
    """Append the folder of a package's pre-0.2 stubs (its ``_moved`` folder) to its ``__path__``: old submodule
    paths are found there, after every real module (no import hook: a plain package path)."""
    path.append(f"{path[0]}/_moved")


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


with_moved(__path__)  # chaos.runner, chaos.scenario, ...: stubs in chaos/_moved/
