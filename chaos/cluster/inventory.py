"""Where the hosts are: the inventory (typed, loaded from YAML with file:line:column in every error) and
seeded host selection with guard rails (protected hosts, blast radius).

An inventory file looks like::

    known_hosts: known_hosts          # relative paths are relative to the inventory file
    accept_unknown_host_keys: false   # true: trust a host seen for the first time (never a changed key)
    hosts:
      - name: h1
        address: 10.213.7.11
        port: 22
        user: root
        key_file: chaos-tb-client-key
        groups: [trainers]
        labels: {rack: r1}
        sudo: false
        python: /usr/bin/python3

Every host is also in the implicit group ``all``.
"""

from __future__ import annotations

import difflib
import os
import random
import re
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from chaos.spec.problems import decode_text
from chaos.spec.scenario import HostSelector, Problem, ScenarioError, read_yaml_mapping

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
ALL_GROUP = "all"

_STRICT = ConfigDict(extra="forbid", frozen=True)
_T = TypeVar("_T")


class InventoryError(ScenarioError):
    """An inventory could not be loaded; ``problems`` lists every error found, each with file:line:column."""


class SelectionError(ValueError):
    """A host selection matched nothing, named an unknown host or group, or exceeded the blast radius."""


class Host(BaseModel):
    """One host: reached over SSH (``key_file`` None means the SSH agent and the default keys), or a Docker
    container reached through the Docker Engine API (``transport: docker``)."""

    model_config = _STRICT
    name: str = Field(pattern=NAME_PATTERN, description="unique name used in scenarios and reports")
    address: str = Field(
        min_length=1,
        description="IP address or DNS name: what SSH connects to; for a container, its address on the job's "
        "network (what peers and the rendezvous use)",
    )
    transport: Literal["ssh", "docker"] = Field(default="ssh", description="how the harness reaches the host")
    container: str | None = Field(
        default=None,
        description="docker: the container's name (default: the host name), or label:k=v[,k2=v2] or "
        "service:[PROJECT/]NAME (compose); looked up afresh each time, so a recreated container is followed",
    )
    docker_url: str | None = Field(
        default=None, description="docker: Engine API URL (default: DOCKER_HOST, else the local socket)"
    )
    port: int = Field(default=22, ge=1, le=65535)
    user: str = Field(default="root", pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
    key_file: Path | None = None
    groups: list[str] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict)
    sudo: bool = Field(default=False, description="run every command through `sudo -n`")
    python: str | None = Field(default=None, description="interpreter for mlchaos helpers on this host")

    @field_validator("groups")
    @classmethod
    def _valid_groups(cls, groups: list[str]) -> list[str]:
        for group in groups:
            if not re.match(NAME_PATTERN, group):
                raise ValueError(f"group name {group!r} must match {NAME_PATTERN}")
        return groups

    def in_group(self, group: str) -> bool:
        return group == ALL_GROUP or group in self.groups


class Inventory(BaseModel):
    """The hosts of a cluster and how to trust them. Host names are unique."""

    model_config = _STRICT
    hosts: list[Host] = Field(min_length=1)
    known_hosts: Path | None = Field(default=None, description="OpenSSH known_hosts; None: ~/.ssh/known_hosts")
    accept_unknown_host_keys: bool = Field(
        default=False, description="trust hosts absent from known_hosts (a CHANGED key is always refused)"
    )

    @model_validator(mode="after")
    def _unique_names(self) -> Inventory:
        seen: set[str] = set()
        for host in self.hosts:
            if host.name in seen:
                raise ValueError(f"duplicate host name {host.name!r}")
            seen.add(host.name)
        return self

    def host(self, name: str) -> Host:
        """The host called ``name``; SelectionError with a "did you mean" otherwise."""
        for host in self.hosts:
            if host.name == name:
                return host
        raise SelectionError(f"no host named {name!r} in the inventory{_did_you_mean(name, self.names())}")

    def names(self) -> list[str]:
        return [h.name for h in self.hosts]

    def groups(self) -> list[str]:
        """Every group named by some host, plus ``all``; sorted."""
        return sorted({ALL_GROUP, *(g for h in self.hosts for g in h.groups)})


def select(
    inventory: Inventory,
    selector: HostSelector,
    rng: random.Random,
    *,
    protected: set[str] | frozenset[str] = frozenset(),
    blast_radius: int | None = None,
) -> list[Host]:
    """The hosts ``selector`` picks, in inventory order.

    Deterministic for a given rng state: candidates are sampled in inventory order, so the same seed and
    inventory pick the same hosts. Protected hosts are never candidates (naming one explicitly is an error).
    Raises SelectionError when a named host, group or excluded host is unknown, when nothing is left to
    pick, when ``count`` exceeds the candidates, or when more than ``blast_radius`` hosts would be hit.
    """
    if selector.rank is not None:
        raise SelectionError("a rank selector needs the running job to resolve it (only the runner can)")
    names = inventory.names()
    for name in [*selector.exclude, *sorted(protected)]:
        if name not in names:
            raise SelectionError(
                f"excluded/protected host {name!r} is not in the inventory{_did_you_mean(name, names)}"
            )
    if selector.host is not None:
        chosen = inventory.host(selector.host)
        if chosen.name in protected:
            raise SelectionError(f"host {chosen.name!r} is protected and cannot be selected")
        if chosen.name in selector.exclude:
            raise SelectionError(f"host {chosen.name!r} is both selected and excluded")
        candidates = [chosen]
    else:
        group = selector.group or ALL_GROUP
        if group not in inventory.groups():
            raise SelectionError(f"no host is in group {group!r}{_did_you_mean(group, inventory.groups())}")
        in_group = [h for h in inventory.hosts if h.in_group(group)]
        candidates = [h for h in in_group if h.name not in selector.exclude and h.name not in protected]
        if not candidates:
            raise SelectionError(
                f"group {group!r} has {len(in_group)} host(s) but all are excluded or protected; nothing to select"
            )
    count = selector.count if selector.count is not None else len(candidates)
    if count > len(candidates):
        raise SelectionError(f"asked for {count} host(s) but only {len(candidates)} candidate(s) are eligible")
    candidates = draw(candidates, count, rng)
    if blast_radius is not None and len(candidates) > blast_radius:
        raise SelectionError(
            f"selection hits {len(candidates)} hosts, more than the blast radius of {blast_radius}; "
            "narrow it with count, host or exclude, or raise safety.blast_radius"
        )
    return candidates


