"""The suite's own layout: test modules are imported by basename (no packages under tests/), so two with one
name in different folders stop pytest's collection of the whole suite on a clean checkout."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_module_has_a_basename_of_its_own() -> None:
    names = Counter(path.name for path in TESTS.rglob("test_*.py"))
    assert not [name for name, count in names.items() if count > 1], sorted(names.items())
