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
from typing import Literal, Protocol, TypeVar

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

S = TypeVar("S")


def _read(cls: type[S], params: Mapping[str, object], name: str) -> S:
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(params) - known)
    if unknown:
        raise ValueError(f"{name} params: unknown field(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    return cls(**params)


@dataclass(frozen=True)
class BitFlipSpec:
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
    def from_params(cls, params: Mapping[str, object]) -> BitFlipSpec:
        """The spec of validated params (a plan op's ``params``); ``phase`` defaults by ``where``."""
        if params.get("phase") is None:
            where = params.get("where", "weights")
            params = {**params, "phase": DEFAULT_PHASE.get(str(where), "forward")}
        return _read(cls, params, "bitflip")


@dataclass(frozen=True)
class GradCorruptSpec:
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

    @classmethod
    def from_params(cls, params: Mapping[str, object]) -> GradCorruptSpec:
        """The spec of validated params (a plan op's ``params``)."""
        return _read(cls, params, "grad_corrupt")


@dataclass(frozen=True)
class CrashSpec:
    """A ``crash`` fault (see ``injectors.crash`` for what each field means)."""

    kind: CrashKind = "exception"
    phase: TriggerPhase = "forward"
    rank: int | None = None

    @classmethod
    def from_params(cls, params: Mapping[str, object]) -> CrashSpec:
        """The spec of validated params (a plan op's ``params``)."""
        return _read(cls, params, "crash")


@dataclass(frozen=True)
class CollectiveFaultSpec:
    """A ``collective_fault`` fault (see ``injectors.collective`` for what each field means)."""

    kind: CollectiveKind = "error"
    index: int = 0
    rank: int | None = None

    @classmethod
    def from_params(cls, params: Mapping[str, object]) -> CollectiveFaultSpec:
        """The spec of validated params (a plan op's ``params``)."""
        return _read(cls, params, "collective_fault")


class BitFlipFields(Protocol):
    """What the tensor fault engine reads of a ``bitflip`` fault: a :class:`BitFlipSpec`, or the harness's
    validated ``BitFlipParams`` (tests and the pytest plugin hand that one over directly)."""

    @property
    def where(self) -> Where: ...
    @property
    def layer(self) -> str | None: ...
    @property
    def kind(self) -> Kind: ...
    @property
    def element(self) -> int | None: ...
    @property
    def bit(self) -> int | BitClass | None: ...
    @property
    def count(self) -> int: ...
    @property
    def block(self) -> int: ...
    @property
    def factor(self) -> float: ...
    @property
    def persistence(self) -> Persistence: ...
    @property
    def probability(self) -> float: ...
    @property
    def steps(self) -> int | None: ...
    @property
    def phase(self) -> TensorPhase: ...
    @property
    def state(self) -> str | None: ...
    @property
    def rank(self) -> int | None: ...
    @property
    def seed(self) -> int | None: ...
