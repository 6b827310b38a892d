"""Rewrite the generated tables in docs/ from the registry (``<!-- generated: faults|checks -->`` blocks).

Run: ``.venv/bin/python scripts/doc_tables.py`` after adding or changing an injector or check;
``tests/unit/test_doc_tables.py`` fails until the docs match ``mlchaos list``. ``--check`` changes nothing and
exits 1 when a file would change."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from chaos.cli.registry_tables import refreshed  # noqa: E402

DOCS = (ROOT / "docs" / "faults.md", ROOT / "docs" / "checks.md")


def main() -> int:
    stale = []
    for path in DOCS:
        text = path.read_text()
        if refreshed(text) != text:
            stale.append(path)
            if "--check" not in sys.argv:
                path.write_text(refreshed(text))
    for path in stale:
        print(f"{'stale' if '--check' in sys.argv else 'rewrote'}: {path.relative_to(ROOT)}")
    return 1 if stale and "--check" in sys.argv else 0


if __name__ == "__main__":
    sys.exit(main())
