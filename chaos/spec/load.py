"""The load generator's typed configuration and its open-loop send schedule.

A :class:`LoadSpec` says where to send, how fast (a rate shaped by a pattern), what to send and how to read
each response (which backend served it, whether it was degraded). Its YAML form, so it can be embedded in a
scenario later::

    url: http://127.0.0.1:8000/v1/generate
    method: POST
    rate: 500                      # requests per second outside steps and bursts
    pattern: {burst: {every: 10s, duration: 1s, rate: 2000}}   # or "constant", or {step: [{at: 5s, rate: 1000}]}
    duration: 30s
    body: '{"prompt": "request {i}", "tier": "{priority}"}'   # or {file: prompts.txt}, one body a line
    priorities: {premium: 0.2, free: 0.8}
    served_by: {header: X-Backend}   # or {json: meta.backend}
    degraded: {json: degraded}       # or {header: X-Degraded, value: "1"}
    stream: sse                      # optional: streamed answers (sse or chunked JSON lines)
    sessions: 8                      # optional: request i sends X-Session: s{i % 8} ({session} in the body)

The schedule is a pure function of the spec (and its seed): send times never depend on responses, which is
what makes the generator open-loop.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    JsonValue,
    Tag,
    field_validator,
    model_validator,
)

from chaos.plan.seeds import derive_rng
from chaos.spec.units import Duration, check_http_url

_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")  # RFC 9110 token: methods and header names


def header_name(name: str) -> str:
    """``name`` unchanged when it is a valid HTTP header name (an RFC 9110 token); ValueError otherwise."""
    if not _TOKEN.match(name):
        raise ValueError(f"{name!r} is not a valid HTTP header name")
    return name


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class Step(_Model):
    """From ``at`` (seconds after the start) on, send at ``rate`` requests per second."""

    at: Duration = Field(description="offset from the start of the run (e.g. 5s)")
    rate: float = Field(ge=0, description="requests per second from then on (0 pauses)")


class StepPattern(_Model):
    """Rate steps: the spec's ``rate`` until the first step, then each step's rate from its ``at``."""

    step: list[Step] = Field(min_length=1)

    @field_validator("step")
    @classmethod
    def _increasing(cls, steps: list[Step]) -> list[Step]:
        for before, after in zip(steps, steps[1:], strict=False):
            if after.at <= before.at:
                raise ValueError(f"steps must be in increasing order of 'at' ({after.at}s after {before.at}s)")
        return steps


class Burst(_Model):
    """Every ``every`` seconds (first at ``start``, default one period in), ``rate`` for ``duration``."""

    every: Duration = Field(gt=0, description="period between burst starts")
    duration: Duration = Field(gt=0, description="how long each burst lasts (shorter than every)")
    rate: float = Field(ge=0, description="requests per second during a burst")
    start: Duration | None = Field(default=None, description="offset of the first burst; default: every")

    @model_validator(mode="after")
    def _fits(self) -> Burst:
        if self.duration >= self.every:
            raise ValueError(f"a burst ({self.duration}s) must be shorter than its period every={self.every}s")
        return self


class BurstPattern(_Model):
    burst: Burst


class BodyFile(_Model):
    """Request bodies read from a file, one a line (blank lines skipped), cycled in order."""

    file: Path

    @field_validator("file", mode="before")
    @classmethod
    def _named(cls, file: object) -> object:
        if isinstance(file, str) and not file.strip():
            raise ValueError("file needs a path (an empty one names the current folder, not a file of bodies)")
        return file


class HeaderField(_Model):
    """Read a value from a response header (case-insensitive name)."""

    header: str

    @field_validator("header")
    @classmethod
    def _name(cls, name: str) -> str:
        return header_name(name)


class JsonField(_Model):
    """Read a value from the JSON response body by a dotted path (``meta.backend``, ``choices.0.id``)."""

    json_path: str = Field(alias="json", min_length=1)


class HeaderMatch(HeaderField):
    """Degraded when the header equals ``value`` (case-insensitive); without a value, when it is present
    and not one of ``"", 0, false, no, off``."""

    value: str | None = None


class JsonMatch(JsonField):
    """Degraded when the JSON field equals ``value``; without a value, when it is present and truthy."""

    value: JsonValue = None


def _by_key(error: str, message: str, *keys: str) -> Discriminator:
    """A union discriminator by the one key of ``keys`` a mapping holds (a bare string is its own tag); a value
    that names none, or several, fails as ``error`` with ``message``."""

    def pick(value: object) -> str | None:
        if isinstance(value, str):
            return value
        if isinstance(value, BaseModel):
            value = value.model_dump(by_alias=True)
        if isinstance(value, dict):
            found = [k for k in keys if k in value]
            return found[0] if len(found) == 1 else None
        return None

    return Discriminator(pick, custom_error_type=error, custom_error_message=message)


Pattern = Annotated[
    Annotated[Literal["constant"], Tag("constant")]
    | Annotated[StepPattern, Tag("step")]
    | Annotated[BurstPattern, Tag("burst")],
    _by_key(
        "pattern",
        "pattern must be constant, {step: [{at, rate}, ...]} or {burst: {every, duration, rate}}",
        "step",
        "burst",
    ),
]
ServedBy = Annotated[
    Annotated[HeaderField, Tag("header")] | Annotated[JsonField, Tag("json")],
    _by_key("served_by", "served_by must be {header: NAME} or {json: dotted.path}", "header", "json"),
]
DegradedRule = Annotated[
    Annotated[HeaderMatch, Tag("header")] | Annotated[JsonMatch, Tag("json")],
    _by_key(
        "degraded", "degraded must be {header: NAME, value: ...} or {json: dotted.path, value: ...}", "header", "json"
    ),
]


class LoadSpec(_Model):
    """One open-loop HTTP load: what to send, at which rate over time, and how to read the responses."""

    url: str = Field(description="http:// or https:// URL every request goes to")
    method: str = Field(default="GET", description="HTTP method")
    rate: float = Field(gt=0, description="requests per second (the base rate that steps and bursts change)")
    pattern: Pattern = Field(default="constant", description="constant | {step: [{at, rate}]} | {burst: {...}}")
    arrivals: Literal["uniform", "poisson"] = Field(
        default="uniform", description="evenly spaced sends, or a seeded Poisson process of the same rate"
    )
    duration: Duration = Field(gt=0, description="how long to send for (e.g. 10s)")
    body: str | BodyFile | None = Field(
        default=None, description="body template ({i}, {priority}, {session} are replaced) or {file: path}"
    )
    headers: dict[str, str] = Field(default_factory=dict, description="extra request headers")
    priorities: dict[str, float] | None = Field(
        default=None, description="priority name -> weight, drawn per request from the seeded rng"
    )
    priority_header: str | None = Field(
        default="X-Priority", description="request header that carries the priority (null: body only)"
    )
    seed: int = Field(default=0, description="seed of the priority draws and Poisson arrivals")
    timeout: Duration = Field(default=10.0, gt=0, description="per request, counted from its SCHEDULED send time")
    served_by: ServedBy | None = Field(default=None, description="where the backend's name is")
    degraded: DegradedRule | None = Field(default=None, description="what marks a degraded response")
    max_in_flight: int = Field(
        default=256, ge=1, description="requests beyond this many in flight are recorded as dropped_client"
    )
    verify_tls: bool = Field(default=True, description="verify the server certificate for https")
    stream: Literal["sse", "chunked"] | None = Field(
        default=None,
        description="answers arrive as streams: sse (data: events, data: [DONE] ends) or chunked (JSON lines, "
        "the last chunk ends); each request then records ttft_s, gaps_s, tokens and how it ended",
    )
    sessions: int | None = Field(
        default=None, ge=1, description="request i carries session id s{i % sessions} in session_header"
    )
    session_header: str = Field(default="X-Session", description="request header carrying the session id")

    @field_validator("url")
    @classmethod
    def _url(cls, url: str) -> str:
        return check_http_url(url)

    @field_validator("method")
    @classmethod
    def _method(cls, method: str) -> str:
        if not _TOKEN.match(method):
            raise ValueError(f"{method!r} is not an HTTP method")
        return method.upper()

    @field_validator("headers")
    @classmethod
    def _headers(cls, headers: dict[str, str]) -> dict[str, str]:
        for name, value in headers.items():
            header_name(name)
            if "\r" in value or "\n" in value:
                raise ValueError(f"header {name!r} has a line break in its value")
        return headers

    @field_validator("priority_header", "session_header")
    @classmethod
    def _header_name(cls, name: str | None) -> str | None:
        return None if name is None else header_name(name)

    @field_validator("priorities")
    @classmethod
    def _weights(cls, weights: dict[str, float] | None) -> dict[str, float] | None:
        if weights is None:
            return None
        if not weights:
            raise ValueError("priorities needs at least one name: weight")
        if any(not name.strip() for name in weights):
            raise ValueError("a priority needs a name: it is sent as the request's priority header or {priority}")
        if any(w < 0 for w in weights.values()) or sum(weights.values()) <= 0:
            raise ValueError("priority weights must be >= 0 and not all 0")
        return weights


def rate_segments(spec: LoadSpec) -> list[tuple[float, float, float]]:
    """The rate over ``[0, duration)`` as ``(start_s, end_s, rate)`` pieces, in order and contiguous."""
    end = spec.duration
    cuts: list[tuple[float, float]] = [(0.0, spec.rate)]  # (from, rate) change points
    pattern = spec.pattern
    if isinstance(pattern, StepPattern):
        cuts += [(s.at, s.rate) for s in pattern.step if s.at < end]
    elif isinstance(pattern, BurstPattern):
        burst = pattern.burst
        start = burst.every if burst.start is None else burst.start
        k = 0
        while start + k * burst.every < end:
            t = start + k * burst.every
            cuts += [(t, burst.rate), (t + burst.duration, spec.rate)]
            k += 1
    pieces: list[tuple[float, float, float]] = []
    for (t0, rate), (t1, _) in zip(cuts, cuts[1:] + [(end, 0.0)], strict=True):
        t1 = min(t1, end)
        if t1 > t0:
            pieces.append((t0, t1, rate))
    return pieces


def offered(spec: LoadSpec, start_s: float = 0.0, end_s: float | None = None) -> float:
    """Requests the spec asks for in ``[start_s, end_s)``: the integral of its rate (a count, not a rate)."""
    stop = spec.duration if end_s is None else end_s
    return sum(r * max(0.0, min(b, stop) - max(a, start_s)) for a, b, r in rate_segments(spec))


def schedule(spec: LoadSpec) -> Iterator[float]:
    """Send offsets in seconds from the start, increasing, all in ``[0, duration)``.

    Uniform arrivals put request k where the integral of the rate reaches k (so a window of length d at rate
    r holds r*d requests, give or take one, and the first goes at 0). Poisson arrivals do the same with
    unit-rate exponential gaps in that integral, i.e. a Poisson process whose rate follows the pattern.
    """
    rng = derive_rng(spec.seed, "arrivals")
    poisson = spec.arrivals == "poisson"
    target = rng.expovariate(1.0) if poisson else 0.0  # integral value of the next send
    area = 0.0  # integral of the rate up to the current piece's start
    for t0, t1, rate in rate_segments(spec):
        if rate <= 0:
            continue
        piece_end_area = area + rate * (t1 - t0)
        # A send that lands on the piece's end belongs to the next piece (or, at the end, to no one); the
        # tolerance keeps float error in the running area from adding one there.
        while target < piece_end_area - 1e-9 * max(1.0, piece_end_area):
            t = t0 + (target - area) / rate
            if t >= t1:  # floating point at the boundary: belongs to the next piece
                break
            yield t
            target += rng.expovariate(1.0) if poisson else 1.0
        area = piece_end_area


def session_of(spec: LoadSpec, i: int) -> str | None:
    """The session id request ``i`` carries: ``s{i % sessions}``, or None without ``sessions``."""
    return None if spec.sessions is None else f"s{i % spec.sessions}"


def priority_sequence(spec: LoadSpec) -> Iterator[str | None]:
    """The priority of request 0, 1, 2, ...: seeded draws by weight (None when no priorities are set)."""
    if spec.priorities is None:
        while True:
            yield None
    names = list(spec.priorities)
    cum: list[float] = []
    total = 0.0
    for name in names:
        total += spec.priorities[name]
        cum.append(total)
    rng = derive_rng(spec.seed, "priority")
    while True:
        yield rng.choices(names, cum_weights=cum)[0]


class ScenarioLoad(LoadSpec):
    """A scenario's ``load:`` section: a :class:`LoadSpec` whose ``url`` may be a path (``/v1/predict``),
    sent to the target's own address (a ``serving`` or ``http`` target), and whose ``seed`` defaults to the
    run's seed. The runner turns it into a plain LoadSpec with :meth:`resolve` once the target is ready."""

    url: str = Field(
        default="/v1/predict", description="absolute http(s) URL, or a path on the serving/http target's address"
    )

    @field_validator("url")
    @classmethod
    def _url(cls, url: str) -> str:
        if url.startswith("/"):
            if any(c in url for c in " \r\n"):
                raise ValueError(f"{url!r} is not a URL path")
            return url
        return LoadSpec._url(url)

    def resolve(self, base_url: str | None, seed: int) -> LoadSpec:
        """The LoadSpec to run: ``url`` joined onto ``base_url`` when it is a path; the run's seed unless the
        scenario set one."""
        url = self.url
        if url.startswith("/"):
            if base_url is None:
                raise ValueError(f"load url {url!r} is a path, but this target has no address: give a full URL")
            url = base_url.rstrip("/") + url
        data = self.model_dump(by_alias=True, exclude={"url", "seed"})
        return LoadSpec.model_validate(
            {**data, "url": url, "seed": self.seed if "seed" in self.model_fields_set else seed}
        )
