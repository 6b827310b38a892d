"""The in-job faults' parameters as the agent reads them: stdlib dataclasses, no pydantic, no harness import.

The harness validates a fault's params against its injector's pydantic model (``injectors.tensor.BitFlipParams``,
``injectors.gradient.GradCorruptParams``, ``injectors.crash.CrashParams``, ``injectors.collective.
CollectiveFaultParams``: the YAML schema, with every rule and its message) before it writes the plan file; the
agent, inside a training process that may have torch and nothing else, reads the already valid params into
these. Same fields, same defaults, the same "phase follows where" default; unknown fields are refused.
``tests/unit/test_fault_specs.py`` holds the two views to each other. The literal types are defined here once
(``Site``, ``TensorPhase``, ``TriggerPhase``: in :mod:`chaos.event_kinds`) and imported by the injector modules.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar, Literal, Protocol, Self, runtime_checkable

from chaos.event_kinds import Site, TensorPhase, TriggerPhase

BitClass = Literal["sign", "exponent", "mantissa"]
Where = Literal["weights", "activations", "gradients", "optimizer_state"]
Kind = Literal["bitflip", "nan", "inf", "scale"]
# latent: fires once and is never undone (a memory upset stays until the job itself overwrites the value: a
# reload, a rollback); transient: fires once and is healed at the end of its step.
Persistence = Literal["transient", "stuck", "intermittent", "latent"]
Magnitude = Literal["any", "rms"]
# How a ``crash`` fault ends its rank: a Python exception, a native SIGSEGV, or SIGABRT (see injectors.crash).
CrashKind = Literal["exception", "segfault", "abort"]
# How a ``collective_fault`` fails its rank's collective: one call raises, or the rank's process groups are aborted
# (see injectors.collective).
CollectiveKind = Literal["error", "abort"]

# Where a tensor fault fires when ``phase`` is not given: the one point in the step where its tensor is live.
DEFAULT_PHASE: dict[str, TensorPhase] = {
    "weights": "forward",
    "activations": "forward",
    "gradients": "backward",
    "optimizer_state": "optimizer_step",
}


@runtime_checkable
class Validated(Protocol):
    """The harness's validated params of a fault (its pydantic model), read through ``model_dump`` so that nothing
    here imports pydantic."""

    def model_dump(self) -> dict[str, object]: ...


class _Spec:
    """A fault's spec (a frozen dataclass below), named by its injector's ``fault`` type in its class line."""

    fault: ClassVar[str]

    def __init_subclass__(cls, *, fault: str, **kw: object) -> None:
        super().__init_subclass__(**kw)
        cls.fault = fault

    @classmethod
    def from_params(cls, params: Mapping[str, object]) -> Self:
        """The spec of validated params (a plan op's ``params``); ValueError for an unknown field."""
        known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(params) - known)
        if unknown:
            listed = f"{', '.join(unknown)} (known: {', '.join(sorted(known))})"
            raise ValueError(f"{cls.fault} params: unknown field(s) {listed}")
        return cls(**params)

    @classmethod
    def of(cls, params: Self | Validated) -> Self:
        """``params`` as this spec: itself, or the spec of the harness's validated params (tests and the pytest
        plugin hand those over directly)."""
        return cls.from_params(params.model_dump()) if isinstance(params, Validated) else params


@dataclass(frozen=True)
class BitFlipSpec(_Spec, fault="bitflip"):
    """A ``bitflip`` fault (see ``injectors.tensor`` for what each field means)."""

    where: Where = "weights"
    layer: str | None = None
    kind: Kind = "bitflip"
    element: int | None = None
    bit: int | BitClass | None = None
    count: int = 1
    block: int = 32
    factor: float = 1e7
    persistence: Persistence = "transient"
    probability: float = 0.5
    steps: int | None = None
    phase: TensorPhase = "forward"
    state: str | None = None
    rank: int | None = None
    seed: int | None = None

    @classmethod
    def from_params(cls, params: Mapping[str, object]) -> Self:
        """The spec of validated params (a plan op's ``params``); ``phase`` defaults by ``where``."""
        if params.get("phase") is None:
            where = params.get("where", "weights")
            params = {**params, "phase": DEFAULT_PHASE.get(str(where), "forward")}
        return super().from_params(params)


@dataclass(frozen=True)
class GradCorruptSpec(_Spec, fault="grad_corrupt"):
    """A ``grad_corrupt`` fault (see ``injectors.gradient`` for what each field means)."""

    site: Site = "in_transit"
    bucket: int = 0
    rank: int | None = None
    replica: str | None = None
    kind: Kind = "bitflip"
    element: int | None = None
    bit: int | BitClass | None = "exponent"
    count: int = 1
    magnitude: Magnitude = "rms"
    block: int = 32
    factor: float = 1e7


@dataclass(frozen=True)
class CrashSpec(_Spec, fault="crash"):
    """A ``crash`` fault (see ``injectors.crash`` for what each field means)."""

    kind: CrashKind = "exception"
    phase: TriggerPhase = "forward"
    rank: int | None = None


@dataclass(frozen=True)
class CollectiveFaultSpec(_Spec, fault="collective_fault"):
    """A ``collective_fault`` fault (see ``injectors.collective`` for what each field means)."""

    kind: CollectiveKind = "error"
    index: int = 0
    rank: int | None = None
