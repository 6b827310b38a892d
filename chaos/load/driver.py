"""The runner's side of a scenario's ``load:``: start it at the target, know when it ended, stop it.

Every request event goes straight into the run's history (from the generator's reader thread; History
appends are locked). The driver remembers when the last event arrived, which the runner counts as progress:
a serving target has no training steps, its requests are its sign of life.
"""

from __future__ import annotations

import time

from chaos.history.timeline import Event, History
from chaos.load.run import LoadRun
from chaos.spec.load import LoadSpec, ScenarioLoad


class LoadDriver:
    """One scenario load for one run: :meth:`start` once the target is ready, then poll :meth:`finished`."""

    def __init__(self, spec: ScenarioLoad, history: History, seed: int) -> None:
        self.spec = spec
        self.history = history
        self.seed = seed
        self.resolved: LoadSpec | None = None
        self.last_activity = time.monotonic()
        self._run: LoadRun | None = None

    def start(self, base_url: str | None) -> LoadSpec:
        """Resolve the URL against ``base_url`` (the target's address) and start sending; returns the spec."""
        self.resolved = self.spec.resolve(base_url, self.seed)
        self._run = LoadRun(self.resolved, history=self.history, on_event=self._touch, source="load")
        self._run.start()
        self.last_activity = time.monotonic()
        return self.resolved

    def _touch(self, _event: Event) -> None:
        self.last_activity = time.monotonic()

    @property
    def started(self) -> bool:
        return self._run is not None

    def finished(self) -> bool:
        """True once the load has sent everything and every answer (or timeout) is recorded. Raises what the
        generator raised, if it failed."""
        return self._run is not None and self._run.wait(0)

    def stop(self) -> None:
        """Stop sending at once (in-flight requests are recorded as cancelled); safe to call at any time."""
        if self._run is not None and self._run.running:
            self._run.stop(drain=False, timeout=15)
