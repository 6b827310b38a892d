"""What ``parse_scenario`` checks beside the model's own validation, each problem at its file position: fault
names are unique and the checks name faults that exist (on the raw YAML), numbers no one meant (NaN, infinity,
booleans) in the validated model, and a plugin validator that crashed rather than refused.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ValidationError

from chaos.plugins import registry
from chaos.spec.problems import Path_, Problem, nearest, position


def validator_crash(exc: Exception, data: dict[str, Any], marks: dict[Path_, tuple[int, int]], file: str) -> Problem:
    """A Problem for a validator that raised something other than ValueError (a plugin's bug, e.g. a
    TypeError on a list where it expected a string), at the fault or check whose params raise it."""
    plugins: dict[str, dict[str, type[BaseModel]]] = {
        "faults": {name: cls.Params for name, cls in registry.injectors().items()},
        "checks": {name: spec.Params for name, spec in registry.checks().items()},
    }
    for key, models in plugins.items():
        for index, item in _items(data, key):
            params_model = models.get(str(item.get("type")))
            if params_model is None:
                continue
            try:
                params_model.model_validate(item.get("params", {}))
            except ValidationError:
                continue
            except Exception:  # noqa: BLE001 - the one that crashes
                where = f"{key}.{index}.params"
                message = f"{where}: its {item['type']} validator failed ({type(exc).__name__}: {exc})"
                return Problem(file, *position(marks, (key, index, "params")), message, "check the values here")
    return Problem(file, 1, 1, f"validating the scenario failed ({type(exc).__name__}: {exc})", "check the values")


def nonsense_numbers(
    value: object, raw: object, path: Path_, marks: dict[Path_, tuple[int, int]], file: str
) -> list[Problem]:
    """Numbers the model took but no one meant: NaN or infinity in any float (``rate: .inf``, ``factor: .nan``;
    a bound compared with NaN never trips), and ``true``/``false`` where a number belongs (pydantic reads
    ``nproc_per_node: true`` as 1). Walks the validated model beside the YAML it came from, so every
    injector's and check's params are covered without each declaring it."""
    if isinstance(value, BaseModel):
        found: list[Problem] = []
        if not isinstance(raw, dict):
            return found
        for name, field in type(value).model_fields.items():
            key = field.alias or name
            if key in raw:
                found += nonsense_numbers(getattr(value, name), raw[key], (*path, key), marks, file)
        return found
    if isinstance(value, (list, tuple)) and isinstance(raw, list) and len(raw) == len(value):
        return [
            p
            for i, (v, r) in enumerate(zip(value, raw, strict=True))
            for p in nonsense_numbers(v, r, (*path, i), marks, file)
        ]
    if isinstance(value, dict) and isinstance(raw, dict):
        return [p for k, v in value.items() if k in raw for p in nonsense_numbers(v, raw[k], (*path, k), marks, file)]
    where = ".".join(str(p) for p in path)
    if isinstance(value, float) and not math.isfinite(value):
        return [Problem(file, *position(marks, path), f"{where}: must be a finite number (got {raw!r})")]
    if isinstance(raw, bool) and isinstance(value, (int, float)) and not isinstance(value, bool):
        return [Problem(file, *position(marks, path), f"{where}: expected a number, got the boolean {raw!r}")]
    return []


def _items(data: dict[str, Any], key: str) -> list[tuple[int, dict[str, Any]]]:
    """The mappings of the list ``data[key]`` with their indexes (what is not a mapping, the model reports)."""
    entries = data.get(key)
    return [(i, e) for i, e in enumerate(entries) if isinstance(e, dict)] if isinstance(entries, list) else []


def fault_names(faults: list[tuple[str, str]]) -> list[str]:
    """The name of each (type, name) fault; an unnamed one is ``<type>-<n>``, n counting the faults of its type."""
    counts: dict[str, int] = {}
    names = []
    for kind, name in faults:
        counts[kind] = counts.get(kind, 0) + 1
        names.append(name or f"{kind}-{counts[kind]}")
    return names


def cross_check(data: dict[str, Any], marks: dict[Path_, tuple[int, int]], file: str) -> list[Problem]:
    """Fault names are unique, and a check's ``fault`` names a fault that exists."""
    problems: list[Problem] = []
    faults = _items(data, "faults")
    names = fault_names([(str(fault.get("type", "")), str(fault.get("name") or "")) for _, fault in faults])
    defined: list[str] = []
    for (index, _), name in zip(faults, names, strict=True):
        if name in defined:
            at = position(marks, ("faults", index))
            problems.append(Problem(file, *at, f"duplicate fault name {name!r}", "give each fault a unique name"))
        defined.append(name)
    checks = registry.checks()
    for index, check in _items(data, "checks"):
        spec = checks.get(str(check.get("type")))
        params = check.get("params")
        referenced = params.get("fault") if isinstance(params, dict) else None
        if spec is None or "fault" not in spec.Params.model_fields or not isinstance(referenced, str):
            continue  # an unknown check type or a fault that is not a name: the model says what is wrong
        if referenced not in defined:
            line, column = position(marks, ("checks", index, "params", "fault"))
            hint = nearest(referenced, defined) or (
                "faults defined: " + ", ".join(defined) if defined else "add the fault under faults:"
            )
            message = f"check {check['type']!r} names fault {referenced!r}, which is not defined"
            problems.append(Problem(file, line, column, message, hint))
    return problems