def draw(candidates: list[_T], count: int, rng: random.Random) -> list[_T]:
    """``count`` of ``candidates`` (at most all of them) drawn with ``rng``, in their order: the same rng state
    draws the same ones; taking all of them draws nothing from ``rng``."""
    if count >= len(candidates):
        return candidates
    picked = set(rng.sample(range(len(candidates)), count))
    return [c for i, c in enumerate(candidates) if i in picked]


def _did_you_mean(word: str, options: list[str]) -> str:
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else (f"; known: {', '.join(options)}" if options else "")


# ---------------------------------------------------------------------------------------------------------
# Loading and saving.

_Key = tuple[str | int, ...]


def _problem(error: dict[str, Any], marks: dict[_Key, tuple[int, int]], file: str) -> Problem:
    loc: _Key = tuple(error["loc"])
    line, column = 1, 1
    for depth in range(len(loc), -1, -1):  # the deepest part of the path that exists in the file
        if loc[:depth] in marks:
            line, column = marks[loc[:depth]]
            break
    where = ".".join(str(p) for p in loc) or "(top level)"
    if error["type"] == "extra_forbidden":
        key = str(loc[-1])
        options = sorted(Host.model_fields) if "hosts" in loc[:-1] else sorted(Inventory.model_fields)
        close = difflib.get_close_matches(key, options, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}?" if close else "valid keys: " + ", ".join(options)
        return Problem(file, line, column, f"unknown key {key!r} in {'.'.join(str(p) for p in loc[:-1])}", hint)
    if error["type"] == "missing":
        return Problem(file, line, column, f"missing required key {str(loc[-1])!r}", f"add {loc[-1]}: <value>")
    message = str(error["msg"]).removeprefix("Value error, ")
    if not loc and "duplicate host name" in message:
        name = message.split("'")[1] if "'" in message else ""
        # Point at the second entry with that name: the first one is not the mistake.
        hits = [k for k in marks if len(k) == 3 and k[0] == "hosts" and k[2] == "name"]
        dupes = [k for k in hits if _value_at(error.get("input"), k) == name]
        if len(dupes) > 1:
            line, column = marks[dupes[1]]
        return Problem(file, line, column, message, "give each host a unique name")
    return Problem(file, line, column, f"{where}: {message}")


def _value_at(data: object, key: _Key) -> object:
    for part in key:
        if isinstance(data, dict) and part in data:
            data = data[part]
        elif isinstance(data, list) and isinstance(part, int) and part < len(data):
            data = data[part]
        else:
            return None
    return data


def parse_inventory(text: str, file: str = "<string>", base_dir: Path | None = None) -> Inventory:
    """Validate YAML ``text`` into an Inventory; relative paths resolve against ``base_dir`` (default: cwd).

    Raises InventoryError listing every problem, each with file:line:column.
    """
    data, marks, problems = read_yaml_mapping(
        text, file, what="an inventory", hint="start with hosts:", error=InventoryError
    )
    try:
        inventory = Inventory.model_validate(data)
    except ValidationError as exc:
        problems.extend(_problem({**e, "input": data}, marks, file) for e in exc.errors())
        raise InventoryError(problems) from None
    if problems:
        raise InventoryError(problems)
    return _resolve_paths(inventory, base_dir if base_dir is not None else Path.cwd())


def _resolve_paths(inventory: Inventory, base: Path) -> Inventory:
    def resolve(path: Path | None) -> Path | None:
        if path is None:
            return None
        path = path.expanduser()
        return path if path.is_absolute() else base / path

    hosts = [h.model_copy(update={"key_file": resolve(h.key_file)}) for h in inventory.hosts]
    return inventory.model_copy(update={"hosts": hosts, "known_hosts": resolve(inventory.known_hosts)})


def load_inventory(path: Path | str) -> Inventory:
    """Read and validate an inventory file; relative paths in it are relative to the file's folder."""
    file = Path(path)
    try:
        raw = file.read_bytes()
    except OSError as exc:
        raise InventoryError(
            [Problem(str(path), 1, 1, f"cannot read inventory: {exc.strerror}", "check the path")]
        ) from None
    # Not UTF-8: the same file:line:column problem a scenario file gets, not a traceback.
    text = decode_text(raw, str(path), InventoryError)
    return parse_inventory(text, str(path), base_dir=file.parent)


def dump_inventory(inventory: Inventory, path: Path) -> None:
    """Write ``inventory`` as YAML to ``path`` atomically (a reader never sees half a file)."""
    data = inventory.model_dump(mode="json", exclude_defaults=False)
    text = yaml.safe_dump(data, sort_keys=False, default_flow_style=None)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
