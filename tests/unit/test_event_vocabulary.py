"""One event vocabulary: every event kind is declared once, in ``chaos/event_kinds.py``, and every kind mlchaos
records is one of its kinds.

The source is read, not imported: a module-level ``NAME = "family.name"`` (or ``NAME: Final = ...``) anywhere
else under ``chaos/`` or ``injectors/`` is a second declaration (import the constant instead), and a string
literal passed as the kind to ``record``, ``emit`` or ``Event(kind=...)`` must be in ``ALL_KINDS``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

from chaos import event_kinds
from chaos.event_kinds import ALL_KINDS, FAMILIES

ROOT = Path(__file__).resolve().parents[2]
VOCABULARY = ROOT / "chaos" / "event_kinds.py"
FILE_SUFFIXES = frozenset({"conf", "html", "json", "jsonl", "log", "pid", "png", "prom", "py", "xml", "yaml", "yml"})
"""A ``family.name`` whose name is one of these is a file name (``serving.html``, ``target.log``), not a kind."""
RECORDERS = frozenset({"record", "emit", "_emit"})


def sources() -> list[Path]:
    """Every module under chaos/ and injectors/ (the ``_moved`` folders of old paths skipped)."""
    return [p for top in ("chaos", "injectors") for p in sorted((ROOT / top).rglob("*.py")) if "_moved" not in p.parts]


def is_kind(value: object) -> bool:
    """A declared kind, or a string shaped like one of an event family (``detect.anything``)."""
    if not isinstance(value, str):
        return False
    if value in ALL_KINDS:
        return True
    family, dot, name = value.partition(".")
    return bool(dot) and family in FAMILIES and name.isidentifier() and name not in FILE_SUFFIXES


def declarations(path: Path) -> list[tuple[int, str, str]]:
    """(line, NAME, kind) of each module-level assignment of a kind string in ``path``."""
    found = []
    for node in ast.parse(path.read_text(), str(path)).body:
        target, value = None, None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        if isinstance(target, ast.Name) and isinstance(value, ast.Constant) and is_kind(value.value):
            found.append((node.lineno, target.id, str(value.value)))
    return found


def second_declarations(paths: Iterable[Path]) -> list[str]:
    """Every kind declared outside the vocabulary, as ``path:line NAME = 'kind'``."""
    return [
        f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{line} {name} = {kind!r}"
        for path in paths
        if path != VOCABULARY
        for line, name, kind in declarations(path)
    ]


def recorded_literals(path: Path) -> list[tuple[int, str]]:
    """(line, kind) of each string literal passed as the kind to ``record``/``emit``/``_emit`` (first argument)
    or to ``Event(kind=...)``/``Event.model_construct(kind=...)`` in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        given: list[ast.expr] = []
        if name in RECORDERS and node.args:
            given.append(node.args[0])
        if name in ("Event", "model_construct"):
            given.extend(k.value for k in node.keywords if k.arg == "kind")
        found.extend((node.lineno, g.value) for g in given if isinstance(g, ast.Constant) and isinstance(g.value, str))
    return found


def unknown_kinds(paths: Iterable[Path]) -> list[str]:
    """Every recorded literal kind missing from the vocabulary, as ``path:line 'kind'``."""
    return [
        f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{line} {kind!r}"
        for path in paths
        for line, kind in recorded_literals(path)
        if kind not in ALL_KINDS
    ]


def test_every_kind_is_declared_only_in_the_vocabulary() -> None:
    found = second_declarations(sources())
    assert not found, "event kinds declared outside chaos/event_kinds.py (import them from there):\n" + "\n".join(found)


def test_the_vocabulary_declares_each_kind_once_under_its_own_name() -> None:
    declared = declarations(VOCABULARY)
    kinds = [kind for _, _, kind in declared]
    assert sorted(kinds) == sorted(ALL_KINDS), "ALL_KINDS and the declarations of chaos/event_kinds.py differ"
    twice = sorted({kind for kind in kinds if kinds.count(kind) > 1})
    assert not twice, f"declared twice in chaos/event_kinds.py: {twice}"
    misnamed = [f"{name} = {kind!r}" for _, name, kind in declared if name != kind.upper().replace(".", "_")]
    assert not misnamed, f"a kind's constant is its kind in capitals (fault.applied: FAULT_APPLIED): {misnamed}"
    assert all(getattr(event_kinds, name) == kind for _, name, kind in declared)


def test_every_literal_kind_recorded_is_in_the_vocabulary() -> None:
    found = unknown_kinds(sources())
    assert not found, "kinds recorded but missing from chaos/event_kinds.py (declare them there):\n" + "\n".join(found)


def test_the_scanners_catch_a_planted_duplicate_and_an_unknown_kind(tmp_path: Path) -> None:
    """The checks above must be able to fail: a module redeclaring a kind, one declaring a new kind of an event
    family, and one recording a kind the vocabulary lacks; file names and known kinds pass."""
    planted = tmp_path / "planted.py"
    planted.write_text(
        "from typing import Final\n"
        "from chaos.events import emit\n"
        'APPLIED = "fault.applied"\n'
        'NEW_KIND: Final = "detect.planted_kind"\n'
        'PAGE = "serving.html"\n'
        'emit("detect.planted_kind", rank=0)\n'
        'emit("target.step", rank=0, step=1)\n'
    )
    assert second_declarations([planted]) == [
        f"{planted}:3 APPLIED = 'fault.applied'",
        f"{planted}:4 NEW_KIND = 'detect.planted_kind'",
    ]
    assert unknown_kinds([planted]) == [f"{planted}:6 'detect.planted_kind'"]
