"""The environment a scenario's faults add to every process its target starts (e.g. the clock shim, preloaded).

An injector whose fault acts through the job's own processes says what they need (``job_env``, the
:class:`chaos.plugins.injector.JobEnv` capability); a scenario with a fault of that type gets it, once per type,
whether or not the fault ever fires. A scenario without such faults gets nothing: its job runs as it would alone.
"""

from __future__ import annotations

from pathlib import Path

from chaos.plugins import registry
from chaos.plugins.injector import JobEnv
from chaos.spec.scenario import Scenario


def fault_env(scenario: Scenario, run_dir: Path) -> dict[str, str]:
    """The variables the faults of ``scenario`` need in the job's processes, for the run in ``run_dir``."""
    env: dict[str, str] = {}
    for kind in dict.fromkeys(fault.type for fault in scenario.faults):
        injector = registry.injector(kind)
        if isinstance(injector, JobEnv):
            env.update(injector.job_env(run_dir))
    return env
