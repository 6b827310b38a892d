"""Fuzz the front door: every shipped scenario, mutated (wrong types, deleted and misspelt
keys, junk strings, truncated text, duplicated lines, stray characters), goes through what `mlchaos validate`
runs. Each result is a clean load or problems that name this file, a line and a column (exit 2 through the
CLI), never a traceback; and a mutation that can only be nonsense (a misspelt key of a strict model, a number
turned into a boolean, a word, a list, NaN or infinity) is never silently accepted.

Defects this found and pins: a NUL or other control character, and a file that is not UTF-8, crashed
`validate` with a traceback; an alias of itself (``a: &x [*x]``) recursed until the interpreter gave up; a
boolean was taken as a number (``nproc_per_node: true`` ran 1 rank) and ``.inf``/``.nan`` as floats
(``load.rate: .inf``). The explicit cases below pin the nonsense values the models refuse now.
"""

from __future__ import annotations

import copy
import math
import os
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, model_validator
from support import SCENARIOS
from typer.testing import CliRunner

from chaos.cli.commands import app
from chaos.cli.preflight import check_files
from chaos.plugins import registry
from chaos.spec.problems import Problem
from chaos.spec.scenario import ScenarioError, json_schema, parse_scenario, scenario_model

FILES = sorted(SCENARIOS.glob("*.yaml"))
TEXTS = {path.name: path.read_text(encoding="utf-8") for path in FILES}
DATA = {name: yaml.safe_load(text) for name, text in TEXTS.items()}
FREE_KEYS = {"env", "headers", "priorities", "roles"}  # mappings whose keys are the user's own names, not fields
ARGV = {"args", "command"}  # argv items: YAML numbers become strings there, by design
ANY_JSON = {"value"}  # degraded: {json: ..., value: <any JSON>}
# ~60 s for the three fuzz tests on a 2-core machine; MLCHAOS_FUZZ_EXAMPLES raises it for a longer hunt.
EXAMPLES = int(os.environ.get("MLCHAOS_FUZZ_EXAMPLES", "1500"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)


def _field_names(schema: Any) -> set[str]:
    """Every property name in the scenario's JSON Schema: a misspelling that lands on one may be valid."""
    found: set[str] = set()
    if isinstance(schema, dict):
        if isinstance(schema.get("properties"), dict):
            found.update(schema["properties"])
        for value in schema.values():
            found |= _field_names(value)
    elif isinstance(schema, list):
        for item in schema:
            found |= _field_names(item)
    return found


FIELDS = _field_names(json_schema())


def _paths(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every mapping key and list item below ``node``, as a path of keys and indexes."""
    out: list[tuple[Any, ...]] = []
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
    for key, value in items:
        out.append((*path, key))
        out.extend(_paths(value, (*path, key)))
    return out


def _get(data: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        data = data[part]
    return data


def _judge(tmp_path: Path, name: str, text: str) -> list[Problem]:
    """What `mlchaos validate --no-probe` does with the file, and the checks every outcome must pass."""
    path = tmp_path / name
    path.write_bytes(text.encode("utf-8", errors="surrogatepass"))
    checked = check_files([path], hosts=True)
    lines = text.count("\n") + 2
    for problem in checked.problems:
        assert problem.file == str(path), problem
        assert 1 <= problem.line <= lines and problem.column >= 1, problem
        assert problem.message.strip() and str(problem).startswith(f"{path}:{problem.line}:{problem.column}: ")
    assert bool(checked.problems) != bool(checked.scenarios), "a file is either loaded or refused"
    return checked.problems


WRONG = st.sampled_from([True, False, None, "", "zzz!", "  ", -1, 0, 10**12, 1.5, -2.5, [], [1], {}, {"a": 1}])
NONSENSE_FOR_NUMBERS = st.sampled_from([True, False, "zzz!", [1], {"a": 1}, math.nan, math.inf, -math.inf])
# A shipped scenario's name and a copy of its parsed YAML for a test to mutate.
SHIPPED = st.sampled_from(sorted(DATA)).map(lambda name: (name, copy.deepcopy(DATA[name])))


@FUZZ
@given(st.data())
def test_a_value_of_the_wrong_type_is_loaded_or_refused_at_its_line(tmp_path_factory: Any, data: Any) -> None:
    name, tree = data.draw(SHIPPED)
    path = data.draw(st.sampled_from(_paths(tree)))
    original = _get(tree, path)
    numeric = isinstance(original, (int, float)) and not isinstance(original, bool)
    new = data.draw(NONSENSE_FOR_NUMBERS if numeric and data.draw(st.booleans()) else WRONG)
    _get(tree, path[:-1])[path[-1]] = new
    problems = _judge(tmp_path_factory.mktemp("t"), name, yaml.safe_dump(tree, sort_keys=False))
    exempt = ARGV | ANY_JSON
    not_a_number = isinstance(new, (bool, list, dict)) or new in ("zzz!", "", "  ")
    if numeric and (not_a_number or (isinstance(new, float) and not math.isfinite(new))):
        if not exempt & {p for p in path if isinstance(p, str)}:
            assert problems, f"{name}: {'.'.join(map(str, path))} = {new!r} (was {original!r}) was accepted"


@FUZZ
@given(st.data())
def test_a_deleted_or_misspelt_key_is_loaded_or_refused_at_its_line(tmp_path_factory: Any, data: Any) -> None:
    name, tree = data.draw(SHIPPED)
    keys = [p for p in _paths(tree) if isinstance(p[-1], str)]
    path = data.draw(st.sampled_from(keys))
    parent = _get(tree, path[:-1])
    key = path[-1]
    value = parent.pop(key)
    misspell = data.draw(st.booleans())
    if misspell:
        i = data.draw(st.integers(0, len(key) - 1))
        typo = data.draw(
            st.sampled_from(
                [key[:i] + key[i + 1 :], key[:i] + key[i] + key[i:], key[:i] + "x" + key[i + 1 :], key + "s"]
            )
        )
        if not typo or typo in parent:
            return
        parent[typo] = value
    problems = _judge(tmp_path_factory.mktemp("t"), name, yaml.safe_dump(tree, sort_keys=False))
    owner = path[-2] if len(path) > 1 else None
    if misspell and owner not in FREE_KEYS and typo not in FIELDS:
        assert problems, f"{name}: the misspelt key {typo!r} (for {key!r}) was accepted"
        # Named, or (a union told apart by which key is there, e.g. served_by: {header|json}) its owner refused.
        owner_path = ".".join(map(str, path[:-1]))
        assert any(repr(typo) in p.message or p.message.startswith(owner_path + ":") for p in problems), problems


JUNK = [
    "\x00",
    "\x1b",
    "\t",
    ":",
    "- ",
    "{",
    "}",
    "[",
    "]",
    "&a ",
    "*a",
    "!!python/object:os.system ",
    "'",
    '"',
    "#",
    "%",
    "@",
    "\\",
    "\u2028",
    "é",
    "🙂",
    "\ufeff",
    "---\n",
]


@FUZZ
@given(st.sampled_from(sorted(TEXTS)), st.data())
def test_junk_truncation_and_duplicated_lines_never_crash(tmp_path_factory: Any, name: str, data: Any) -> None:
    text = TEXTS[name]
    how = data.draw(st.sampled_from(["truncate", "junk", "duplicate", "delete line"]))
    lines = text.splitlines(keepends=True)
    if how == "truncate":
        text = text[: data.draw(st.integers(0, len(text)))]
    elif how == "junk":
        at = data.draw(st.integers(0, len(text)))
        text = text[:at] + data.draw(st.sampled_from(JUNK) | st.text(max_size=8)) + text[at:]
    else:
        i = data.draw(st.integers(0, len(lines) - 1))
        lines[i : i + 1] = [lines[i], lines[i]] if how == "duplicate" else []
        text = "".join(lines)
    _judge(tmp_path_factory.mktemp("t"), name, text)


def test_bytes_that_are_not_utf8_are_refused_at_their_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(TEXTS["kill-rank.yaml"].replace("SIGKILL one rank", "SIGKILL caf\xe9 rank").encode("latin-1"))
    checked = check_files([path])
    [problem] = checked.problems
    assert str(problem).startswith(f"{path}:1:") and "not UTF-8 text: byte 0xe9" in problem.message


@pytest.mark.parametrize("mutation", ["truncate", "nul", "alias of itself", "bool for a number", "misspelt key"])
def test_the_cli_exits_2_with_file_and_line_never_a_traceback(tmp_path: Path, mutation: str) -> None:
    text = TEXTS["kill-rank.yaml"]
    text = {
        "truncate": text[: text.index("checks:") + 20],
        "nul": text.replace("seed: 1234", "seed: 12\x0034"),
        "alias of itself": text.replace("seed: 1234", "seed: &s [*s]"),
        "bool for a number": text.replace("nproc_per_node: 2", "nproc_per_node: true"),
        "misspelt key": text.replace("max_restarts:", "max_restart:"),
    }[mutation]
    path = tmp_path / "mutated.yaml"
    path.write_text(text, encoding="utf-8")
    result = CliRunner().invoke(app, ["validate", "--no-probe", str(path)])
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert f"{path}:" in result.output and "Traceback" not in result.output, result.output


# ---------------------------------------------------------------------------------------------------------
# Nonsense values that must be refused, each at its own line (what the fuzz cannot tell from a valid value).

BASE = """\
name: nonsense
target:
  type: torchrun
  module: chaos.reference.trainer
  nproc_per_node: 2
  rdzv_port: 29400
  env: {OMP_NUM_THREADS: "1"}
faults:
  - name: k
    type: kill
    params: {rank: 1}
    trigger: {at_step: 5, rank: 1}
checks:
  - {type: completes}
safety: {max_duration: 60s, no_progress_timeout: 30s}
"""

# The lines of BASE that several cases below replace.
TRIGGER = "trigger: {at_step: 5, rank: 1}"
PARAMS = "params: {rank: 1}"
KILL = f"type: kill\n    {PARAMS}"
PORT = "rdzv_port: 29400"

# (id, the text replaced in BASE, the text put in its place, words the refusal says)
NONSENSE = [
    ("a negative step", TRIGGER, "trigger: {at_step: -1}", "at_step"),
    ("a negative rank", TRIGGER, "trigger: {at_step: 5, rank: -1}", "rank"),
    ("a rank beyond the world", PARAMS, "params: {rank: 2}", "rank 2 does not exist"),
    ("zero ranks", "nproc_per_node: 2", "nproc_per_node: 0", "nproc_per_node"),
    ("a boolean for a count", "nproc_per_node: 2", "nproc_per_node: true", "got the boolean True"),
    ("a port out of range", PORT, "rdzv_port: 70000", "rdzv_port"),
    ("port 0 to rendezvous on", PORT, "rdzv_port: 0", "rdzv_port"),
    ("an empty scenario name", "name: nonsense", 'name: ""', "name"),
    ("an empty module", "module: chaos.reference.trainer", 'module: ""', "module"),
    ("a module that is no module name", "module: chaos.reference.trainer", "module: not a module", "module"),
    ("an env name with =", 'env: {OMP_NUM_THREADS: "1"}', 'env: {"A=B": "1"}', "not an environment variable"),
    ("an empty env name", 'env: {OMP_NUM_THREADS: "1"}', 'env: {"": "1"}', "not an environment variable"),
    ("an every trigger firing no times", TRIGGER, "trigger: {every: {interval: 1s, count: 0}}", "count"),
    ("an event kind that is empty", TRIGGER, 'trigger: {on_event: {kind: ""}}', "kind"),
    ("a fault lasting no time", TRIGGER, f"{TRIGGER}\n    duration: 0s", "duration"),
    ("a progress watch of zero", "no_progress_timeout: 30s", "no_progress_timeout: 0", "no_progress_timeout"),
    ("an infinite limit", "max_duration: 60s", "max_duration: .inf", "finite"),
    ("an empty abort_on kind", "no_progress_timeout: 30s}", 'no_progress_timeout: 30s, abort_on: [""]}', "abort_on"),
    (
        "a blast radius of zero",
        "no_progress_timeout: 30s}",
        "no_progress_timeout: 30s, blast_radius: 0}",
        "blast_radius",
    ),
    ("an empty protected host", "faults:", 'cluster: {protected: [""]}\nfaults:', "protected"),
    ("an empty host name", TRIGGER, f'{TRIGGER}\n    hosts: {{host: ""}}', "host"),
    (
        "a host both selected and excluded",
        TRIGGER,
        "trigger: {at_step: 5}\n    hosts: {host: h1, exclude: [h1]}",
        "both selected and excluded",
    ),
    (
        "a log matcher that is no regex",
        PORT,
        f'{PORT}\n  matchers: [{{pattern: "(", event: detect.x}}]',
        "not a valid regex",
    ),
    ("no monitor interval", PORT, f"{PORT}\n  monitor_interval: 0", "monitor_interval"),
    ("negative restarts", PORT, f"{PORT}\n  max_restarts: -1", "max_restarts"),
    (
        "a bit-flip probability above 1",
        KILL,
        "type: bitflip\n    params: {persistence: intermittent, probability: 1.5}",
        "probability",
    ),
    ("a NaN scale factor", KILL, "type: bitflip\n    params: {kind: scale, factor: .nan}", "finite"),
    ("an empty process name regex", PARAMS, 'params: {name: ""}', "name"),
]
SERVING = """\
name: nonsense
target:
  type: serving
  primary: {model: primary, port: 0}
  shedding: {priorities: [premium, free], header: X-Priority}
load:
  rate: 100
  duration: 5s
  priorities: {premium: 0.2, free: 0.8}
checks:
  - {type: error_rate, params: {max: 0.01}}
"""
NONSENSE_SERVING = [
    ("an infinite load rate", "rate: 100", "rate: .inf", "finite"),
    ("a negative load rate", "rate: 100", "rate: -5", "rate"),
    ("an unnamed priority", "priorities: {premium: 0.2, free: 0.8}", 'priorities: {"": 1}', "needs a name"),
    ("a priority listed twice", "priorities: [premium, free]", "priorities: [premium, premium]", "listed twice"),
    ("a header name with a space", "header: X-Priority", "header: X Priority", "header"),
    ("a replica port out of range", "port: 0}", "port: 65536}", "port"),
    ("an error rate above 1", "max: 0.01", "max: 1.5", "max"),
    ("an empty body file", "duration: 5s", "duration: 5s\n  body: {file: ''}", "file needs a path"),
]


@pytest.mark.parametrize(
    ("base", "old", "new", "says"),
    [(BASE, *case[1:]) for case in NONSENSE] + [(SERVING, *case[1:]) for case in NONSENSE_SERVING],
    ids=[case[0] for case in NONSENSE + NONSENSE_SERVING],
)
def test_a_nonsense_value_is_refused_at_its_line(tmp_path: Path, base: str, old: str, new: str, says: str) -> None:
    assert old in base
    text = base.replace(old, new, 1)
    line = text[: text.index(new)].count("\n") + 1
    problems = _judge(tmp_path, "nonsense.yaml", text)
    assert problems, f"accepted: {new!r}"
    assert any(says in p.message and line <= p.line <= line + new.count("\n") for p in problems), problems
    assert _judge(tmp_path, "base.yaml", base) == [], "the base itself must be valid"


class _BuggyParams(BaseModel):
    """A third party's params whose validator raises TypeError on a list (the bug bitflip's `where` had)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    where: str = "weights"

    @model_validator(mode="before")
    @classmethod
    def _lookup(cls, data: Any) -> Any:
        if isinstance(data, dict):
            table: dict[Any, int] = {"weights": 1}
            table.get(data.get("where"))  # an unhashable list -> TypeError, not a ValueError
        return data


class _BuggyInjector:
    name: ClassVar[str] = "buggy"
    Params: ClassVar[type[BaseModel]] = _BuggyParams
    summary: ClassVar[str] = "a plugin with a validator bug"


def test_a_plugin_validator_that_crashes_is_named_at_its_fault_not_a_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    real = registry.injectors()
    monkeypatch.setattr(registry, "injectors", lambda: {**real, "buggy": _BuggyInjector})
    scenario_model.cache_clear()
    try:
        text = "name: t\ntarget: {type: command, command: [a]}\nfaults:\n  - type: buggy\n    params: {where: [1]}\n"
        text += "    trigger: {after: 1s}\nchecks: [{type: completes}]\n"
        with pytest.raises(ScenarioError) as info:
            parse_scenario(text, "x.yaml")
        [problem] = info.value.problems
        assert str(problem).startswith("x.yaml:5:5: faults.0.params: its buggy validator failed (TypeError:"), problem
    finally:
        scenario_model.cache_clear()


_BOMB = "x-bomb:\n  - &b0 [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"  - &b{i} [{', '.join([f'*b{i - 1}'] * 9)}]\n" for i in range(1, 9)
)  # a few hundred bytes, 9**8 leaves if anything walked or printed the whole value
HOSTILE = ["*b8", "9" * 5000, "-" + "1" * 4400, "1e999", "1" * 70, "100000000"]


