"""Every link in README.md and docs/ resolves inside the repository: a relative link names a file that exists
(and stays in the repository), an anchor names a heading of its page. Web links are not fetched. The checker is
held to planted broken links."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


@cache
def _anchors(page: Path) -> set[str]:
    in_code = False
    found = set()
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            found.add(_anchor(line.lstrip("#")))
    return found


def broken_links(page: Path, root: Path) -> list[str]:
    """The links of ``page`` that do not resolve inside ``root`` (each as ``page:line: link (why)``)."""
    problems = []
    in_code = False
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if line.startswith("```"):
            in_code = not in_code
        if in_code:
            continue
        for match in _LINK.finditer(line):
            link = match.group(1) or match.group(2)
            if link.startswith(("http://", "https://", "mailto:")):
                continue
            path_part, _, anchor = link.partition("#")
            target = (page.parent / path_part).resolve() if path_part else page
            where = f"{page.relative_to(root)}:{number}: {link}"
            if root.resolve() not in target.parents and target != root.resolve():
                problems.append(f"{where} (outside the repository)")
            elif not target.exists():
                problems.append(f"{where} (no such file)")
            elif anchor and target.suffix == ".md" and anchor not in _anchors(target):
                problems.append(f"{where} (no such heading)")
    return problems


def test_no_dangling_link_in_the_docs() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    assert [problem for page in pages for problem in broken_links(page, ROOT)] == []


def test_the_checker_finds_planted_broken_links(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "there.md").write_text("# A heading\n")
    page = tmp_path / "README.md"
    page.write_text(
        "[ok](docs/there.md) [ok](docs/there.md#a-heading) [ok](#top) [web](https://example.org)\n"
        "# Top\n"
        "[gone](docs/missing.md) [out](../shared/ARCHITECTURE.md) [bad](docs/there.md#nope) ![img](x.png)\n"
    )
    assert broken_links(page, tmp_path) == [
        "README.md:3: docs/missing.md (no such file)",
        "README.md:3: ../shared/ARCHITECTURE.md (outside the repository)",
        "README.md:3: docs/there.md#nope (no such heading)",
        "README.md:3: x.png (no such file)",
    ]
