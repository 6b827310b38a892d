"""Value checks shared by the scenario model and the CLI: human-friendly durations, argv lists, and http(s) URLs;
and the short form of a value an error message quotes.

``"500ms"``, ``"10s"``, ``"2m"``, ``"1h"``, ``"1m30s"`` and plain numbers (seconds) are accepted as durations.
"""

from __future__ import annotations

import math
import os
import re
import reprlib
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import AfterValidator, BeforeValidator, Field, WithJsonSchema

_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")


_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxtuple, _SHORT.maxdict, _SHORT.maxset = 2, 4, 4, 4, 4
_SHORT.maxstring = _SHORT.maxlong = _SHORT.maxother = 60


def short_repr(value: object, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters, built without the whole of it: a YAML alias bomb (a list of
    nine aliases of a list of nine aliases ...) is a few kilobytes of file and gigabytes of repr."""
    text = _SHORT.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


NON_FINITE_DURATION = "a duration must be a finite number of seconds, like 30s, 2m"


class NonFiniteDuration(ValueError):
    """A duration that parsed to NaN or infinity: its own error, so the scenario problem keeps this wording."""


def parse_duration(value: object) -> float:
    """Return ``value`` as seconds; raise ValueError with the accepted forms when it is not a duration."""
    if isinstance(value, bool):
        raise ValueError("a duration cannot be a boolean")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().replace(" ", "")
        pos, seconds, matched = 0, 0.0, False
        for match in _PART.finditer(text):
            if match.start() != pos:
                break
            seconds += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
            pos, matched = match.end(), True
        if not matched or pos != len(text):
            try:
                seconds = float(text)
            except ValueError:
                raise ValueError(f"{value!r} is not a duration; write e.g. 500ms, 10s, 2m, 1h or 1m30s") from None
    else:
        raise ValueError(f"{short_repr(value)} is not a duration; write e.g. 500ms, 10s, 2m, 1h or 1m30s")
    if not math.isfinite(seconds):
        # float() reads "nan"/"inf" and YAML reads .nan/.inf; a NaN timeout compares False with everything, so a
        # watch given one never fires and a run "passes" that should have been stopped.
        raise NonFiniteDuration(f"{NON_FINITE_DURATION} (got {value!r})")
    if seconds < 0:
        raise ValueError(f"a duration must not be negative, got {value!r}")
    return seconds


def format_duration(seconds: float) -> str:
    """Render seconds compactly for tables and logs (``1.25s``, ``2m05s``)."""
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 120:
        return f"{seconds:.2f}s"
    minutes, rest = divmod(seconds, 60)
    return f"{int(minutes)}m{rest:04.1f}s"


# What parse_duration reads, for editors checking a file against `mlchaos schema`: unit parts ("1m30s", "500 ms")
# or a plain number written as a string. A float's own schema would call every "30s" in a scenario wrong.
DURATION_PATTERN = r"^ *(?:(?:\d+(?:\.\d+)? *(?:ms|s|m|h|d) *)+|[+]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)? *)$"
DURATION_JSON_SCHEMA = {
    "anyOf": [{"type": "number", "minimum": 0}, {"type": "string", "pattern": DURATION_PATTERN}],
    "description": "seconds, or a duration like 500ms, 30s, 2m, 1h, 1m30s",
}

Duration = Annotated[float, BeforeValidator(parse_duration), WithJsonSchema(DURATION_JSON_SCHEMA)]
"""A float number of seconds that YAML may spell as ``10s`` or ``2m``."""


MODULE_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"
"""A dotted Python module name (what ``python -m`` takes)."""

Name = Annotated[str, Field(min_length=1, pattern=r"^\S(.*\S)?$")]
"""A name, glob or regex the harness matches against something: not empty, no blanks at either end (which no
host, group or event kind has, so such a value could only ever match nothing)."""

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def check_env_names(env: dict[str, str]) -> dict[str, str]:
    """``env`` unchanged when every key is a variable name a process can see (``A=B`` or ``""`` is not)."""
    for name in env:
        if not _ENV_NAME.match(name):
            raise ValueError(f"{name!r} is not an environment variable name (letters, digits and _, not a digit first)")
    return env


EnvVars = Annotated[dict[str, str], AfterValidator(check_env_names)]
"""Environment variables handed to a job's processes: name -> value."""


def _stringify(value: object) -> object:
    """YAML turns ``--steps 60`` arguments into ints; argv wants strings, so scalars become str."""
    if isinstance(value, list):
        return [str(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v for v in value]
    return value


# In the JSON Schema an item is a string or a number, as YAML gives it before _stringify (`args: [--steps, 60]`).
_ArgvItem = Annotated[str, WithJsonSchema({"anyOf": [{"type": "string"}, {"type": "number"}]})]
Argv = Annotated[list[_ArgvItem], BeforeValidator(_stringify)]
"""A command line or its arguments: a list of strings, numbers YAML read as such turned back into strings."""


def check_http_url(url: str) -> str:
    """Return ``url`` unchanged when it is an http:// or https:// URL with a host and a valid port; raise
    ValueError saying what is wrong otherwise (pydantic validators turn it into a file:line error)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url!r} is not an http:// or https:// URL with a host")
    parts.port  # noqa: B018 - raises ValueError on a bad port
    return url


def check_host_directory(value: str, *, refusing_root: str) -> str:
    """The normalized form of ``value``, an absolute directory on a fault's host or ``{run_dir}/…`` (expanded to
    the run's report dir when the fault fires); raise ValueError for anything else, and for ``/`` itself
    (``refusing_root`` says why: "refusing to mount a fault layer over /")."""
    if not value.startswith(("/", "{run_dir}/")) or any(ch in value for ch in "\0\n"):
        raise ValueError(f"path must be an absolute directory path (or {{run_dir}}/…), got {value!r}")
    normal = os.path.normpath(value)
    if normal == "/":
        raise ValueError(refusing_root)
    return normal
