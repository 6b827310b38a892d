"""Problems in a YAML file, pinned to file:line:column: reading YAML with the position of every key, and turning
pydantic's errors into messages that name the key, what would be valid there and what was given.

Scenarios, suites and inventories all read their files through :func:`read_yaml_mapping` and word their errors
through :func:`problem_for`, so a user sees one style of error whichever file is wrong.
"""

from __future__ import annotations

import difflib
import re
import signal
import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, BeforeValidator
from pydantic.fields import FieldInfo

from chaos.spec.units import NonFiniteDuration, parse_duration, short_repr


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a scenario file, pinned to a position, with a fix when one is known."""

    file: str
    line: int
    column: int
    message: str
    hint: str = ""

    def __str__(self) -> str:
        text = f"{self.file}:{self.line}:{self.column}: {self.message}"
        return f"{text}\n    fix: {self.hint}" if self.hint else text


class ScenarioError(Exception):
    """A scenario could not be loaded; ``problems`` lists every error found, each with file:line:column."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


Path_ = tuple[str | int, ...]


def yaml_positions(
    node: yaml.Node,
    path: Path_,
    out: dict[Path_, tuple[int, int]],
    dupes: list[Problem],
    file: str,
    walked: set[int] | None = None,
) -> None:
    """Record (line, column), 1-based, of every mapping key and sequence item below ``node``. A node reached
    again through an alias (``*name``) is not walked again: an alias of itself would never end, and aliases of
    aliases would grow exponentially; a problem under one is placed at the alias."""
    walked = set() if walked is None else walked
    if id(node) in walked:
        return
    walked.add(id(node))
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = str(key_node.value)
            here = (*path, key)
            position = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            if key in seen:
                dupes.append(Problem(file, *position, f"duplicate key {key!r}", "keep one of the two entries"))
            seen.add(key)
            out[here] = position
            yaml_positions(value_node, here, out, dupes, file, walked)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            here = (*path, index)
            out[here] = (item.start_mark.line + 1, item.start_mark.column + 1)
            yaml_positions(item, here, out, dupes, file, walked)


MAX_YAML_CHARS = 256 * 1024  # YAML is parsed at ~1.5 MB/min here (line positions kept): a bigger file waits
MAX_NUMBER_CHARS = 64  # no number a scenario holds is longer; Python refuses to parse ints past 4,300 digits


class _NumberTooLong(Exception):
    def __init__(self, node: yaml.ScalarNode) -> None:
        super().__init__(node.value[:20])
        self.node = node


