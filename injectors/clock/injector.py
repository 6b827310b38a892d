"""The ``clock`` fault: the wall clock of a job's processes jumps forward or back by ``jump`` when the fault fires,
and back again when it heals; their monotonic clock never moves (as when NTP steps a drifted clock, or a VM
resumes from a snapshot).

It acts through the clock shim (:mod:`injectors.clock.shim`), which the runner preloads into every process the
target starts once the scenario has a ``clock`` fault (:meth:`ClockInjector.job_env`). Apply writes the op's
offset file in the run's folder, heal and the dead-man (``rm -f``) remove it; processes follow within 50 ms.
Scope: one ``rank`` (torchrun), one ``replica`` (roles and serving targets), or every process the target
started (its launcher too). Offsets of ops in force at once add up. This machine only: the shim must be built
here (``make setup``), which ``check`` says when it is not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, JsonValue, WithJsonSchema, model_validator

from chaos.cluster.local import LocalTransport
from chaos.plugins.injector import (
    Applied,
    FaultOp,
    InjectionContext,
    InjectionError,
    InjectorBase,
    Unsupported,
    state_int,
    state_text,
)
from chaos.spec.units import parse_duration
from injectors.clock import shim

MAX_JUMP_S = 3650 * 86400.0  # ten years: what the shim accepts


def parse_jump(value: object) -> float:
    """Signed seconds: a number, or a duration with an optional sign (``+1h``, ``-90s``, ``-1m30s``)."""
    if isinstance(value, str):
        text = value.strip()
        sign = -1.0 if text.startswith("-") else 1.0
        return sign * parse_duration(text.lstrip("+-").strip())
    if isinstance(value, int | float) and not isinstance(value, bool) and value < 0:
        return -parse_duration(-value)
    return parse_duration(value)


_JUMP_SCHEMA = {
    "anyOf": [
        {"type": "number"},
        {"type": "string", "pattern": r"^ *[+-]? *(?:(?:\d+(?:\.\d+)? *(?:ms|s|m|h|d) *)+|\d+\.?\d* *)$"},
    ],
    "description": "signed seconds, or a duration with a sign: +1h, -10m, -1m30s",
}
Jump = Annotated[float, BeforeValidator(parse_jump), WithJsonSchema(_JUMP_SCHEMA)]


class ClockParams(BaseModel):
    """How far the wall clock jumps, and whose: one rank, one replica, or every process of the target."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    jump: Jump = Field(
        description="how far the wall clock jumps when the fault fires: +1h forward, -10m back (it jumps back by "
        "as much when the fault heals)"
    )
    rank: int | None = Field(default=None, ge=0, description="only this rank's processes (a torchrun target)")
    replica: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="only this replica's processes (a roles or serving target); neither: every process the target "
        "started, its launcher too",
    )

    @model_validator(mode="after")
    def _sane(self) -> ClockParams:
        if self.jump == 0 or not math.isfinite(self.jump) or abs(self.jump) > MAX_JUMP_S:
            raise ValueError(f"jump must be non-zero and at most ten years either way, got {self.jump:g}s")
        if self.rank is not None and self.replica is not None:
            raise ValueError("select a rank or a replica, not both")
        return self


@dataclass(frozen=True)
class ClockState:
    """The journal state: the offset file the op writes, its scope and the offset in nanoseconds."""

    file: str
    scope: str
    jump_ns: int

    def to_json(self) -> dict[str, JsonValue]:
        return {"file": self.file, "scope": self.scope, "jump_ns": self.jump_ns}

    @classmethod
    def from_json(cls, state: dict[str, JsonValue]) -> ClockState:
        return cls(state_text(state, "file"), state_text(state, "scope"), state_int(state, "jump_ns"))


def _signed(seconds: float) -> str:
    return f"{seconds:+g}s"


class ClockInjector(InjectorBase, name="clock", params=ClockParams):
    """the wall clock of a rank, a replica or the whole job jumps forward or back (preloaded shim; monotonic
    untouched)

    ``clock``: an offset file for the preloaded shim, written at apply and removed at heal."""

    def check(self, ctx: InjectionContext, params: BaseModel) -> None:
        if not isinstance(ctx.transport, LocalTransport):
            raise Unsupported(
                f"the clock shim reaches only processes started on the harness's machine, not on {ctx.transport.host}"
            )
        built = shim.library()
        if not built.is_file():
            raise Unsupported(
                f"the clock shim is not built ({built} is missing): run `make setup`, which compiles "
                f"{shim.SOURCE.relative_to(shim.SOURCE.parents[1])} with gcc"
            )

    def job_env(self, run_dir: Path) -> dict[str, str]:
        """The shim preloaded, and the run's offset folder (see :func:`injectors.clock.shim.job_env`)."""
        return shim.job_env(run_dir)

    def prepare(self, ctx: InjectionContext, op: FaultOp) -> Applied:
        """The op's offset file in the run's folder; InjectionError outside a run (no processes to reach)."""
        if ctx.run_dir is None:
            raise InjectionError("a clock fault reaches the processes a run starts, and this is not a run")
        params = op.params_as(ClockParams)
        scope = shim.scope_of(params.rank, params.replica)
        path = shim.offset_file(shim.folder_of(ctx.run_dir), scope, op.op_id)
        state = ClockState(str(path), scope, round(params.jump * 1e9))
        whose = "every process of the job" if scope == "all" else scope.replace("-", " ", 1)
        return op.record(
            self.name, ctx.transport.host, state.to_json(), f"wall clock of {whose} {_signed(params.jump)}"
        )

    def apply(self, ctx: InjectionContext, applied: Applied) -> None:
        state = ClockState.from_json(applied.state)
        try:
            shim.write_offset(Path(state.file), state.jump_ns)
        except OSError as exc:
            raise InjectionError(f"cannot write the clock offset {state.file}: {exc}") from exc

    def heal(self, ctx: InjectionContext, applied: Applied) -> None:
        """Remove the offset file: the scope's clock jumps back within 50 ms. Idempotent."""
        shim.remove_offset(Path(ClockState.from_json(applied.state).file))

    def revert_command(self, applied: Applied) -> list[str] | None:
        file = Path(ClockState.from_json(applied.state).file)
        return ["rm", "-f", str(file), str(shim.temporary_of(file))]


INJECTORS = (ClockInjector,)
