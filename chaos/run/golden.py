"""The golden (fault-free) run a scenario's lineage checks compare against, cached per job, seed and code.

``matches_golden`` needs what the same job with the same seed ends with when nothing goes wrong. Running it
costs as much as the scenario itself, so its outcome is cached under ``<report root>/.golden/`` keyed by
the scenario's golden key (target, seed, data) and a fingerprint of the code that runs inside the job.
The run itself is the caller's (the runner passes a fault-free ``execute``), so this module stays free of
the orchestrator.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from chaos.history.timeline import TARGET_DIGEST, History
from chaos.spec.scenario import Scenario
from chaos.targets.factory import entry_file

# mlchaos's own code that runs inside the job (in-job agent, guards, reference targets, injectors).
_OWN_PACKAGES = (Path(__file__).resolve().parents[1], Path(__file__).resolve().parents[2] / "injectors")


@dataclass(frozen=True)
class Golden:
    """What the fault-free run ended with: its digest and every detection it raised (false alarms)."""

    digest: str
    detections: list[str]
    cached: bool


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
    what it ended with. None when that run produced no model digest (its reports stay in ``cache_dir``)."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    cached = cache_dir / f"{scenario.golden_key()}-{code_fingerprint(scenario)}.json"
    if use_cache and cached.exists():
        saved = json.loads(cached.read_text())
        if isinstance(saved.get("digest"), str) and isinstance(saved.get("detections"), list):
            return Golden(saved["digest"], [str(d) for d in saved["detections"]], cached=True)
    log("golden run: same job and seed, no faults …")
    result = run_fault_free(scenario.without_faults(), cache_dir)
    digests = result.history.of(TARGET_DIGEST)
    if not digests or result.ended_by.startswith(("no progress", "max_duration")):
        log(f"golden run produced no digest ({result.ended_by}); its reports: {result.run_dir}")
        return None
    # Rank 0's (or the lowest rank's) last digest: the model the job ended with.
    first = min(digests, key=lambda e: (e.rank if e.rank is not None else 0, -e.ts_ns))
    digest = first.get_str("digest")
    if digest is None:
        return None
    detections = [e.kind for e in result.history.of("detect.*")]
    cached.write_text(json.dumps({"digest": digest, "detections": detections, "run_dir": str(result.run_dir)}))
    return Golden(digest, detections, cached=False)


def code_fingerprint(scenario: Scenario) -> str:
    """Hash of the job's entry file and of mlchaos's own code (the in-job agent and guards run inside the job),
    so an edited trainer or guard invalidates the golden cache. Other code the job imports is not hashed:
    use ``--no-golden-cache`` after changing it."""
    files: list[Path] = sorted(p for pkg in _OWN_PACKAGES for p in pkg.rglob("*.py"))
    entry = entry_file(scenario)
    if entry is not None:
        files.append(entry)
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]