@settings(max_examples=min(EXAMPLES, 200), deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(st.sampled_from(sorted(DATA)), st.data())
def test_a_hostile_value_in_any_field_is_refused_or_loaded_without_a_traceback(
    tmp_path_factory: Any, name: str, data: Any
) -> None:
    # An alias bomb, a number thousands of digits long, an overflowing float, a count of a hundred million (an
    # every/poisson count, a rank, a size): anywhere a value sits, the front door answers, at a line, in bounded
    # work (the bounds themselves are measured in tests/unit/test_scenario_bounds.py).
    tree = copy.deepcopy(DATA[name])
    leaves = [p for p in _paths(tree) if not isinstance(_get(tree, p), (dict, list))]
    path = data.draw(st.sampled_from(leaves))
    hostile = data.draw(st.sampled_from(HOSTILE))
    _get(tree, path[:-1])[path[-1]] = "HOSTILE_VALUE"
    text = yaml.safe_dump(tree, sort_keys=False).replace("HOSTILE_VALUE", hostile)
    problems = _judge(tmp_path_factory.mktemp("t"), name, (_BOMB if hostile == "*b8" else "") + text)
    if hostile == "*b8" or len(hostile) > 64:
        assert problems, f"{name}: {'.'.join(map(str, path))} = {hostile[:20]}... was accepted"
        assert all(len(str(p)) < 2000 for p in problems), "a problem quoted the whole value"
