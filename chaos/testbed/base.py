"""What both testbeds (:mod:`~chaos.testbed.namespaces`, :mod:`~chaos.testbed.containers`) share:
the state dir and its record, the choice of a free /24, host addresses, and the bookkeeping of a teardown.

A testbed lives in a state dir; ``T``, a 4-hex-digit tag derived from that dir, names everything it makes,
so testbeds of different state dirs coexist. The record (a small JSON file there) is written before anything
is built, so a teardown knows what to look for even after a half-finished ``up``.
"""

from __future__ import annotations

import ipaddress
import json
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Self

from chaos.safety.state import state_dir as mlchaos_state_dir
from chaos.testbed.system import TestbedError, state_tag

INVENTORY = "inventory.yaml"
MAX_HOSTS = 200
HOST_OFFSET = 10  # hN gets .(10+N); .1 is the root namespace's side (the gateway)


def ignore(line: str) -> None:
    """The default ``log`` of ``up``/``down``: say nothing."""
    del line


@dataclass(frozen=True)
class TestbedLayout:
    """The state dir of one testbed and the tag derived from it; each testbed's ``Layout`` adds its names."""

    __test__ = False  # not a pytest test class, despite the name

    state_dir: Path
    tag: str

    subdir: ClassVar[str]  # the default state dir's name under the mlchaos state dir
    state_file: ClassVar[str]  # the record's name in the state dir
    prefix: ClassVar[str]  # of the names of what the testbed makes: "<prefix>-<tag>-h<N>" for host N
    link_prefix: ClassVar[str]  # of its interface in the root namespace (15 characters at most)

    @classmethod
    def of(cls, state_dir: Path) -> Self:
        return cls(state_dir.resolve(), state_tag(state_dir))

    @classmethod
    def default_dir(cls) -> Path:
        """``<mlchaos state dir>/<subdir>``."""
        return mlchaos_state_dir() / cls.subdir

    @classmethod
    def at(cls, state_dir: Path | None) -> Self:
        """The layout of ``state_dir``, or of :meth:`default_dir` when None."""
        return cls.of(state_dir if state_dir is not None else cls.default_dir())

    @property
    def name_prefix(self) -> str:
        """``<prefix>-<tag>-``: what every per-testbed name starts with."""
        return f"{self.prefix}-{self.tag}-"

    @property
    def link(self) -> str:
        """The testbed's interface in the root namespace: ``<link_prefix>-<tag>``."""
        return f"{self.link_prefix}-{self.tag}"

    def host_name(self, index: int) -> str:
        """The name of host ``h<index>``'s namespace or container."""
        return f"{self.name_prefix}h{index}"

    def index_of(self, name: str) -> int | None:
        """N for :meth:`host_name` ``(N)`` (a leading "/", as Docker writes names, ignored); None for any other name."""
        bare = name.lstrip("/")
        rest = bare.removeprefix(f"{self.name_prefix}h")
        return int(rest) if rest != bare and rest.isdigit() else None

    @property
    def inventory(self) -> Path:
        return self.state_dir / INVENTORY

    @property
    def record(self) -> Path:
        return self.state_dir / self.state_file

    def read_record(self) -> dict[str, Any]:
        """The record, or ``{}`` when it is missing or unreadable (nothing was built, or it was lost)."""
        try:
            data = json.loads(self.record.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def write_record(self, record: Mapping[str, object]) -> None:
        """Replace the record atomically (a crash leaves the old one or the new one, never half of either)."""
        tmp = self.record.with_name(self.record.name + ".tmp")
        tmp.write_text(json.dumps(record, indent=2) + "\n")
        os.replace(tmp, self.record)


def check_host_count(n: int) -> None:
    """TestbedError unless ``1 <= n <= MAX_HOSTS``."""
    if not 1 <= n <= MAX_HOSTS:
        raise TestbedError(f"a testbed has 1 to {MAX_HOSTS} hosts, not {n}")


def choose_subnet(prefix: str, tag: str, used: Iterable[ipaddress.IPv4Network], taken_by: str) -> ipaddress.IPv4Network:
    """The first ``prefix.X.0/24`` overlapping none of ``used``, starting at an X derived from ``tag`` (so
    different state dirs rarely even probe alike); TestbedError naming ``taken_by`` when all are taken."""
    used = list(used)
    start = int(tag, 16) % 256
    for step in range(256):
        candidate = ipaddress.IPv4Network(f"{prefix}.{(start + step) % 256}.0/24")
        if not any(candidate.overlaps(net) for net in used):
            return candidate
    raise TestbedError(f"every {prefix}.X.0/24 is in use {taken_by}")


def host_address(net: ipaddress.IPv4Network, index: int) -> str:
    """The address of host ``h<index>`` in ``net``."""
    return str(net.network_address + HOST_OFFSET + index)


def host_indices(record: Mapping[str, object], found: Iterable[int | None]) -> list[int]:
    """The hosts a status reports: those the record says were built, and any other ``found`` in place."""
    count = record.get("hosts")
    indices = set(range(1, count + 1)) if isinstance(count, int) else set()
    return sorted(indices | {i for i in found if i is not None})


class Teardown:
    """The bookkeeping of a ``down``: every step is tried; what was removed is logged and returned, what
    failed is collected and raised at the end (:meth:`result`)."""

    def __init__(self, log: Callable[[str], None]) -> None:
        self.log = log
        self.done: list[str] = []
        self.errors: list[str] = []

    def say(self, line: str) -> None:
        """Record (and log) one thing removed."""
        self.done.append(line)
        self.log(line)

    def fail(self, line: str) -> None:
        """Record one step that failed; the teardown goes on."""
        self.errors.append(line)

    def result(self, what: str) -> list[str]:
        """What was removed; TestbedError ``<what> incomplete`` listing the failures if any."""
        if self.errors:
            raise TestbedError(f"{what} incomplete:\n" + "\n".join(self.errors))
        return self.done


def remove_files(paths: Iterable[Path]) -> int:
    """Delete those of ``paths`` that exist; how many."""
    count = 0
    for path in paths:
        if path.exists():
            path.unlink()
            count += 1
    return count


def remove_dir_if_empty(path: Path) -> None:
    """rmdir ``path`` unless it holds someone's own files (or is already gone)."""
    try:
        path.rmdir()
    except OSError:
        pass
