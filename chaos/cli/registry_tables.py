"""The registry as tables: every injector and check with its summary and parameters, for ``mlchaos list`` (a
terminal table) and for the generated tables in ``docs/faults.md`` and ``docs/checks.md`` (markdown between
``<!-- generated: NAME -->`` markers; ``scripts/doc_tables.py`` rewrites them, a test fails when they differ)."""

from __future__ import annotations

import re

from pydantic import BaseModel

from chaos.plugins import registry

Row = tuple[str, ...]


def params_text(model: type[BaseModel]) -> str:
    """``name=default`` for each field (just ``name`` when required), or ``-`` when there are none."""
    parts = []
    for name, field in model.model_fields.items():
        default = "" if field.is_required() else f"={field.get_default(call_default_factory=True)!r}"
        parts.append(f"{name}{default}")
    return ", ".join(parts) or "-"


def injector_rows() -> tuple[Row, list[Row]]:
    """Header and one row per injector: its YAML type, where it acts, what it does, its params."""
    header: Row = ("type", "acts from", "what it does", "params")
    rows: list[Row] = []
    for name, cls in registry.injectors().items():
        where = "in the job (agent)" if getattr(cls, "in_job", False) else "harness"
        rows.append((name, where, cls.summary, params_text(cls.Params)))
    return header, rows


def check_rows() -> tuple[Row, list[Row]]:
    """Header and one row per check: its YAML type, what it asserts, what gives it evidence, its params."""
    header: Row = ("type", "what it asserts", "its evidence comes from", "params")
    rows: list[Row] = []
    for name, spec in registry.checks().items():
        needs = (spec.to_add or "-") + ("; a golden run" if spec.needs_golden else "")
        rows.append((name, spec.summary, needs, params_text(spec.Params)))
    return header, rows


def markdown(header: Row, rows: list[Row]) -> str:
    """A markdown table; ``|`` in a cell is escaped, code-like cells (types, params) are in backticks."""

    def cell(text: str, code: bool) -> str:
        text = text.replace("|", "\\|")
        return f"`{text}`" if code and text != "-" else text

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        lines.append("| " + " | ".join(cell(text, i in (0, len(row) - 1)) for i, text in enumerate(row)) + " |")
    return "\n".join(lines)


TABLES = {"faults": injector_rows, "checks": check_rows}
_BLOCK = re.compile(r"(<!-- generated: (\w+) .*?-->\n)(.*?)(<!-- /generated -->)", re.DOTALL)


def refreshed(text: str) -> str:
    """``text`` with every ``<!-- generated: NAME ... -->`` block replaced by the current table NAME."""

    def replace(match: re.Match[str]) -> str:
        header, rows = TABLES[match.group(2)]()
        return f"{match.group(1)}{markdown(header, rows)}\n{match.group(4)}"

    return _BLOCK.sub(replace, text)
