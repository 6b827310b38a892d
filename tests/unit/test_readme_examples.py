"""The code examples of the README and docs/ run as written (so the docs stay true)."""

from __future__ import annotations

import linecache
import re

from support import ROOT


def _python_blocks() -> list[str]:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    text = "\n".join(page.read_text(encoding="utf-8") for page in pages)
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_property_testing_example_runs() -> None:
    [block] = [b for b in _python_blocks() if "def test_my_guard_sees_exponent_flips" in b]
    namespace: dict[str, object] = {}
    # hypothesis reads the test's source (inspect.getsource) to seed itself. Compiling
    # under the name "README.md" made it tokenize the real README from the block's line
    # number, which broke as soon as the README grew; a linecache entry of its own gives
    # inspect exactly the block.
    filename = "<README.md property-testing example>"
    linecache.cache[filename] = (len(block), None, block.splitlines(keepends=True), filename)
    exec(compile(block, filename, "exec"), namespace)  # noqa: S102 - our own README
    test = namespace["test_my_guard_sees_exponent_flips"]
    assert callable(test)
    test()  # hypothesis runs its examples here


def test_the_one_line_the_readme_shows_is_the_one_the_tests_add() -> None:
    # tests/e2e/test_e2e_unmodified_script.py and test_e2e_user_torchft.py add exactly these lines to users' scripts.
    section = (ROOT / "README.md").read_text(encoding="utf-8").split("## Your own training script", 1)[1]
    section = section.split("\n## ", 1)[0]
    for line in (
        "chaos.agent.attach(model, optimizer, ddp=ddp)",
        "chaos.agent.attach(model,\\noptimizer, manager=manager, ddp=ddp)",
    ):
        assert re.sub(r"\s+", " ", line.replace("\\n", " ")) in re.sub(r"\s+", " ", section), line
    for test in ("test_e2e_unmodified_script.py", "test_e2e_user_torchft.py"):
        source = (ROOT / "tests" / "e2e" / test).read_text(encoding="utf-8")
        assert "chaos.agent.attach(model, optimizer, " in source, test
