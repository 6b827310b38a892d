"""The golden (fault-free) run a scenario's lineage checks compare against, cached per job, seed and code.

``matches_golden`` needs what every rank of the same job with the same seed ends with when nothing goes
wrong (``sdc_detected`` too: to tell a masked fault from a missed one). Running it
costs as much as the scenario itself, so its outcome is cached under ``<report root>/.golden/`` keyed by
the scenario's golden key (target, seed, data) and a fingerprint of the code that runs inside the job and of
the interpreter that runs it.
The run itself is the caller's (the runner passes a fault-free ``execute``), so this module stays free of
the orchestrator.

Runs side by side (two ``mlchaos run`` of one scenario, pytest-xdist workers) share the cache: a run that
misses takes an exclusive lock on the entry's ``.lock`` file while it computes, so a second run of the same job
waits and then reads what the first wrote instead of running the golden run again; the entry is written to a
temporary file and renamed, so a reader never sees half of it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from pydantic import JsonValue

from chaos.checks.lineage import final_digests, golden_rank_digests, rank_key
from chaos.event_kinds import RUNNER_GOLDEN
from chaos.history.timeline import Event, History
from chaos.spec.scenario import Scenario
from chaos.targets.factory import entry_files, job_identity

# mlchaos's own code that runs inside the job (in-job agent, guards, reference targets, injectors).
_OWN_PACKAGES = (Path(__file__).resolve().parents[1], Path(__file__).resolve().parents[2] / "injectors")


@dataclass(frozen=True)
class Golden:
    """What the fault-free run ended with: every rank's final digest, and every detection it raised.

    ``digests``: rank -> that rank's final digest (its highest attempt, latest on ties; None keys a rank-less
    job); ``digest``: the lowest rank's (rank 0's), kept for callers that want one digest (the report's
    ``golden_digest``); ``detections``: the kinds of its ``detect.*`` events (false alarms).
    """

    digest: str
    detections: list[str]
    cached: bool
    digests: dict[int | None, str] = field(default_factory=dict)

    def digests_json(self) -> dict[str, JsonValue]:
        """``digests`` with JSON keys (``"0"``, ``"1"``, ``"none"`` for rank-less), as ``runner.golden`` records them."""
        return {rank_key(rank): digest for rank, digest in self.digests.items()}


class FaultFreeRun(Protocol):
    """What the golden logic reads from a finished fault-free run (a :class:`chaos.run.orchestrator.RunResult`)."""

    @property
    def history(self) -> History: ...

    @property
    def run_dir(self) -> Path: ...

    @property
    def ended_by(self) -> str: ...


def golden_outcome(
    scenario: Scenario,
    cache_dir: Path,
    *,
    use_cache: bool,
    run_fault_free: Callable[[Scenario, Path], FaultFreeRun],
    log: Callable[[str], None],
) -> Golden | None:
    """The fault-free run's outcome: from ``cache_dir`` when the job, its seed and its code are unchanged
    (and ``use_cache``), else by calling ``run_fault_free(scenario without faults, cache_dir)`` and caching
    what it ended with: every rank's final digest (see :func:`chaos.checks.lineage.final_digests`) and its
    detections. A cache file without per-rank digests (written before they were kept) is a miss. None when
    that run produced no model digest (its reports stay in ``cache_dir``)."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    cached = cache_dir / f"{scenario.golden_key()}-{code_fingerprint(scenario)}.json"
    with _entry_lock(cached, log):
        if use_cache and cached.exists():
            hit = _from_cache(cached)
            if hit is not None:
                return hit
            # A file from before per-rank digests (or damaged): a miss, so the run is redone and the file rewritten.
            log(f"golden cache {cached.name} lacks per-rank digests: running the golden run again")
        log("golden run: same job and seed, no faults …")
        result = run_fault_free(scenario.without_faults(), cache_dir)
        finals = final_digests(result.history)
        if not finals or result.ended_by.startswith(("no progress", "max_duration")):
            log(f"golden run produced no digest ({result.ended_by}); its reports: {result.run_dir}")
            return None
        digests = {rank: event.get_str("digest") or "" for rank, event in finals.items()}
        # The lowest rank's (rank 0's) digest stands for the run where one digest is wanted.
        digest = next(iter(digests.values()))
        detections = [e.kind for e in result.history.of("detect.*")]
        golden = Golden(digest, detections, cached=False, digests=digests)
        entry = {
            "digest": digest,
            "digests": golden.digests_json(),
            "detections": detections,
            "run_dir": str(result.run_dir),
        }
        partial = cached.with_name(f".{cached.name}.{os.getpid()}.tmp")
        partial.write_text(json.dumps(entry))
        partial.replace(cached)
        return golden


@contextmanager
def _entry_lock(cached: Path, log: Callable[[str], None]) -> Iterator[None]:
    """Hold ``<entry>.lock`` exclusively (see the module doc); released when the holder ends, however."""
    with open(cached.with_suffix(".lock"), "a+b") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"golden run: another run is computing {cached.name}; waiting for it …")
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield  # the lock goes with the file's close


def _from_cache(path: Path) -> Golden | None:
    """The cached outcome in ``path``, or None when the file lacks something (an old file without per-rank
    ``digests`` is a miss: reading it as "no ranks" would compare nothing)."""
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(saved, dict):
        return None
    digest, detections, recorded = saved.get("digest"), saved.get("detections"), saved.get("digests")
    if not isinstance(digest, str) or not isinstance(detections, list) or not isinstance(recorded, dict):
        return None
    # The same parsing as a recorded runner.golden event, so the cache and the history cannot disagree.
    digests = golden_rank_digests(Event(ts_ns=0, kind=RUNNER_GOLDEN, data={"digests": recorded}))
    if digests is None:
        return None
    return Golden(digest, [str(d) for d in detections], cached=True, digests=digests)


def code_fingerprint(scenario: Scenario) -> str:
    """Hash of the code and environment that decide what the job computes, so a change to any of them
    invalidates the golden cache: mlchaos's own code (the in-job agent and guards run inside the job), the
    user's entry files (a torchrun script or module source; a command's ``.py`` arguments and script program:
    :func:`chaos.targets.factory.entry_files`) and the job's interpreter and launcher (path, Python and torch
    versions: :func:`chaos.targets.factory.job_identity`). The target's ``args``, ``python:`` and ``torchrun:``
    are in :meth:`Scenario.golden_key` (the whole target spec is). Other code the job imports is not hashed:
    use ``--no-golden-cache`` after changing it."""
    files: list[Path] = sorted(p for pkg in _OWN_PACKAGES for p in pkg.rglob("*.py"))
    files += entry_files(scenario)
    digest = hashlib.sha256()
    for path in files:
        # The path too: two entry files swapping contents are still a different job.
        digest.update(f"{path}\n".encode())
        digest.update(path.read_bytes())
    digest.update(job_identity(scenario).encode())
    return digest.hexdigest()[:12]