class _BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` whose numbers are bounded in length (a 5,000-digit literal is refused at its line
    instead of failing deep in int() with a traceback, or costing seconds of arithmetic)."""


def _bounded(construct: Any) -> Any:
    def checked(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> Any:
        if len(str(node.value)) > MAX_NUMBER_CHARS:
            raise _NumberTooLong(node)
        return construct(loader, node)

    return checked


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _bounded(yaml.SafeLoader.construct_yaml_int))
_BoundedLoader.add_constructor("tag:yaml.org,2002:float", _bounded(yaml.SafeLoader.construct_yaml_float))


def read_yaml_mapping(
    text: str, file: str, *, what: str, hint: str, error: type[ScenarioError] | None = None
) -> tuple[dict[str, Any], dict[Path_, tuple[int, int]], list[Problem]]:
    """Parse ``text`` as one YAML mapping with ``yaml.safe_load`` semantics; return it, the (line, column) of
    every key and item, and the problems found so far (duplicate keys). A syntax error or a non-mapping raises
    ``error`` (default ScenarioError) naming file:line:column; ``what``/``hint`` word the non-mapping case."""
    raise_as = error or ScenarioError
    if len(text) > MAX_YAML_CHARS:  # bounded work for any input: refused before it is parsed
        raise raise_as(
            [
                Problem(
                    file,
                    1,
                    1,
                    f"the file is {len(text):,} characters long, more than the {MAX_YAML_CHARS:,} {what} may have",
                    "split it into several files, or repeat a fault with an every or poisson trigger "
                    "instead of listing each firing",
                )
            ]
        )
    loader: yaml.SafeLoader | None = None
    try:
        loader = _BoundedLoader(text)  # reads the whole text first: a control character fails here
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, column = (mark.line + 1, mark.column + 1) if mark is not None else (1, 1)
        raise raise_as(
            [Problem(file, line, column, f"YAML syntax: {exc.problem or exc}", "check indentation and quoting here")]
        ) from None
    except yaml.reader.ReaderError as exc:  # a control character (NUL, ESC ...): YAML allows none of them
        line, column = _line_column(text, exc.position)
        char = exc.character
        what = f"the control character U+{char:04X}" if isinstance(char, int) else f"the character {char!r}"
        message = f"YAML syntax: {what} is not allowed in YAML"
        raise raise_as(
            [Problem(file, line, column, message, "delete it, or write it as an escape in a quoted string")]
        ) from None
    except _NumberTooLong as exc:
        mark = exc.node.start_mark
        message = f"a number {len(str(exc.node.value))} characters long ({exc}...): no value here needs one"
        raise raise_as(
            [
                Problem(
                    file,
                    mark.line + 1,
                    mark.column + 1,
                    message,
                    f"write a number of at most {MAX_NUMBER_CHARS} characters",
                )
            ]
        ) from None
    except RecursionError:  # nested thousands of levels deep (no scenario is): refused rather than a crash
        raise raise_as([Problem(file, 1, 1, "YAML nests too deeply to read", "flatten the file")]) from None
    finally:
        if loader is not None:
            loader.dispose()
    if not isinstance(data, dict) or node is None:
        raise raise_as([Problem(file, 1, 1, f"{what} must be a YAML mapping", hint)])
    marks: dict[Path_, tuple[int, int]] = {}
    problems: list[Problem] = []
    yaml_positions(node, (), marks, problems, file)
    oversized = [
        Problem(
            file,
            *position(marks, at),
            f"{'.'.join(map(str, at))}: an alias here expands to more than "
            f"{MAX_EXPANDED_VALUES:,} values: no field holds that many",
            "write the value out, without anchors and aliases that repeat each other",
        )
        for at in _oversized(data)
    ]
    if oversized:  # before any model reads the value: a validator that walked or printed it would never finish
        raise raise_as(oversized)
    return data, marks, problems


MAX_EXPANDED_VALUES = 100_000  # a scenario's largest value holds a few hundred; an alias bomb, billions


def _oversized(data: dict[str, Any]) -> list[Path_]:
    """Where a value, aliases expanded, holds more than :data:`MAX_EXPANDED_VALUES` values: the key at which an
    alias of such a value is used (or, for one written out, its deepest such key); at most five. Counted on the
    graph YAML built (an alias is the same object again), so a bomb costs its size in nodes, not in leaves."""
    sizes: dict[int, int] = {}
    refs: dict[int, int] = {}

    def size(node: Any) -> int:
        if not isinstance(node, (dict, list)):
            return 1
        if id(node) not in sizes:
            sizes[id(node)] = 1  # while counting: an alias of itself counts once
            items = [*node.keys(), *node.values()] if isinstance(node, dict) else node
            for item in items:
                if isinstance(item, (dict, list)):
                    refs[id(item)] = refs.get(id(item), 0) + 1
            sizes[id(node)] = min(1 + sum(size(item) for item in items), MAX_EXPANDED_VALUES + 1)
        return sizes[id(node)]

    found: list[Path_] = []

    def walk(node: Any, at: Path_, above: frozenset[int]) -> bool:
        hit = False
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
        for key, value in items:
            if size(value) > MAX_EXPANDED_VALUES and id(value) not in above and len(found) < 5:
                hit = True
                if refs.get(id(value), 0) > 1 or not walk(value, (*at, key), above | {id(value)}):
                    found.append((*at, key))
        return hit

    size(data)
    walk(data, (), frozenset({id(data)}))
    return found


def _line_column(text: str, offset: int) -> tuple[int, int]:
    """1-based (line, column) of character ``offset`` in ``text``."""
    before = text[:offset]
    return before.count("\n") + 1, offset - (before.rfind("\n") + 1) + 1


def decode_text(raw: bytes, file: str, error: type[ScenarioError] | None = None) -> str:
    """``raw`` as UTF-8 (a leading BOM dropped); ``error`` (default ScenarioError) at the file:line:column of
    the first byte that is not UTF-8, so a binary or Latin-1 file is named, not a traceback."""
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        good = raw[: exc.start].decode("utf-8-sig", errors="replace")
        line, column = _line_column(good, len(good))
        problem = Problem(
            file, line, column, f"not UTF-8 text: byte {raw[exc.start]:#04x} here", "save the file as UTF-8"
        )
        raise (error or ScenarioError)([problem]) from None


def position(marks: dict[Path_, tuple[int, int]], path: Path_) -> tuple[int, int]:
    """(line, column) of the deepest part of ``path`` that is in the file; (1, 1) when none is."""
    for depth in range(len(path), -1, -1):
        if path[:depth] in marks:
            return marks[path[:depth]]
    return 1, 1


def nearest(word: str, options: list[str], *, most: int = 1) -> str:
    """A "did you mean ...?" naming up to ``most`` options close to ``word``, best first; "" when none is close."""
    close = difflib.get_close_matches(word, options, n=most, cutoff=0.6)
    return "did you mean " + " or ".join(repr(c) for c in close) + "?" if close else ""


def suggest(word: str, options: list[str], *, most: int = 1) -> str:
    """:func:`nearest`, else the valid keys, else ""."""
    return nearest(word, options, most=most) or ("valid keys: " + ", ".join(options) if options else "")


# ---------------------------------------------------------------------------------------------------------
# From a pydantic error location to the file and to the model.


def _raw_path(data: object, loc: tuple[str | int, ...], kind: str = "") -> Path_:
    """Map a pydantic error location onto the YAML data, dropping union tags that are not real keys (a member
    such as ``kill`` or ``torchrun`` on the way, or ``str``/``BodyFile`` where a value matched no member)."""
    path: list[str | int] = []
    node = data
    for index, part in enumerate(loc):
        last = index == len(loc) - 1
        if isinstance(node, dict) and part in node:
            path.append(part)
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            path.append(part)
            node = node[part]
        elif isinstance(part, str) and (not last or not isinstance(node, dict) or (kind != "missing" and _tag(part))):
            continue  # a union tag: not a key in the file
        else:
            path.append(part)  # a missing key: named in the message, positioned at its parent
            break
    return tuple(path)


_SCALAR_TAGS = {"str", "int", "float", "bool", "none", "bytes", "list", "dict"}


def _tag(part: str) -> bool:
    """Whether a location's last part names a union member (``str``, ``BodyFile``, ``literal['a']``,
    ``function-after[...]``) rather than a field (fields are snake_case words)."""
    return part in _SCALAR_TAGS or part[:1].isupper() or any(c in part for c in "[]-'")


def without_union_noise(errors: list[dict[str, Any]], data: object) -> list[dict[str, Any]]:
    """pydantic's errors with the noise of unions removed: when a value matched no member of a union, one
    error per member. Where one member's error lies deeper in the value (it has that member's shape), the
    others are dropped; otherwise the members' errors at one key become one ("... or ...")."""
    paths = [_raw_path(data, tuple(e["loc"]), e["type"]) for e in errors]
    tagged = [len(p) < len(e["loc"]) and e["type"] != "missing" for p, e in zip(paths, errors, strict=True)]
    kept: list[dict[str, Any]] = []
    merged: dict[Path_, dict[str, Any]] = {}
    for error, path, tag in zip(errors, paths, tagged, strict=True):
        if not tag:
            kept.append(error)
            continue
        if any(len(other) > len(path) and other[: len(path)] == path for other in paths):
            continue  # a deeper error explains this value: this member was not the one meant
        if path in merged:
            first = merged[path]
            first["msg"] = f"{first['msg']}, or {error['msg'][0].lower()}{error['msg'][1:]}"
            first["type"] = "union_mismatch"
            continue
        merged[path] = dict(error)
        kept.append(merged[path])
    return kept


def _unwrap(annotation: Any) -> list[Any]:
    """The concrete types inside Optional/Union/Annotated/list/dict annotations."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _unwrap(get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        return [t for arg in get_args(annotation) for t in _unwrap(arg)]
    return [annotation]


def _models_at(root: type[BaseModel], loc: tuple[str | int, ...]) -> list[type[BaseModel]]:
    """Walk a model along a pydantic error location; returns the models that may own the last key (several
    where the location ends on a union, such as a fault whose type is wrong)."""
    current: Any = root
    for part in loc:
        if isinstance(part, int):
            continue
        candidates = _unwrap(current)
        next_type: Any = None
        for candidate in candidates:
            if get_origin(candidate) in (list, dict):
                candidate_args = get_args(candidate)
                candidates.extend(_unwrap(candidate_args[-1]))
                continue
            if isinstance(candidate, type) and issubclass(candidate, BaseModel):
                if part in candidate.model_fields:
                    next_type = candidate.model_fields[part].annotation
                    break
                tag = candidate.model_fields.get("type")
                if tag is not None and get_origin(tag.annotation) is Literal and part in get_args(tag.annotation):
                    next_type = candidate
                    break
        if next_type is None:
            return [c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)]
        current = next_type
    candidates = _unwrap(current)
    for candidate in list(candidates):
        if get_origin(candidate) in (list, dict):
            candidates.extend(_unwrap(get_args(candidate)[-1]))
    return [c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)]


def _model_at(root: type[BaseModel], loc: tuple[str | int, ...]) -> type[BaseModel] | None:
    """The one model owning the last key of a pydantic error location; None when none or several may."""
    owners = _models_at(root, loc)
    return owners[0] if len(owners) == 1 else None


def _type_tags(root: type[BaseModel], loc: tuple[str | int, ...]) -> list[str]:
    """The ``type`` values the union at ``loc`` accepts (each member's ``type: Literal[...]``)."""
    tags: list[str] = []
    for model in _models_at(root, loc):
        tag = model.model_fields.get("type")
        if tag is not None and get_origin(tag.annotation) is Literal:
            tags.extend(str(t) for t in get_args(tag.annotation))
    return tags


def _field_at(root: type[BaseModel], loc: tuple[str | int, ...]) -> FieldInfo | None:
    """The field a pydantic error location ends on (None for a list item, a tag, or an unknown key)."""
    if not loc or not isinstance(loc[-1], str):
        return None
    owner = _model_at(root, loc[:-1])
    return owner.model_fields.get(loc[-1]) if owner is not None else None


# ---------------------------------------------------------------------------------------------------------
# Wording: what would be valid, and what was given.

DURATION_FORMS = "a duration like 30s, 2m, 1.5h"
# Every Signals name is accepted; the common ones are listed first, the rest stand behind "...".
_COMMON_SIGNALS = ("SIGKILL", "SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGSTOP", "SIGCONT", "SIGUSR1", "SIGUSR2")
SIGNAL_FORMS = "one of " + ", ".join(_COMMON_SIGNALS) + ", ... or a signal number"


def _annotation_metadata(annotation: Any) -> Iterator[object]:
    """The ``Annotated`` metadata anywhere inside ``annotation`` (``Duration | None`` keeps it one level down)."""
    origin = get_origin(annotation)
    if origin is Annotated:
        base, *metadata = get_args(annotation)
        yield from metadata
        yield from _annotation_metadata(base)
    elif origin in (Union, types.UnionType):
        for arg in get_args(annotation):
            yield from _annotation_metadata(arg)


def _is_duration(field: FieldInfo) -> bool:
    metadata = [*field.metadata, *_annotation_metadata(field.annotation)]
    return any(isinstance(m, BeforeValidator) and m.func is parse_duration for m in metadata)


def _parses(parse: Any, value: object) -> bool:
    try:
        parse(value)
    except (ValueError, TypeError, KeyError):
        return False
    return True


def _got(value: object) -> str:
    """``value`` as the message's "(got ...)", short: the file has the whole of a long mapping or list."""
    return short_repr(value)


def _invalid_value(error: dict[str, Any], where: str, field: FieldInfo | None) -> tuple[str, str]:
    """(message, hint) for a value of the wrong type or form: what would be valid there, and what was given."""
    kind = error["type"]
    given = error.get("input")
    ctx = error.get("ctx") or {}
    message = str(error["msg"]).removeprefix("Value error, ")
    if kind in ("literal_error", "enum"):
        options = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
        hint = nearest(given, options) if isinstance(given, str) else ""
        return f"{where}: expected one of {', '.join(options)} (got {_got(given)})", hint
    if kind == "value_error" and isinstance(ctx.get("error"), NonFiniteDuration):
        return f"{where}: {message}", ""  # the message says what is wrong with nan/inf; "not a duration" would not
    if kind == "value_error" and field is not None and _is_duration(field) and not _parses(parse_duration, given):
        return f"{where}: expected {DURATION_FORMS} (got {_got(given)}, not a duration)", ""
    if kind == "value_error" and where.rsplit(".", 1)[-1] == "signal" and isinstance(given, str):
        # Compared without the "SIG" every name shares, which would make any SIG-word look close.
        hint = nearest(given.upper().removeprefix("SIG"), [name[3:] for name in signal.Signals.__members__])
        hint = re.sub(r"'(\w+)'", r"'SIG\1'", hint)
        return f"{where}: expected {SIGNAL_FORMS} (got {_got(given)})", hint
    scalar = given is None or isinstance(given, (str, int, float, bool))
    if scalar and kind != "value_error":  # a validator's own message names what it got; a type error does not
        return f"{where}: {message} (got {_got(given)})", ""
    return f"{where}: {message}", ""


def _node_at(data: object, path: Path_) -> object:
    """The YAML value at ``path`` (None when the path leaves the data)."""
    for part in path:
        if isinstance(data, dict) and part in data:
            data = data[part]
        elif isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data):
            data = data[part]
        else:
            return None
    return data


def problem_for(
    error: dict[str, Any], data: object, marks: dict[Path_, tuple[int, int]], file: str, model: type[BaseModel]
) -> Problem:
    """One pydantic ``error`` of validating ``data`` (read from ``file``, keys at ``marks``) against ``model``,
    as a Problem at the key it is about, naming what would be valid there and, when known, the nearest fix."""
    loc: tuple[str | int, ...] = tuple(error["loc"])
    path = _raw_path(data, loc, error["type"])
    where = ".".join(str(p) for p in path) or "(top level)"
    kind = error["type"]
    hint = ""
    at = path
    if kind == "extra_forbidden":
        key = str(loc[-1])
        owner = _model_at(model, loc[:-1])
        options = sorted(owner.model_fields) if owner is not None else []
        message = f"unknown key {key!r} in {'.'.join(str(p) for p in path[:-1]) or 'the scenario'}"
        hint = suggest(key, options)
    elif kind == "missing":
        message = f"missing required key {str(loc[-1])!r} (at {'.'.join(str(p) for p in path[:-1]) or 'top level'})"
        hint = f"add {loc[-1]}: <value>"
    elif kind in ("union_tag_invalid", "union_tag_not_found"):
        expected = _type_tags(model, loc)
        given = str(error.get("ctx", {}).get("tag", ""))
        message = f"{where}: unknown type {given!r}" if given else f"{where}: missing 'type'"
        hint = nearest(given, expected, most=3) or "use one of: " + ", ".join(expected)
        at = (*path, "type")  # the `type:` line is the one to fix, not the first key of the mapping
        if not given:
            hint = "set type to one of: " + ", ".join(expected)
            node = _node_at(data, path)
            typo = nearest("type", [str(k) for k in node]) if isinstance(node, dict) else ""
            if typo:  # `tpye: kill`: name the misspelt key, which the missing tag hides from the model
                key = typo.split("'")[1]
                message += f"; {key!r} is not a key"
                hint = f"rename {key!r} to 'type'"
                at = (*path, key)
    else:
        message, hint = _invalid_value(error, where, _field_at(model, loc))
    return Problem(file, *position(marks, at), message, hint)
