"""The typed settings of the reference serving stack (``target: {type: serving, ...}`` in a scenario), and the
config the target hands its gateway (:class:`GatewayConfig`).

Defaults follow common practice for serving health checks (probe every 5 s, 2 s timeout, 3 failures to mark
a backend down, 2 successes to mark it up again; see FIELD-NOTES). Tests and the shipped scenarios use
shorter values so a run takes seconds. Pydantic only: the harness imports this without torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from chaos.spec.load import header_name
from chaos.spec.units import Duration, EnvVars, Name

_STRICT = ConfigDict(extra="forbid", frozen=True)

# Replica names; also the ``backend`` a response names (``X-Backend`` header and the JSON ``backend`` field).
PRIMARY = "primary"
FALLBACK = "fallback"
CACHE = "cache"  # the last rung of the ladder: a default answer, marked degraded
REPLICA_RANKS = {PRIMARY: 0, FALLBACK: 1}  # RANK of each model server: in-job faults select a replica by rank


class ProbeSettings(BaseModel):
    """Health probes (``GET /healthz``) the gateway sends to each replica."""

    model_config = _STRICT
    interval: Duration = Field(default=5.0, gt=0, description="time between probes of one replica")
    timeout: Duration = Field(default=2.0, gt=0, description="a probe without an answer by then failed")
    failure_threshold: int = Field(default=3, ge=1, description="consecutive failures that mark a replica down")
    success_threshold: int = Field(default=2, ge=1, description="consecutive successes that mark it up again")


class CorrectnessSettings(BaseModel):
    """Inference-correctness probe: a known input whose expected output the gateway holds; a replica that
    answers 200 with numbers off by more than ``tolerance`` is marked down at once (``detect.wrong_answer``)."""

    model_config = _STRICT
    enabled: bool = True
    interval: Duration = Field(default=5.0, gt=0, description="time between correctness probes of one replica")
    tolerance: float = Field(default=1e-4, ge=0, description="largest allowed absolute error per output value")


class BreakerSettings(BaseModel):
    """Circuit breaker per replica over real traffic: closed -> open after ``failure_threshold`` consecutive
    failed requests; open for ``open_for``; then half-open lets ``half_open_trials`` requests through; their
    success closes it, a failure opens it again."""

    model_config = _STRICT
    enabled: bool = True
    failure_threshold: int = Field(default=5, ge=1)
    open_for: Duration = Field(default=10.0, gt=0)
    half_open_trials: int = Field(default=1, ge=1)


class SheddingSettings(BaseModel):
    """Priority load shedding at the gateway: with ``capacity`` requests in flight nothing more is admitted
    (503); above ``capacity * (1 - reserve)`` only the first (highest) priority is."""

    model_config = _STRICT
    enabled: bool = True
    capacity: int = Field(default=64, ge=1, description="most requests in flight at the gateway")
    reserve: float = Field(default=0.25, ge=0, lt=1, description="share of capacity kept for the top priority")
    priorities: list[Name] = Field(default=["premium", "free"], min_length=1, description="highest first")
    header: str = Field(default="X-Priority", description="request header naming the priority")

    @field_validator("priorities")
    @classmethod
    def _distinct(cls, priorities: list[str]) -> list[str]:
        repeated = sorted({p for p in priorities if priorities.count(p) > 1})
        if repeated:
            raise ValueError(f"priority {repeated[0]!r} is listed twice: each priority has one rank")
        return priorities

    @field_validator("header")
    @classmethod
    def _header(cls, name: str) -> str:
        return header_name(name)


class ReplicaSettings(BaseModel):
    """One model server process."""

    model_config = _STRICT
    model: Literal["primary", "small", "lm"] = Field(
        description="which reference model it serves (lm: the token model behind /v1/chat/completions)"
    )
    port: int = Field(
        default=0, ge=0, le=65535, description="its port on 127.0.0.1 (0: a free one; fix it to aim a partition at it)"
    )
    delay: Duration = Field(default=0.0, ge=0, description="simulated compute per inference (sleep, no CPU)")
    workers: int = Field(default=4, ge=1, description="inferences served at once; more wait in line")
    restart: bool = Field(default=True, description="restart the process when it exits (as a pod would be)")
    restart_delay: Duration = Field(default=1.0, ge=0, description="wait before that restart")
    token_delay: Duration = Field(default=0.0, ge=0, description="lm: pause before each streamed token")
    max_tokens: int = Field(default=32, ge=1, description="lm: tokens per answer (and the most a request gets)")


class ServingTarget(BaseModel):
    """The reference serving stack: primary and fallback model servers behind a gateway, each its own process."""

    model_config = _STRICT
    type: Literal["serving"]
    port: int = Field(default=0, ge=0, le=65535, description="gateway port on 127.0.0.1 (0: a free one)")
    primary: ReplicaSettings = ReplicaSettings(model="primary", delay=0.005)
    fallback: ReplicaSettings | None = Field(
        default=ReplicaSettings(model="small"), description="the smaller model (null: no fallback model)"
    )
    cache_fallback: bool = Field(
        default=True,
        description="last rung: the last good answer to the same input or prompt (streams: replayed), else a "
        "default answer, marked degraded",
    )
    request_timeout: Duration = Field(default=1.0, gt=0, description="deadline of one attempt at one replica")
    first_token_timeout: Duration | None = Field(
        default=None,
        gt=0,
        description="streams: a replica whose first token has not come this long after the attempt began is "
        "given up for the next rung (a breaker failure); null: only request_timeout",
    )
    probes: ProbeSettings = ProbeSettings()
    correctness: CorrectnessSettings = CorrectnessSettings()
    breaker: BreakerSettings = BreakerSettings()
    shedding: SheddingSettings = SheddingSettings()
    failback_hold: Duration = Field(
        default=0.0, ge=0, description="extra time a recovered primary must stay up before traffic returns"
    )
    resume_streams: bool = Field(
        default=False,
        description="a stream cut mid-way continues on the next rung (resume_from: k); off: the client's stream "
        "is cut too",
    )
    env: EnvVars = {}

    @model_validator(mode="after")
    def _models(self) -> ServingTarget:
        if self.primary.model not in ("primary", "lm"):
            raise ValueError("primary must serve model: primary (or lm, the token model)")
        return self

    def failover_bound(self) -> float:
        """Longest a health-probed failover should take: ``failure_threshold`` probes, the last timing out,
        plus one interval of phase (the fault can land just after a probe)."""
        p = self.probes
        return p.interval * p.failure_threshold + p.timeout + p.interval


class ReplicaEndpoint(BaseModel):
    """Where one model server listens, and which model it serves (names its golden file)."""

    model_config = _STRICT
    model: Literal["primary", "small", "lm"]
    port: int = Field(ge=1, le=65535)
    host: str = "127.0.0.1"


class GatewayConfig(BaseModel):
    """What the job hands the gateway: the scenario's serving settings, the gateway's port, the replicas
    (``primary`` and, with a fallback, ``fallback``) and the run folder holding the golden answers."""

    model_config = _STRICT
    target: ServingTarget
    port: int = Field(ge=0, le=65535)
    run_dir: Path
    replicas: dict[str, ReplicaEndpoint]
