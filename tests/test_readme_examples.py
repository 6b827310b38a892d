"""The README's code examples run as written (so the README stays true)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _python_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_property_testing_example_runs() -> None:
    [block] = [b for b in _python_blocks() if "def test_my_guard_sees_exponent_flips" in b]
    namespace: dict[str, object] = {}
    exec(compile(block, "README.md", "exec"), namespace)  # noqa: S102 - our own README
    test = namespace["test_my_guard_sees_exponent_flips"]
    assert callable(test)
    test()  # hypothesis runs its examples here
