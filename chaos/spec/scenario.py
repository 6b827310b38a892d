"""The scenario: typed, frozen, loaded from YAML with file:line:column in every error.

A scenario says where the job runs (``cluster``), what it is (``target``), which faults hit it and when
(``faults`` with ``trigger`` and ``duration``), what must hold (``checks``) and the run's guard rails
(``safety``). Each injector and check contributes its own params model through the registry, so the full
schema (and editor completion through ``mlchaos schema``) is built from whatever is installed; adding an
injector never edits this file.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import types
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    SerializeAsAny,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)

from chaos.plugins import registry
from chaos.spec.load import ScenarioLoad
from chaos.spec.serving import ServingTarget
from chaos.spec.targets import HttpTarget
from chaos.spec.units import Duration

_STRICT = ConfigDict(extra="forbid", frozen=True)


def _stringify(value: object) -> object:
    """YAML turns ``--steps 60`` arguments into ints; argv wants strings, so scalars become str."""
    if isinstance(value, list):
        return [str(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v for v in value]
    return value


Argv = Annotated[list[str], BeforeValidator(_stringify)]


class EveryTrigger(BaseModel):
    """Fire ``count`` times, every ``interval``, the first at ``start`` (default: one interval in)."""

    model_config = _STRICT
    interval: Duration = Field(gt=0)
    count: int = Field(ge=1)
    start: Duration | None = None


class PoissonTrigger(BaseModel):
    """Fire ``count`` times with exponential gaps of mean ``mtbf`` (seeded: replays exactly)."""

    model_config = _STRICT
    mtbf: Duration = Field(gt=0)
    count: int = Field(ge=1)
    start: Duration = 0.0


class EventTrigger(BaseModel):
    """Fire when the ``nth`` event whose kind matches ``kind`` (a glob) arrives, optionally on one rank."""

    model_config = _STRICT
    kind: str
    nth: int = Field(default=1, ge=1)
    rank: int | None = None


class Trigger(BaseModel):
    """When a fault fires. Exactly one of ``after``, ``at_step``, ``on_event``, ``every``, ``poisson``."""

    model_config = _STRICT
    after: Duration | None = Field(
        default=None, description="seconds after the target starts (a serving/http target: after it is ready)"
    )
    at_step: int | None = Field(default=None, ge=0, description="when a rank reports this training step")
    rank: int | None = Field(default=None, description="with at_step: the rank whose step counts")
    on_event: EventTrigger | None = None
    every: EveryTrigger | None = None
    poisson: PoissonTrigger | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> Trigger:
        chosen = [k for k in ("after", "at_step", "on_event", "every", "poisson") if getattr(self, k) is not None]
        if len(chosen) != 1:
            raise ValueError(
                "a trigger needs exactly one of after, at_step, on_event, every, poisson"
                + (f" (got {', '.join(chosen)})" if chosen else "")
            )
        if self.rank is not None and self.at_step is None:
            raise ValueError("rank belongs with at_step (on_event has its own rank)")
        return self

    @property
    def kind(self) -> str:
        for key in ("after", "at_step", "on_event", "every", "poisson"):
            if getattr(self, key) is not None:
                return key
        raise AssertionError("validated trigger has no kind")


class HostSelector(BaseModel):
    """Which hosts a fault hits: one ``host`` by name, the host running training ``rank`` (a multi-node
    target, resolved when the fault fires), or ``count`` hosts of a ``group`` (default: all), never those in
    ``exclude``. ``count`` None takes every candidate; fewer are drawn with the run's rng."""

    model_config = _STRICT
    host: str | None = None
    rank: int | None = Field(default=None, ge=0, description="the host that runs this rank of a multi-node target")
    group: str | None = None
    count: int | None = Field(default=None, ge=1)
    exclude: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _host_or_group(self) -> HostSelector:
        given = [key for key in ("host", "rank", "group") if getattr(self, key) is not None]
        if len(given) > 1:
            raise ValueError(f"give one of host, rank or group, not {' and '.join(given)}")
        if (self.host is not None or self.rank is not None) and self.count not in (None, 1):
            raise ValueError("count makes no sense with a single host")
        return self


class FaultSpec(BaseModel):
    """One fault: an injector ``type`` with its ``params``, a ``trigger`` and an optional ``duration``."""

    model_config = _STRICT
    name: str = Field(default="", pattern=r"^[A-Za-z0-9_.-]*$", description="unique; default <type>-<n>")
    type: str
    params: SerializeAsAny[BaseModel]
    trigger: Trigger
    duration: Duration | None = Field(default=None, description="how long the fault lasts before heal")
    hosts: HostSelector | None = Field(
        default=None, description="inventory hosts the fault is applied on (null: the harness's own host)"
    )


