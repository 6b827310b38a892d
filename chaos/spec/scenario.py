"""The scenario: typed, frozen, loaded from YAML with file:line:column in every error.

A scenario says where the job runs (``cluster``), what it is (``target``), which faults hit it and when
(``faults`` with ``trigger`` and ``duration``), what must hold (``checks``) and the run's guard rails
(``safety``). Each injector and check contributes its own params model through the registry, so the full
schema (and editor completion through ``mlchaos schema``) is built from whatever is installed; adding an
injector never edits this file.
"""

from __future__ import annotations

import hashlib
import json
import math
from functools import cache
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    SerializeAsAny,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    create_model,
    field_validator,
    model_validator,
)
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from chaos.event_kinds import TriggerPhase
from chaos.plugins import registry
from chaos.spec.load import ScenarioLoad
from chaos.spec.matchers import LogMatcherSpec, OptimizerSteps, Signatures
from chaos.spec.problems import Path_ as Path_
from chaos.spec.problems import Problem as Problem
from chaos.spec.problems import ScenarioError as ScenarioError
from chaos.spec.problems import decode_text, nearest, position, without_union_noise
from chaos.spec.problems import problem_for as problem_for
from chaos.spec.problems import read_yaml_mapping as read_yaml_mapping
from chaos.spec.problems import yaml_positions as yaml_positions
from chaos.spec.renamed import rename_modules
from chaos.spec.roles import RolesTarget
from chaos.spec.serving import ServingTarget
from chaos.spec.slurm import SlurmTarget
from chaos.spec.targets import HttpTarget
from chaos.spec.units import Duration, EnvVars, Name

_STRICT = ConfigDict(extra="forbid", frozen=True)
_MODULE = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"  # a dotted Python module name
NO_CHECKS = (
    "a scenario with no checks can only pass; add checks, or say `checks: []` together with "
    "`allow_no_checks: true` to run one on purpose"
)


