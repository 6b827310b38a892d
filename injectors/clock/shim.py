"""The clock shim (``native/clockshift.c``) from the harness's side: where the built library is, the environment
that preloads it into a job's processes, and the offset files it reads.

The contract with the shim: ``MLCHAOS_CLOCK_DIR`` names a folder; a file ``<scope>@<tag>`` there holds a signed
integer number of nanoseconds; each process adds up the files of its own scopes (``all``, ``rank-<RANK>``,
``replica-<CHAOS_REPLICA>``: :func:`scope_of`) to its wall clock, and reads them again every 50 ms. A file is
written whole under a dot-name and renamed into place, so no process reads half a number; removing it ends its
offset. ``make setup`` builds the library (:func:`library`); nothing here compiles.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from pathlib import Path

from chaos.events import ENV_CLOCK_DIR

ENV_LIBRARY = "MLCHAOS_CLOCKSHIFT"  # the built shim, when not where make setup puts it
SOURCE = Path(__file__).resolve().parents[2] / "native" / "clockshift.c"
FOLDER = "clock"  # the offset files' folder, in the run's folder
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def library() -> Path:
    """The built shim: ``$MLCHAOS_CLOCKSHIFT``, else ``<venv>/lib/mlchaos/clockshift.so`` (scripts/setup.sh)."""
    explicit = os.environ.get(ENV_LIBRARY)
    return Path(explicit) if explicit else Path(sys.prefix) / "lib" / "mlchaos" / "clockshift.so"


def folder_of(run_dir: Path) -> Path:
    """Where a run's offset files go."""
    return run_dir / FOLDER


def job_env(run_dir: Path) -> dict[str, str]:
    """What every process of the job needs: the shim preloaded, after whatever the harness's own environment
    preloads (so a user's preload keeps its place), and the run's offset folder."""
    preload = ":".join(part for part in (os.environ.get("LD_PRELOAD", ""), str(library())) if part)
    return {"LD_PRELOAD": preload, ENV_CLOCK_DIR: str(folder_of(run_dir))}


def scope_of(rank: int | None, replica: str | None) -> str:
    """The scope a fault writes: one rank (its ``RANK``), one replica (its ``CHAOS_REPLICA``), or every process."""
    if rank is not None:
        return f"rank-{rank}"
    if replica is not None:
        return f"replica-{replica}"
    return "all"


def offset_file(folder: Path, scope: str, op_id: str) -> Path:
    """The file one op writes: its scope, then its op id made file-name safe (with a hash, so two ids that
    differ only in unsafe characters never share one)."""
    digest = hashlib.sha256(op_id.encode()).hexdigest()[:8]
    return folder / f"{scope}@{_UNSAFE.sub('_', op_id)[:80]}-{digest}"


def write_offset(path: Path, offset_ns: int) -> None:
    """Put ``offset_ns`` in force for ``path``'s scope: written to a dot-name, then renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = temporary_of(path)
    temporary.write_text(f"{offset_ns}\n")
    os.replace(temporary, path)


def temporary_of(path: Path) -> Path:
    """The dot-name ``path`` is written under before its rename (the shim never reads it)."""
    return path.with_name(f".{path.name}.tmp")


def remove_offset(path: Path) -> None:
    """End ``path``'s offset (fine when it is not there); its temporary file goes too."""
    temporary_of(path).unlink(missing_ok=True)
    path.unlink(missing_ok=True)