class CheckSpec(BaseModel):
    """One assertion: a check ``type`` with its ``params``; ``name`` labels it in reports."""

    model_config = _STRICT
    name: str = ""
    type: str
    params: SerializeAsAny[BaseModel]


class LogMatcherSpec(BaseModel):
    """A regex over the target's output; a match becomes an event of kind ``event`` (named groups -> data)."""

    model_config = _STRICT
    pattern: str
    event: str = Field(pattern=r"^[a-z_]+(\.[a-z0-9_*]+)+$")


class TorchrunTarget(BaseModel):
    """A job launched by torchrun: a module (``-m``) or a script, N ranks per node, M restarts.

    Without ``nodes`` it is one node on this host (``--standalone``). With ``nodes`` (a host selector over
    the inventory) every selected host runs one torchrun agent over SSH, joined by a c10d rendezvous on the
    first selected host at ``rdzv_port``."""

    model_config = _STRICT
    type: Literal["torchrun"]
    module: str | None = None
    script: str | None = None
    args: Argv = []
    nproc_per_node: int = Field(default=2, ge=1)
    max_restarts: int = Field(default=3, ge=0)
    monitor_interval: Duration = 0.5
    nodes: HostSelector | None = Field(
        default=None, description="inventory hosts that each run one torchrun agent (null: this host only)"
    )
    rdzv_port: int = Field(default=29400, ge=1, le=65535, description="c10d rendezvous port on the first node")
    env: dict[str, str] = {}
    matchers: list[LogMatcherSpec] = []

    @model_validator(mode="after")
    def _module_or_script(self) -> TorchrunTarget:
        if (self.module is None) == (self.script is None):
            raise ValueError("a torchrun target needs exactly one of module or script")
        if self.nodes is not None and self.nodes.rank is not None:
            raise ValueError("nodes selects the hosts that run the job: use host, group, count or exclude, not rank")
        return self


class CommandTarget(BaseModel):
    """Any command; its output lines become events through ``matchers``."""

    model_config = _STRICT
    type: Literal["command"]
    command: Argv = Field(min_length=1)
    env: dict[str, str] = {}
    matchers: list[LogMatcherSpec] = []


TargetSpec = Annotated[TorchrunTarget | CommandTarget | ServingTarget | HttpTarget, Discriminator("type")]
ADDRESSED_TARGETS = (ServingTarget, HttpTarget)  # targets with an address a load's URL path is sent to


class ClusterSpec(BaseModel):
    """Where faults land: this machine, plus the hosts of an SSH inventory (``mlchaos testbed up`` writes one
    for a local testbed; a staging cluster's has the same format). ``--inventory`` overrides ``inventory``."""

    model_config = _STRICT
    transport: Literal["local", "ssh"] = "local"
    inventory: str | None = Field(default=None, description="inventory YAML (path relative to the scenario)")
    protected: list[str] = Field(default=[], description="hosts no fault may ever select")


class SafetySpec(BaseModel):
    """Guard rails: the run is ended (and healed) when any is crossed."""

    model_config = _STRICT
    max_duration: Duration = Field(default=300.0, gt=0, description="hard limit on the whole run")
    no_progress_timeout: Duration | None = Field(
        default=90.0, description="end the run when no target.step arrives for this long (null: never)"
    )
    heal_grace: Duration = Field(default=5.0, description="dead-man fires this long after a fault's duration")
    blast_radius: int | None = Field(default=None, ge=1, description="most faults active at once")
    abort_on: list[str] = Field(default=[], description="event kinds (globs) that end the run at once")


