"""The fault and check tables in docs/ are the registry's, as ``mlchaos list`` prints them; the generator is
held to a planted stale block."""

from __future__ import annotations

from pathlib import Path

from chaos.cli.registry_tables import refreshed

ROOT = Path(__file__).resolve().parents[2]


def test_the_doc_tables_match_the_registry() -> None:
    for name in ("faults.md", "checks.md"):
        text = (ROOT / "docs" / name).read_text()
        assert "<!-- generated: " in text
        assert refreshed(text) == text, f"docs/{name} is stale: run .venv/bin/python scripts/doc_tables.py"


def test_a_stale_table_is_rewritten() -> None:
    stale = "intro\n<!-- generated: faults (x) -->\n| type |\n|---|\n| `gone_fault` |\n<!-- /generated -->\nafter\n"
    fresh = refreshed(stale)
    assert fresh != stale and "gone_fault" not in fresh and "`partition`" in fresh
    assert fresh.startswith("intro\n") and fresh.endswith("<!-- /generated -->\nafter\n")
    assert refreshed(fresh) == fresh
