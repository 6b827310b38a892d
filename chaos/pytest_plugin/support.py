"""Pure helpers of the pytest plugin: setting precedence, scenario overrides, scenario sniffing, report text.

Nothing here imports pytest, torch or the runner at module import: the plugin loads in every pytest run
of every project that has mlchaos installed, so its import must stay cheap. Everything is a pure function
of its arguments (the file sniffer reads the one file it is given), which is what the unit tests rely on.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Generic, Literal, TypeVar

if TYPE_CHECKING:
    from chaos.checks.base import CheckResult
    from chaos.run.result import RunResult

T = TypeVar("T")

Layer = Literal["call", "marker", "option", "env", "ini", "scenario", "default"]
# Highest first. ``call``: an argument of ``chaos_run(...)``; ``marker``: ``@pytest.mark.chaos(...)``;
# ``option``: ``--chaos-*`` on the command line; ``env``: ``MLCHAOS_*``; ``ini``: ``chaos_*`` in the ini
# file; ``scenario``: what the scenario file itself says; ``default``: the plugin's built-in default.
LAYERS: tuple[Layer, ...] = ("call", "marker", "option", "env", "ini", "scenario", "default")


@dataclass(frozen=True)
class Resolved(Generic[T]):
    """A setting's value and the layer it came from (``None``/``None`` when no layer set it)."""

    value: T | None
    source: Layer | None


def resolve(candidates: Mapping[Layer, T | None]) -> Resolved[T]:
    """The value of the highest layer (see :data:`LAYERS`) that is set; ``None`` means "not set here".

    Missing layers count as not set. A falsy value that is not ``None`` (seed ``0``) IS set.
    """
    for layer in LAYERS:
        value = candidates.get(layer)
        if value is not None:
            return Resolved(value, layer)
    return Resolved(None, None)


def parse_seed(text: str | None, where: str) -> int | None:
    """``None``/blank -> None, else the integer; ValueError naming ``where`` (e.g. ``MLCHAOS_SEED``) otherwise."""
    if text is None or not text.strip():
        return None
    try:
        return int(text.strip(), 0)
    except ValueError:
        raise ValueError(f"{where}={text!r} is not an integer seed") from None


# -- overrides ------------------------------------------------------------------------------------------------


class OverrideError(ValueError):
    """An override names a fault or check that the scenario does not have."""


def apply_overrides(data: Mapping[str, object], overrides: Mapping[str, object]) -> dict[str, object]:
    """``data`` (a scenario's YAML mapping) with ``overrides`` deep-merged in; neither input is changed.

    - a mapping merged into a mapping: key by key, recursively;
    - a mapping merged into ``faults`` or ``checks`` (lists in the scenario): its keys select items by
      name (a fault's ``name`` or default ``<type>-<n>``; a check's ``name``, or its ``type`` when only
      one check has it) and each value is merged into that item; a ``None`` value removes the item;
    - anything else (a scalar, a list, ``None``) replaces the value: ``{"faults": []}`` drops every fault,
      ``{"target": {"args": [...]}}`` replaces the argument list, ``{"safety": {"no_progress_timeout": None}}``
      sets it to null.
    The result is validated as a whole scenario afterwards, so a wrong key fails with the usual file:line.
    """
    merged = _merge(dict(data), overrides, ())
    assert isinstance(merged, dict)
    return merged


def _merge(base: object, override: object, path: tuple[str, ...]) -> object:
    if isinstance(override, Mapping):
        if isinstance(base, Mapping):
            out = dict(base)
            for key, value in override.items():
                out[str(key)] = _merge(out.get(str(key)), value, (*path, str(key)))
            return out
        if isinstance(base, list) and path in (("faults",), ("checks",)):
            return _merge_named(base, override, path[0])
    return _copy(override)