class Scenario(BaseModel):
    """A whole scenario. Instances come from :func:`load_scenario` (or :func:`parse_scenario`)."""

    model_config = _STRICT
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    description: str = ""
    seed: int = 0
    cluster: ClusterSpec = ClusterSpec()
    target: TargetSpec
    load: ScenarioLoad | None = Field(
        default=None, description="HTTP load driven at the target while faults hit it (serving scenarios)"
    )
    faults: list[FaultSpec] = []
    checks: list[CheckSpec] = []
    safety: SafetySpec = SafetySpec()
    allow_unknown: bool = Field(default=False, description="treat unknown check verdicts as passing")

    @field_validator("load")
    @classmethod
    def _load_has_an_address(cls, load: ScenarioLoad | None, info: ValidationInfo) -> ScenarioLoad | None:
        target = info.data.get("target")  # declared before load, so validated first (absent if it failed)
        if load is not None and load.url.startswith("/") and target is not None:
            if not isinstance(target, ADDRESSED_TARGETS):
                raise ValueError(
                    f"url {load.url!r} is a path, but a {target.type} target has no address: give a full http:// URL"
                )
        return load

    def fault(self, name: str) -> FaultSpec:
        for spec in self.faults:
            if spec.name == name:
                return spec
        raise KeyError(name)

    def without_faults(self) -> Scenario:
        """The same job with no faults and no checks: the golden (fault-free) run."""
        return self.model_copy(update={"faults": [], "checks": []})

    def golden_key(self) -> str:
        """Hash of what determines a fault-free result: the target and the seed."""
        payload = json.dumps({"target": self.target.model_dump(mode="json"), "seed": self.seed}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------------------
# Building the full model from the registry.


@cache
def scenario_model() -> type[Scenario]:
    """The Scenario model whose faults and checks are discriminated unions of every registered params model."""
    fault_models = [
        create_model(
            f"Fault_{name}",
            __base__=FaultSpec,
            __doc__=cls.summary,
            type=(Literal[name], ...),  # type: ignore[arg-type]
            params=(cls.Params, ...),
        )
        for name, cls in registry.injectors().items()
    ]
    check_models = [
        create_model(
            f"Check_{name}",
            __base__=CheckSpec,
            __doc__=spec.summary,
            type=(Literal[name], ...),  # type: ignore[arg-type]
            params=(spec.Params, spec.Params()) if _all_optional(spec.Params) else (spec.Params, ...),
        )
        for name, spec in registry.checks().items()
    ]
    fault_union: Any = Annotated[Union[tuple(fault_models)], Discriminator("type")]  # noqa: UP007
    check_union: Any = Annotated[Union[tuple(check_models)], Discriminator("type")]  # noqa: UP007
    return create_model(
        "Scenario",
        __base__=Scenario,
        faults=(list[fault_union], []),
        checks=(list[check_union], []),
    )


def _all_optional(model: type[BaseModel]) -> bool:
    """True when ``model()`` is valid: every field has a default AND the defaults pass its validators (a
    "give one of min or max" rule makes params required although each field is optional)."""
    if any(field.is_required() for field in model.model_fields.values()):
        return False
    try:
        model()
    except ValidationError:
        return False
    return True


def json_schema() -> dict[str, Any]:
    """JSON Schema of a scenario file, for editors (``mlchaos schema``)."""
    return scenario_model().model_json_schema()


# ---------------------------------------------------------------------------------------------------------
# Loading with positions.


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
    node: yaml.Node, path: Path_, out: dict[Path_, tuple[int, int]], dupes: list[Problem], file: str
) -> None:
    """Record (line, column), 1-based, of every mapping key and sequence item below ``node``."""
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
            yaml_positions(value_node, here, out, dupes, file)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            here = (*path, index)
            out[here] = (item.start_mark.line + 1, item.start_mark.column + 1)
            yaml_positions(item, here, out, dupes, file)


def _raw_path(data: object, loc: tuple[str | int, ...]) -> Path_:
    """Map a pydantic error location onto the YAML data, dropping union tags that are not real keys."""
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
        elif isinstance(node, dict) and isinstance(part, str) and not last:
            continue  # a union tag such as ``kill`` or ``torchrun``: not a key in the file
        else:
            path.append(part)  # a missing key: named in the message, positioned at its parent
            break
    return tuple(path)


