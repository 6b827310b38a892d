"""One way to register: every built-in injector class and check is in the registry under the name it declares,
every registered name resolves, and no module defines an injector or a check the registry does not know. The
scanners are held to a planted defect (a package with an unregistered injector and an unlisted check module)."""

from __future__ import annotations

import importlib
import pkgutil
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from chaos.plugins import check as check_module
from chaos.plugins import registry

ROOT = Path(__file__).resolve().parents[2]


def _modules(package: str) -> Iterator[ModuleType]:
    """Every module of ``package`` (imported), ``__main__`` modules left out."""
    root = importlib.import_module(package)
    yield root
    for info in pkgutil.walk_packages(root.__path__, prefix=f"{package}."):
        if info.name.endswith("__main__"):
            continue
        yield importlib.import_module(info.name)


def _injector_classes(module: ModuleType) -> list[type]:
    """The concrete injector classes ``module`` defines: a class of its own with a ``name``, a ``Params`` model
    and the lifecycle methods (a shared base without a name of its own is not one)."""
    found = []
    for value in vars(module).values():
        if (
            isinstance(value, type)
            and value.__module__ == module.__name__
            and isinstance(vars(value).get("name", getattr(value, "name", None)), str)
            and hasattr(value, "Params")
            and all(callable(getattr(value, method, None)) for method in ("prepare", "apply", "heal"))
        ):
            found.append(value)
    return found


def unregistered_injectors(package: str, registered: dict[str, type]) -> list[str]:
    """Injector classes defined under ``package`` that the registry does not hold under their own name."""
    return [
        f"{cls.__module__}.{cls.__qualname__} ({cls.name!r})"  # type: ignore[attr-defined]
        for module in _modules(package)
        for cls in _injector_classes(module)
        if registered.get(cls.name) is not cls  # type: ignore[attr-defined]
    ]


def unlisted_check_modules(package: str, listed: tuple[str, ...]) -> list[str]:
    """Modules under ``package`` whose import registered a check, that are not in ``listed``."""
    for _ in _modules(package):  # importing a check module registers its checks
        pass
    registering = {spec.evaluate.__module__ for spec in check_module.CHECKS.values()}
    return sorted(
        m for m in registering if m.split(".")[0] == package.split(".")[0] and m.startswith(package) and m not in listed
    )


def test_every_builtin_injector_is_registered_under_its_own_name() -> None:
    registered = registry.injectors()
    assert unregistered_injectors("injectors", dict(registered)) == []
    for name, cls in registered.items():
        assert cls.name == name
        assert registry.injector(name).name == name  # resolves to a working instance


def test_every_check_module_is_listed_and_every_check_resolves() -> None:
    checks = registry.checks()
    assert unlisted_check_modules("chaos.checks", registry.BUILTIN_CHECK_MODULES) == []
    for name, spec in checks.items():
        assert spec.name == name and spec.Params is not None and callable(spec.evaluate)
    assert set(registry.BUILTIN_CHECK_MODULES) <= {spec.evaluate.__module__ for spec in checks.values()}, (
        "a listed check module registers no check"
    )


def test_no_builtin_is_also_an_entry_point_of_this_distribution() -> None:
    """Built-ins have one list; the packaging metadata names only the pytest plugin."""
    text = (ROOT / "pyproject.toml").read_text()
    assert '[project.entry-points."mlchaos.injectors"]' not in text
    assert '[project.entry-points."mlchaos.checks"]' not in text


def test_the_scanners_find_a_planted_unregistered_injector_and_an_unlisted_check_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "planted"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "faults.py").write_text(
        "from pydantic import BaseModel\n"
        "class P(BaseModel):\n    pass\n"
        "class Base:\n    def prepare(self, ctx, op): ...\n    def apply(self, ctx, a): ...\n    def heal(self, ctx, a): ...\n"
        "class Listed(Base):\n    name = 'planted_listed'\n    Params = P\n"
        "class Forgotten(Base):\n    name = 'planted_forgotten'\n    Params = P\n"
        "INJECTORS = (Listed,)\n"
    )
    (package / "verdicts.py").write_text(
        "from pydantic import BaseModel\n"
        "from chaos.plugins.check import register_check\n"
        "class P(BaseModel):\n    pass\n"
        "@register_check('planted_check', P, summary='planted')\n"
        "def planted(history, params, scenario): ...\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(check_module, "CHECKS", dict(check_module.CHECKS))
    faults = importlib.import_module("planted.faults")
    found = unregistered_injectors("planted", {cls.name: cls for cls in faults.INJECTORS})
    assert found == ["planted.faults.Forgotten ('planted_forgotten')"]
    assert unlisted_check_modules("planted", ()) == ["planted.verdicts"]
    assert unlisted_check_modules("planted", ("planted.verdicts",)) == []
    for name in [m for m in sys.modules if m == "planted" or m.startswith("planted.")]:
        monkeypatch.delitem(sys.modules, name)


def test_a_check_is_summarized_by_its_docstring_unless_it_says_summary(monkeypatch: pytest.MonkeyPatch) -> None:
    """The summary is the docstring's first paragraph on one line; ``summary=`` overrides it; neither is an error."""
    Params = registry.checks()["completes"].Params  # (first: the built-ins register into the real table)
    monkeypatch.setattr(check_module, "CHECKS", {})

    @check_module.register_check("documented", Params)
    def documented(history: object, p: object, scenario: object) -> check_module.CheckResult:
        """what it asserts, said
        over two lines

        How it judges (not the summary)."""
        return check_module.CheckResult(check="documented", name="documented", status="pass")

    check_module.register_check("said", Params, summary="said here")(documented)
    assert check_module.CHECKS["documented"].summary == "what it asserts, said over two lines"
    assert check_module.CHECKS["said"].summary == "said here"

    def bare(history: object, p: object, scenario: object) -> check_module.CheckResult:
        return check_module.CheckResult(check="bare", name="bare", status="pass")

    with pytest.raises(ValueError, match="'bare' has no summary"):
        check_module.register_check("bare", Params)(bare)