def _copy(value: object) -> object:
    """A deep copy of plain YAML data, so the result never aliases the caller's overrides."""
    if isinstance(value, Mapping):
        return {str(k): _copy(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_copy(v) for v in value]
    return value


def item_names(items: list[object], kind: str) -> list[list[str]]:
    """For each fault/check item (raw YAML), the names an override may use for it (see apply_overrides)."""
    types = [str(item.get("type", "")) if isinstance(item, Mapping) else "" for item in items]
    counts: dict[str, int] = {}
    names: list[list[str]] = []
    for item, kind_of in zip(items, types, strict=True):
        counts[kind_of] = counts.get(kind_of, 0) + 1
        own = str(item.get("name") or "") if isinstance(item, Mapping) else ""
        these = [own] if own else []
        if kind == "faults" and not own:
            these.append(f"{kind_of}-{counts[kind_of]}")  # the scenario loader's default name
        if kind == "checks" and kind_of and types.count(kind_of) == 1:
            these.append(kind_of)
        names.append(these)
    return names


def _merge_named(items: list[object], override: Mapping[object, object], kind: str) -> list[object]:
    names = item_names(items, kind)
    out: list[object | None] = list(items)
    for key, value in override.items():
        index = next((i for i, these in enumerate(names) if str(key) in these), None)
        if index is None:
            known = ", ".join(n for these in names for n in these) or "none"
            raise OverrideError(f"override {kind}.{key}: the scenario has no such {kind[:-1]} (it has: {known})")
        out[index] = None if value is None else _merge(out[index], value, (kind, str(key)))
    return [item for item in out if item is not None]


# -- which YAML files are scenarios ---------------------------------------------------------------------------

_MAX_SCENARIO_BYTES = 1 << 20
_TOP_KEY = re.compile(r"^(name|target)\s*:", re.MULTILINE)


def looks_like_scenario(path: Path) -> bool:
    """True when ``path`` is a YAML file whose top level has both ``name`` and ``target`` keys.

    A file that does not parse still counts when both keys start a line at column 0, so a scenario with a
    syntax error is collected (and fails with file:line) instead of silently vanishing from the run.
    CI configs, compose files and other YAML lack one of the two keys and are left alone.
    """
    try:
        if path.stat().st_size > _MAX_SCENARIO_BYTES:
            return False
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    import yaml  # only for .yaml files, so runs without any pay nothing

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return {m.group(1) for m in _TOP_KEY.finditer(text)} == {"name", "target"}
    return isinstance(data, dict) and "name" in data and "target" in data


def scenario_name(path: Path) -> str:
    """The scenario's ``name`` for the test id, or the file's stem when it cannot be read."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return path.stem
    name = data.get("name") if isinstance(data, dict) else None
    return name if isinstance(name, str) and name else path.stem


def under_any(path: Path, roots: list[Path]) -> bool:
    """Whether ``path`` is one of ``roots`` or inside one of them (all absolute)."""
    return any(path == root or root in path.parents for root in roots)


# -- report text ----------------------------------------------------------------------------------------------


def failing(check: CheckResult, allow_unknown: bool) -> bool:
    """Whether this check makes the run fail (``unknown`` fails unless the scenario allows it)."""
    return check.status == "fail" or (check.status == "unknown" and not allow_unknown)


def check_property(check: CheckResult) -> str:
    """The JUnit property value of one check: ``<status> measured=<m> bound=<b>`` (+ reason unless pass)."""
    text = f"{check.status} measured={check.measured_text()} bound={check.bound or '-'}"
    return text if check.status == "pass" or not check.reason else f"{text} reason={check.reason}"


def check_line(check: CheckResult) -> str:
    """One line per check for the terminal: status, name, measured, bound, and why when it did not pass."""
    line = f"{check.status.upper():<7} {check.name}  measured={check.measured_text()}  bound={check.bound or '-'}"
    return line if check.status == "pass" or not check.reason else f"{line}  ({check.reason})"


def run_properties(result: RunResult, prefix: str = "") -> list[tuple[str, str]]:
    """``(name, value)`` pairs for ``item.user_properties``: one ``check:<name>`` per check, then the verdict,
    seed and run directory. ``prefix`` tells apart several runs in one test (e.g. ``run2/``)."""
    props = [(f"check:{prefix}{c.name}", check_property(c)) for c in result.results]
    props += [
        (f"mlchaos:{prefix}verdict", result.verdict),
        (f"mlchaos:{prefix}seed", str(result.plan.seed)),
        (f"mlchaos:{prefix}run_dir", str(result.run_dir)),
    ]
    return props


def summary_lines(result: RunResult) -> list[str]:
    """Verdict line then one indented line per check (what the plugin prints for every run)."""
    head = f"{result.scenario.name}: {result.verdict.upper()} (seed {result.plan.seed}; ended by: {result.ended_by})"
    return [head, *(f"  {check_line(c)}" for c in result.results)]


def failure_text(result: RunResult, evidence_lines: int = 6) -> str:
    """Why a run did not pass: every failing check with measured value, bound, reason and evidence, the
    harness error if any, the run directory and the replay command."""
    from chaos.report.files import replay_command

    lines = [f"mlchaos scenario {result.scenario.name!r}: verdict {result.verdict} (exit {result.exit_code})"]
    if result.error:
        lines.append(f"error: {result.error}")
    lines.append(f"ended by: {result.ended_by}")
    if result.ended_by == "refused" and "inventory" in result.error:
        lines.append(
            "hint: under pytest give it with --chaos-inventory FILE, MLCHAOS_INVENTORY, or ini chaos_inventory"
        )
    for check in result.results:
        lines.append(f"  {check_line(check)}")
        if failing(check, result.scenario.allow_unknown):
            lines.extend(f"      {e}" for e in check.evidence[:evidence_lines])
    lines.append(f"run dir: {result.run_dir.resolve()}")
    lines.append(f"replay: {replay_command(result)}")
    return "\n".join(lines)