def _stringify(value: object) -> object:
    """YAML turns ``--steps 60`` arguments into ints; argv wants strings, so scalars become str."""
    if isinstance(value, list):
        return [str(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v for v in value]
    return value


# In the JSON Schema an item is a string or a number, as YAML gives it before _stringify (`args: [--steps, 60]`).
_ArgvItem = Annotated[str, WithJsonSchema({"anyOf": [{"type": "string"}, {"type": "number"}]})]
Argv = Annotated[list[_ArgvItem], BeforeValidator(_stringify)]


class EveryTrigger(BaseModel):
    """Fire ``count`` times, every ``interval``, the first at ``start`` (default: one interval in)."""

    model_config = _STRICT
    interval: Duration = Field(gt=0)
    count: int = Field(ge=1, le=10_000)  # (and its last firing within max_duration: chaos.spec.preflight)
    start: Duration | None = None


class PoissonTrigger(BaseModel):
    """Fire ``count`` times with exponential gaps of mean ``mtbf`` (seeded: replays exactly)."""

    model_config = _STRICT
    mtbf: Duration = Field(gt=0)
    count: int = Field(ge=1, le=10_000)
    start: Duration = 0.0


class EventTrigger(BaseModel):
    """Fire when the ``nth`` event whose kind matches ``kind`` (a glob) arrives, optionally on one rank."""

    model_config = _STRICT
    kind: Name
    nth: int = Field(default=1, ge=1)
    rank: int | None = Field(default=None, ge=0)


# The points inside a training step where the in-job agent can fire a process fault (``trigger.phase``):
# before the forward pass, inside the gradient all-reduce (the rank has entered the collective), after backward
# (the all-reduce done), and just before the optimizer step.
PHASES: tuple[TriggerPhase, ...] = ("forward", "allreduce", "backward", "optimizer_step")


class Trigger(BaseModel):
    """When a fault fires. Exactly one of ``after``, ``at_step``, ``on_event``, ``every``, ``poisson``."""

    model_config = _STRICT
    after: Duration | None = Field(
        default=None, description="seconds after the target starts (a serving/http target: after it is ready)"
    )
    at_step: int | None = Field(default=None, ge=0, description="when a rank reports this training step")
    rank: int | None = Field(default=None, ge=0, description="with at_step: the rank whose step counts")
    phase: TriggerPhase | None = Field(
        default=None,
        description="with at_step, on a process fault of a torchrun job: the point inside the step where the "
        "rank's own agent fires it (forward, allreduce, backward, optimizer_step)",
    )
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
        if self.phase is not None and self.at_step is None:
            raise ValueError("phase belongs with at_step: a phase is a point inside a training step")
        return self

    @property
    def kind(self) -> str:
        for key in ("after", "at_step", "on_event", "every", "poisson"):
            if getattr(self, key) is not None:
                return key
        raise AssertionError("validated trigger has no kind")


class HostSelector(BaseModel):
    """Which hosts a fault hits: one ``host`` by name, the host running training ``rank`` (a multi-node
    target, resolved when the fault fires), ``count`` hosts of a ``group`` (default: all), or of a slurm
    target's nodes (``slurm: allocated``: the job's allocation when the fault fires; ``slurm: spare``: the
    partition's nodes outside it), never those in ``exclude``. ``count`` None takes every candidate; fewer are
    drawn with the run's rng."""

    model_config = _STRICT
    host: Name | None = None
    rank: int | None = Field(default=None, ge=0, description="the host that runs this rank of a multi-node target")
    group: Name | None = None
    slurm: Literal["allocated", "spare"] | None = Field(
        default=None,
        description="a slurm target's nodes, when the fault fires: allocated (the job's allocation) or spare "
        "(the partition's nodes the job does not hold)",
    )
    count: int | None = Field(default=None, ge=1)
    exclude: list[Name] = Field(default_factory=list)

    @model_validator(mode="after")
    def _host_or_group(self) -> HostSelector:
        given = [key for key in ("host", "rank", "group", "slurm") if getattr(self, key) is not None]
        if len(given) > 1:
            raise ValueError(f"give one of host, rank, group or slurm, not {' and '.join(given)}")
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
    duration: Duration | None = Field(default=None, gt=0, description="how long the fault lasts before heal")
    hosts: HostSelector | None = Field(
        default=None, description="inventory hosts the fault is applied on (null: the harness's own host)"
    )


class CheckSpec(BaseModel):
    """One assertion: a check ``type`` with its ``params``; ``name`` labels it in reports."""

    model_config = _STRICT
    name: str = ""
    type: str
    params: SerializeAsAny[BaseModel]


class HangWatchSpec(BaseModel):
    """The harness-side hang watch (:mod:`chaos.detect.hang_watch`): names the rank a hang waits for
    (``detect.hang``) once no rank completed a collective for ``hang_after``, from the ranks' flight recorders."""

    model_config = _STRICT
    hang_after: Duration = Field(default=3.0, gt=0, description="no collective completed for this long: a hang")
    poll: Duration = Field(default=0.2, gt=0, description="how often the recorder files are read")


class TorchrunTarget(BaseModel):
    """A job launched by torchrun: a module (``-m``) or a script, N ranks per node, M restarts.

    Without ``nodes`` it is one node on this host (``--standalone``). With ``nodes`` (a host selector over
    the inventory) every selected host runs one torchrun agent over SSH, joined by a c10d rendezvous on the
    first selected host at ``rdzv_port``."""

    model_config = _STRICT
    type: Literal["torchrun"]
    module: str | None = Field(default=None, pattern=_MODULE, description="a dotted module name (python -m)")
    script: Name | None = None
    args: Argv = []
    nproc_per_node: int = Field(default=2, ge=1, le=1024)
    max_restarts: int = Field(default=3, ge=0)
    monitor_interval: Duration = Field(default=0.5, gt=0)
    nodes: HostSelector | None = Field(
        default=None, description="inventory hosts that each run one torchrun agent (null: this host only)"
    )
    rdzv_port: Annotated[int, Field(ge=1, le=65535)] | Literal["auto"] = Field(
        default="auto",
        description="c10d rendezvous port on the first node: `auto` (a port free there, chosen when the run "
        "starts, so runs side by side never share one) or a number to pin it",
    )
    python: Name | None = Field(
        default=None,
        description="the interpreter that runs the job (a path, or a name on PATH); null: python3 on PATH when it "
        "can import torch (and mlchaos for a script with the agent line), else mlchaos's own; on nodes: each "
        "host's inventory python",
    )
    torchrun: Argv | None = Field(
        default=None,
        min_length=1,
        description="the launcher command, e.g. [/opt/venv/bin/torchrun]; null: <python> -m torch.distributed.run",
    )
    env: EnvVars = {}
    matchers: list[LogMatcherSpec] = []
    signatures: Signatures = "all"
    optimizer_steps: OptimizerSteps = True
    hang_watch: HangWatchSpec | None = Field(
        default=None, description="name the rank a hang waits for (the job must attach the agent); null: off"
    )

    @model_validator(mode="after")
    def _module_or_script(self) -> TorchrunTarget:
        if (self.module is None) == (self.script is None):
            raise ValueError("a torchrun target needs exactly one of module or script")
        if self.nodes is not None and (self.nodes.rank is not None or self.nodes.slurm is not None):
            raise ValueError(
                "nodes selects the hosts that run the job: use host, group, count or exclude, not rank or slurm"
            )
        return self


class CommandTarget(BaseModel):
    """Any command; its output lines become events through ``matchers``. ``{python}`` in it is the job's
    interpreter (``python:``, see :mod:`chaos.targets.interpreter`)."""

    model_config = _STRICT
    type: Literal["command"]
    command: Argv = Field(min_length=1)
    python: Name | None = Field(
        default=None,
        description="the job's interpreter: replaces a bare python/python3 program and fills {python} in the "
        "command; null: the command as written, {python} = python3 on PATH when it can import what the "
        "command's .py files import of torch and mlchaos, else mlchaos's own",
    )
    env: EnvVars = {}
    matchers: list[LogMatcherSpec] = []
    signatures: Signatures = "all"
    optimizer_steps: OptimizerSteps = True

    @field_validator("command")
    @classmethod
    def _program(cls, command: list[str]) -> list[str]:
        if not command[0].strip():
            raise ValueError("the command's first item is the program to run: it cannot be empty")
        return command


TargetSpec = Annotated[
    TorchrunTarget | CommandTarget | ServingTarget | HttpTarget | RolesTarget | SlurmTarget, Discriminator("type")
]
ADDRESSED_TARGETS = (ServingTarget, HttpTarget)  # targets with an address a load's URL path is sent to


class ClusterSpec(BaseModel):
    """Where faults land: this machine, plus the hosts of an SSH inventory (``mlchaos testbed up`` writes one
    for a local testbed; a staging cluster's has the same format). ``--inventory`` overrides ``inventory``."""

    model_config = _STRICT
    transport: Literal["local", "ssh"] = "local"
    inventory: Name | None = Field(default=None, description="inventory YAML (path relative to the scenario)")
    protected: list[Name] = Field(default=[], description="hosts no fault may ever select")


class SafetySpec(BaseModel):
    """Guard rails: the run is ended (and healed) when any is crossed."""

    model_config = _STRICT
    max_duration: Duration = Field(default=300.0, gt=0, description="hard limit on the whole run")
    no_progress_timeout: Duration | None = Field(
        default=90.0,
        gt=0,
        description="end the run when no target.step nor rank (re)start arrives for this long (null: never)",
    )
    heal_grace: Duration = Field(default=5.0, description="dead-man fires this long after a fault's duration")
    blast_radius: int | None = Field(default=None, ge=1, description="most faults active at once")
    abort_on: list[Name] = Field(default=[], description="event kinds (globs) that end the run at once")


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
    # Declared before checks: the checks validator reads it (pydantic validates fields in declaration order).
    allow_no_checks: bool = Field(
        default=False,
        description="run with checks: [] on purpose (a game day that only watches); without it a scenario "
        "with no checks is refused, since it can only pass",
    )
    checks: list[CheckSpec] = Field(default=[], validate_default=True)
    safety: SafetySpec = SafetySpec()
    allow_unknown: bool = Field(default=False, description="treat unknown check verdicts as passing")
    # The file it was read from and the (line, column) of every key in it (parse_scenario sets it; copies
    # keep it), so a problem found later (the preflight, a run's refusal) still names file:line.
    _source: tuple[str, dict[Path_, tuple[int, int]]] | None = PrivateAttr(default=None)

    @field_validator("checks")
    @classmethod
    def _some_checks(cls, checks: list[CheckSpec], info: ValidationInfo) -> list[CheckSpec]:
        # A run with nothing to judge it reports a pass whatever happened: a false pass unless asked for.
        if not checks and not info.data.get("allow_no_checks", False):
            raise ValueError(NO_CHECKS)
        return checks

    @field_validator("load")
    @classmethod
    def _load_has_an_address(cls, load: ScenarioLoad | None, info: ValidationInfo) -> ScenarioLoad | None:
        target = info.data.get("target")  # declared before load, so validated first (absent if it failed)
        if load is not None and load.url.startswith("/") and target is not None:
            if isinstance(target, RolesTarget) and target.url is None:
                raise ValueError(
                    f"url {load.url!r} is a path, but this roles target has no url: give the target a url "
                    "(e.g. url: http://127.0.0.1:8080, its load balancer's address) or the load a full http:// URL"
                )
            if not isinstance(target, (*ADDRESSED_TARGETS, RolesTarget)):
                raise ValueError(
                    f"url {load.url!r} is a path, but a {target.type} target has no address: give a full http:// URL"
                )
        return load

    def located(self, path: Path_) -> tuple[str, int, int]:
        """(file, line, column) of the key at ``path`` (the nearest enclosing key the file has) in the file this
        scenario was read from; ``("<scenario NAME>", 1, 1)`` for one built in code."""
        if self._source is None:
            return f"<scenario {self.name}>", 1, 1
        file, marks = self._source
        return (file, *position(marks, path))

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


def _tagged_union(prefix: str, base: type[BaseModel], plugins: dict[str, tuple[str, type[BaseModel], bool]]) -> Any:
    """A union of one ``base`` subclass per plugin, told apart by ``type`` (its name), with its ``params``
    model (optional when ``plugins[name][2]``, the params defaulting to the model's defaults)."""
    models = [
        create_model(
            f"{prefix}_{name}",
            __base__=base,
            __doc__=summary,
            type=(Literal[name], ...),  # type: ignore[arg-type]
            params=(params, params()) if optional else (params, ...),
        )
        for name, (summary, params, optional) in plugins.items()
    ]
    return Annotated[Union[tuple(models)], Discriminator("type")]  # noqa: UP007


@cache
def scenario_model() -> type[Scenario]:
    """The Scenario model whose faults and checks are discriminated unions of every registered params model."""
    injectors = {name: (cls.summary, cls.Params, False) for name, cls in registry.injectors().items()}
    checks = {name: (spec.summary, spec.Params, _all_optional(spec.Params)) for name, spec in registry.checks().items()}
    fault_union: Any = _tagged_union("Fault", FaultSpec, injectors)
    check_union: Any = _tagged_union("Check", CheckSpec, checks)
    return create_model(
        "Scenario",
        __base__=Scenario,
        faults=(list[fault_union], []),
        checks=(list[check_union], Field(default=[], validate_default=True)),
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


# A number as a string: YAML 1.1 reads 1.0e7 (no sign after the e) as a string, which pydantic's float takes.
_NUMBER_TEXT = r"^ *[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)? *$"


class _ScenarioJsonSchema(GenerateJsonSchema):
    """Floats as the model reads them: a number, or a string holding one (``factor: 1.0e7`` in a scenario)."""

    def float_schema(self, schema: core_schema.FloatSchema) -> JsonSchemaValue:
        return {"anyOf": [super().float_schema(schema), {"type": "string", "pattern": _NUMBER_TEXT}]}


def json_schema() -> dict[str, Any]:
    """JSON Schema of a scenario file, for editors (``mlchaos schema``): every file ``parse_scenario`` takes
    passes it (durations as ``30s`` strings, argv items as numbers)."""
    return scenario_model().model_json_schema(schema_generator=_ScenarioJsonSchema)


# ---------------------------------------------------------------------------------------------------------
# Loading with positions (the wording of each problem lives in chaos.spec.problems).


def parse_scenario(text: str, file: str = "<string>") -> Scenario:
    """Validate YAML ``text`` into a Scenario; raise ScenarioError with every problem found, in file order."""
    data, marks, problems = read_yaml_mapping(text, file, what="a scenario", hint="start with name: my-scenario")
    rename_modules(data, marks, file)  # a job module's old path: the new path, and a warning at its line
    model = scenario_model()
    problems.extend(_cross_check(data, marks, file))  # on the raw data: reported next to the model's own errors
    try:
        scenario = model.model_validate(data)
    except ValidationError as exc:
        errors = without_union_noise([dict(e) for e in exc.errors()], data)
        problems.extend(problem_for(e, data, marks, file, model) for e in errors)
    except Exception as exc:  # noqa: BLE001 - a validator that raised no ValueError: named, never a traceback
        problems.append(_validator_crash(exc, data, marks, file))
    else:
        problems.extend(_nonsense_numbers(scenario, data, (), marks, file))
    if problems:
        raise ScenarioError(sorted(problems, key=lambda p: (p.line, p.column)))
    named = _named(scenario)
    named._source = (file, marks)
    return named


def _validator_crash(exc: Exception, data: dict[str, Any], marks: dict[Path_, tuple[int, int]], file: str) -> Problem:
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


def _nonsense_numbers(
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
                found += _nonsense_numbers(getattr(value, name), raw[key], (*path, key), marks, file)
        return found
    if isinstance(value, (list, tuple)) and isinstance(raw, list) and len(raw) == len(value):
        return [
            p
            for i, (v, r) in enumerate(zip(value, raw, strict=True))
            for p in _nonsense_numbers(v, r, (*path, i), marks, file)
        ]
    if isinstance(value, dict) and isinstance(raw, dict):
        return [p for k, v in value.items() if k in raw for p in _nonsense_numbers(v, raw[k], (*path, k), marks, file)]
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


def _fault_names(faults: list[tuple[str, str]]) -> list[str]:
    """The name of each (type, name) fault; an unnamed one is ``<type>-<n>``, n counting the faults of its type."""
    counts: dict[str, int] = {}
    names = []
    for kind, name in faults:
        counts[kind] = counts.get(kind, 0) + 1
        names.append(name or f"{kind}-{counts[kind]}")
    return names


def _cross_check(data: dict[str, Any], marks: dict[Path_, tuple[int, int]], file: str) -> list[Problem]:
    """Fault names are unique, and a check's ``fault`` names a fault that exists."""
    problems: list[Problem] = []
    faults = _items(data, "faults")
    names = _fault_names([(str(fault.get("type", "")), str(fault.get("name") or "")) for _, fault in faults])
    fault_names: list[str] = []
    for (index, _), name in zip(faults, names, strict=True):
        if name in fault_names:
            at = position(marks, ("faults", index))
            problems.append(Problem(file, *at, f"duplicate fault name {name!r}", "give each fault a unique name"))
        fault_names.append(name)
    checks = registry.checks()
    for index, check in _items(data, "checks"):
        spec = checks.get(str(check.get("type")))
        params = check.get("params")
        referenced = params.get("fault") if isinstance(params, dict) else None
        if spec is None or "fault" not in spec.Params.model_fields or not isinstance(referenced, str):
            continue  # an unknown check type or a fault that is not a name: the model says what is wrong
        if referenced not in fault_names:
            line, column = position(marks, ("checks", index, "params", "fault"))
            hint = nearest(referenced, fault_names) or (
                "faults defined: " + ", ".join(fault_names) if fault_names else "add the fault under faults:"
            )
            message = f"check {check['type']!r} names fault {referenced!r}, which is not defined"
            problems.append(Problem(file, line, column, message, hint))
    return problems


def _named(scenario: Scenario) -> Scenario:
    """Default fault names (``<type>-<n>``) and check labels (``<type>[<fault>]``), as the cross-check counted."""
    names = _fault_names([(fault.type, fault.name) for fault in scenario.faults])
    named_faults = [fault.model_copy(update={"name": name}) for fault, name in zip(scenario.faults, names, strict=True)]
    named_checks: list[CheckSpec] = []
    for check in scenario.checks:
        referenced = getattr(check.params, "fault", None)
        label = check.name or (f"{check.type}[{referenced}]" if isinstance(referenced, str) else check.type)
        named_checks.append(check.model_copy(update={"name": label}))
    return scenario.model_copy(update={"faults": named_faults, "checks": named_checks})


def load_scenario(path: Path | str) -> Scenario:
    """Read and validate a scenario file; errors name ``path:line:column``."""
    file = Path(path)
    try:
        raw = file.read_bytes()
    except OSError as exc:
        problem = Problem(str(path), 1, 1, f"cannot read scenario: {exc.strerror}", "check the path")
        raise ScenarioError([problem]) from None
    return parse_scenario(decode_text(raw, str(path)), str(path))
