"""The scenario: typed, frozen, loaded from YAML with file:line:column in every error.

A scenario says where the job runs (``cluster``), what it is (``target``), which faults hit it and when
(``faults`` with ``trigger`` and ``duration``), what must hold (``checks``) and the run's guard rails
(``safety``). Each injector and check contributes its own params model through the registry, so the full
schema (and editor completion through ``mlchaos schema``) is built from whatever is installed; adding an
injector never edits this file. The entries live in :mod:`chaos.spec.faults` and :mod:`chaos.spec.targets`,
the checks beside the model's own in :mod:`chaos.spec.raw_checks`; every name is importable from here.
"""

from __future__ import annotations

import hashlib
import json
from functools import cache
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
)
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from chaos.plugins import registry
from chaos.spec.faults import PHASES as PHASES
from chaos.spec.faults import CheckSpec as CheckSpec
from chaos.spec.faults import EventTrigger as EventTrigger
from chaos.spec.faults import EveryTrigger as EveryTrigger
from chaos.spec.faults import FaultSpec as FaultSpec
from chaos.spec.faults import HostSelector as HostSelector
from chaos.spec.faults import PoissonTrigger as PoissonTrigger
from chaos.spec.faults import Trigger as Trigger
from chaos.spec.load import ScenarioLoad
from chaos.spec.problems import Path_ as Path_
from chaos.spec.problems import Problem as Problem
from chaos.spec.problems import ScenarioError as ScenarioError
from chaos.spec.problems import decode_text, position, without_union_noise
from chaos.spec.problems import problem_for as problem_for
from chaos.spec.problems import read_yaml_mapping as read_yaml_mapping
from chaos.spec.problems import yaml_positions as yaml_positions
from chaos.spec.raw_checks import cross_check, fault_names, nonsense_numbers, validator_crash
from chaos.spec.renamed import rename_modules
from chaos.spec.roles import RolesTarget
from chaos.spec.serving import ServingTarget
from chaos.spec.slurm import SlurmTarget
from chaos.spec.targets import CommandTarget as CommandTarget
from chaos.spec.targets import HangWatchSpec as HangWatchSpec
from chaos.spec.targets import HttpTarget as HttpTarget
from chaos.spec.targets import TorchrunTarget as TorchrunTarget
from chaos.spec.units import Duration, Name

_STRICT = ConfigDict(extra="forbid", frozen=True)
NO_CHECKS = (
    "a scenario with no checks can only pass; add checks, or say `checks: []` together with "
    "`allow_no_checks: true` to run one on purpose"
)


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
    problems.extend(cross_check(data, marks, file))  # on the raw data: reported next to the model's own errors
    try:
        scenario = model.model_validate(data)
    except ValidationError as exc:
        errors = without_union_noise([dict(e) for e in exc.errors()], data)
        problems.extend(problem_for(e, data, marks, file, model) for e in errors)
    except Exception as exc:  # noqa: BLE001 - a validator that raised no ValueError: named, never a traceback
        problems.append(validator_crash(exc, data, marks, file))
    else:
        problems.extend(nonsense_numbers(scenario, data, (), marks, file))
    if problems:
        raise ScenarioError(sorted(problems, key=lambda p: (p.line, p.column)))
    named = _named(scenario)
    named._source = (file, marks)
    return named


def _named(scenario: Scenario) -> Scenario:
    """Default fault names (``<type>-<n>``) and check labels (``<type>[<fault>]``), as the cross-check counted."""
    names = fault_names([(fault.type, fault.name) for fault in scenario.faults])
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