def _unwrap(annotation: Any) -> list[Any]:
    """The concrete types inside Optional/Union/Annotated/list/dict annotations."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _unwrap(get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        return [t for arg in get_args(annotation) for t in _unwrap(arg)]
    return [annotation]


def _model_at(root: type[BaseModel], loc: tuple[str | int, ...]) -> type[BaseModel] | None:
    """Walk a model along a pydantic error location; returns the model owning the last key, if found."""
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
            owners = [c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)]
            return owners[0] if len(owners) == 1 else None
        current = next_type
    owners = [c for c in _unwrap(current) if isinstance(c, type) and issubclass(c, BaseModel)]
    return owners[0] if len(owners) == 1 else None


def _suggest(word: str, options: list[str]) -> str:
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}?" if close else ("valid keys: " + ", ".join(options) if options else "")


def problem_for(
    error: dict[str, Any], data: object, marks: dict[Path_, tuple[int, int]], file: str, model: type[BaseModel]
) -> Problem:
    loc: tuple[str | int, ...] = tuple(error["loc"])
    path = _raw_path(data, loc)
    # Position: the deepest part of the path that exists in the file.
    line, column = 1, 1
    for depth in range(len(path), -1, -1):
        if path[:depth] in marks:
            line, column = marks[path[:depth]]
            break
    where = ".".join(str(p) for p in path) or "(top level)"
    kind = error["type"]
    hint = ""
    if kind == "extra_forbidden":
        key = str(loc[-1])
        owner = _model_at(model, loc[:-1])
        options = sorted(owner.model_fields) if owner is not None else []
        message = f"unknown key {key!r} in {'.'.join(str(p) for p in path[:-1]) or 'the scenario'}"
        hint = _suggest(key, options)
    elif kind == "missing":
        message = f"missing required key {str(loc[-1])!r} (at {'.'.join(str(p) for p in path[:-1]) or 'top level'})"
        hint = f"add {loc[-1]}: <value>"
    elif kind in ("union_tag_invalid", "union_tag_not_found"):
        expected = [t.strip(" '") for t in str(error.get("ctx", {}).get("expected_tags", "")).split(",") if t.strip()]
        given = str(error.get("ctx", {}).get("tag", ""))
        message = f"{where}: unknown type {given!r}" if given else f"{where}: missing 'type'"
        hint = _suggest(given, expected) if given else "set type to one of: " + ", ".join(expected)
        if given and not hint.startswith("did you mean"):
            hint = "use one of: " + ", ".join(expected)
    else:
        message = f"{where}: {error['msg']}"
    return Problem(file, line, column, message, hint)


def read_yaml_mapping(
    text: str, file: str, *, what: str, hint: str, error: type[ScenarioError] | None = None
) -> tuple[dict[str, Any], dict[Path_, tuple[int, int]], list[Problem]]:
    """Parse ``text`` as one YAML mapping with ``yaml.safe_load`` semantics; return it, the (line, column) of
    every key and item, and the problems found so far (duplicate keys). A syntax error or a non-mapping raises
    ``error`` (default ScenarioError) naming file:line:column; ``what``/``hint`` word the non-mapping case."""
    raise_as = error or ScenarioError
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, column = (mark.line + 1, mark.column + 1) if mark is not None else (1, 1)
        raise raise_as(
            [Problem(file, line, column, f"YAML syntax: {exc.problem or exc}", "check indentation and quoting here")]
        ) from None
    finally:
        loader.dispose()
    if not isinstance(data, dict) or node is None:
        raise raise_as([Problem(file, 1, 1, f"{what} must be a YAML mapping", hint)])
    marks: dict[Path_, tuple[int, int]] = {}
    problems: list[Problem] = []
    yaml_positions(node, (), marks, problems, file)
    return data, marks, problems


def parse_scenario(text: str, file: str = "<string>") -> Scenario:
    """Validate YAML ``text`` into a Scenario; raise ScenarioError with every problem found."""
    data, marks, problems = read_yaml_mapping(text, file, what="a scenario", hint="start with name: my-scenario")
    model = scenario_model()
    try:
        scenario = model.model_validate(data)
    except ValidationError as exc:
        problems.extend(problem_for(dict(e), data, marks, file, model) for e in exc.errors())
        raise ScenarioError(problems) from None
    if problems:
        raise ScenarioError(problems)
    return _name_and_cross_check(scenario, marks, file)


def _name_and_cross_check(scenario: Scenario, marks: dict[Path_, tuple[int, int]], file: str) -> Scenario:
    """Default fault/check names, then verify names are unique and checks refer to faults that exist."""
    problems: list[Problem] = []
    counts: dict[str, int] = {}
    named_faults: list[FaultSpec] = []
    for index, fault in enumerate(scenario.faults):
        counts[fault.type] = counts.get(fault.type, 0) + 1
        name = fault.name or f"{fault.type}-{counts[fault.type]}"
        if any(f.name == name for f in named_faults):
            problems.append(
                Problem(
                    file,
                    *marks.get(("faults", index), (1, 1)),
                    f"duplicate fault name {name!r}",
                    "give each fault a unique name",
                )
            )
        named_faults.append(fault.model_copy(update={"name": name}))
    fault_names = [f.name for f in named_faults]
    named_checks: list[CheckSpec] = []
    for index, check in enumerate(scenario.checks):
        referenced = getattr(check.params, "fault", None)
        if isinstance(referenced, str) and referenced not in fault_names:
            line, column = marks.get(("checks", index, "params", "fault"), marks.get(("checks", index), (1, 1)))
            hint = _suggest(referenced, fault_names) if fault_names else "add the fault under faults:"
            problems.append(
                Problem(
                    file, line, column, f"check {check.type!r} names fault {referenced!r}, which is not defined", hint
                )
            )
        label = check.name or (f"{check.type}[{referenced}]" if isinstance(referenced, str) else check.type)
        named_checks.append(check.model_copy(update={"name": label}))
    if problems:
        raise ScenarioError(problems)
    return scenario.model_copy(update={"faults": named_faults, "checks": named_checks})


def load_scenario(path: Path | str) -> Scenario:
    """Read and validate a scenario file; errors name ``path:line:column``."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(
            [Problem(str(path), 1, 1, f"cannot read scenario: {exc.strerror}", "check the path")]
        ) from None
    return parse_scenario(text, str(path))
