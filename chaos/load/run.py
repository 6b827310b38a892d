"""Running a load alongside something else: :class:`LoadRun` drives one :class:`LoadSpec` in the background.

``isolation="process"`` (the default) runs ``python -m chaos.load --emit`` in a child process that streams
its events back as JSON lines. The timestamps are taken in the child, so a busy harness can delay their
delivery but never skew what they say: the child's heap stays small and its collector pauses short, where a
harness that holds a large history (or torch) pauses its whole process for tens of ms per full collection,
and in ``isolation="thread"`` those pauses and GIL waits land in the load's latencies (see BENCHMARKS.md).
``isolation="thread"`` runs the asyncio loop in a daemon thread of this process: no start-up cost (~0.3 s
for the child), fine for tests and modest rates. Either way every event goes, in order of completion, to the
``history`` (if given), to ``on_event`` (if given; called from a background thread) and, when
``buffer`` is on, to :meth:`LoadRun.poll_events`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from functools import partial
from pathlib import Path
from typing import Literal

from pydantic import JsonValue

from chaos.cluster.base import die_with_parent
from chaos.history.timeline import Event, History
from chaos.load.engine import LOAD_END, LOAD_START, LoadEngine
from chaos.spec.load import LoadSpec

_ROOT = str(Path(__file__).resolve().parents[2])  # the folder holding the chaos package


@dataclass(eq=False)
class LoadRun:
    """One background load run: ``start()``, then ``poll_events()`` as often as you like, then ``stop()``
    (or ``wait()`` for the spec's duration to pass). Usable as a context manager (stops without draining).

    ``buffer`` defaults to on only when neither ``history`` nor ``on_event`` is given, so a long run feeding a
    history does not also keep a second copy of every event for a poller that never comes.
    """

    spec: LoadSpec
    _: KW_ONLY
    history: History | None = None
    on_event: Callable[[Event], None] | None = None
    source: str = "load"
    isolation: Literal["thread", "process"] = "process"
    buffer: bool | None = None  # None: resolved in __post_init__
    totals: dict[str, JsonValue] | None = field(init=False, default=None)  # the load.end event's data, once it came
    start_ns: int | None = field(init=False, default=None)
    _events: deque[Event] = field(init=False, default_factory=deque)
    _started: threading.Event = field(init=False, default_factory=threading.Event)
    _finished: threading.Event = field(init=False, default_factory=threading.Event)
    _error: BaseException | None = field(init=False, default=None)
    _thread: threading.Thread | None = field(init=False, default=None)
    _engine: LoadEngine | None = field(init=False, default=None)
    _proc: subprocess.Popen[bytes] | None = field(init=False, default=None)
    _pump_cpu: float = field(init=False, default=0.0)
    _stop_requested: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        if self.buffer is None:
            self.buffer = self.history is None and self.on_event is None

    # -- lifecycle
    def start(self, timeout: float = 30.0) -> LoadRun:
        """Start sending; returns once the first send is scheduled (``load.start`` delivered)."""
        if self._thread is not None:
            raise RuntimeError("this LoadRun was already started")
        if self.isolation == "thread":
            self._thread = threading.Thread(target=self._run_thread, name=f"load:{self.source}", daemon=True)
        else:
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, env.get("PYTHONPATH")) if p)
            argv = [
                sys.executable,
                "-m",
                "chaos.load",
                "--emit",
                "--source",
                self.source,
                "--spec-json",
                self.spec.model_dump_json(by_alias=True),
            ]
            # It dies with the harness (even a SIGKILLed one): a load left sending would hit the next run's fleet.
            # SIGKILL, not its SIGTERM (which drains: waits for the requests in flight, then reports them to a
            # harness that is gone; with a frozen server behind them it never ended: found by scripts/kill_trials.py).
            self._proc = subprocess.Popen(
                argv,
                stdout=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                env=env,
                preexec_fn=partial(die_with_parent, signal.SIGKILL),
            )
            self._thread = threading.Thread(target=self._pump, name=f"load-pump:{self.source}", daemon=True)
        self._thread.start()
        if not self._started.wait(timeout):
            self.stop(drain=False, timeout=5)
            raise TimeoutError(f"the load generator did not start within {timeout}s")
        self._raise()
        return self

    def poll_events(self) -> list[Event]:
        """Events delivered since the last poll, in delivery order (empty when ``buffer`` is off)."""
        out = []
        events = self._events
        while events:
            out.append(events.popleft())
        return out

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the run to end by itself; True when it has. Re-raises a failure of the generator."""
        done = self._finished.wait(timeout)
        self._raise()
        return done

    def stop(self, *, drain: bool = True, timeout: float | None = None) -> dict[str, JsonValue] | None:
        """Stop sending and wait for the end (``drain``: in-flight requests finish within their timeout;
        otherwise they are recorded as ``cancelled`` at once). Returns the totals. Safe to call twice."""
        self._stop_requested = True
        if self._engine is not None:
            self._engine.stop_threadsafe(drain)
        elif self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM if drain else signal.SIGINT)
        limit = self.spec.timeout + 10 if timeout is None else timeout
        if not self._finished.wait(limit) and self._proc is not None:
            self._proc.kill()
            self._finished.wait(5)
        self._raise()
        return self.totals

    @property
    def running(self) -> bool:
        return self._thread is not None and not self._finished.is_set()

    def cpu_seconds(self) -> float | None:
        """The generator's own CPU time for the run: its event loop, plus (process mode) this process's
        thread that reads the child's events. None until the run has ended."""
        if self.totals is None or not isinstance(cpu := self.totals.get("cpu_s"), (int, float)):
            return None
        return float(cpu) + self._pump_cpu

    def __enter__(self) -> LoadRun:
        return self.start() if self._thread is None else self

    def __exit__(self, *exc: object) -> None:
        if self.running:
            self.stop(drain=False)

    # -- internals
    def _deliver(self, event: Event) -> None:
        if event.kind == LOAD_START:
            start = event.data.get("start_ns")
            self.start_ns = start if isinstance(start, int) else event.ts_ns
        elif event.kind == LOAD_END:
            self.totals = dict(event.data)
        if self.history is not None:
            self.history.append(event)
        if self.on_event is not None:
            self.on_event(event)
        if self.buffer:
            self._events.append(event)

    def _run_thread(self) -> None:
        loop = asyncio.new_event_loop()
        try:
            self._engine = LoadEngine(self.spec, self._deliver, source=self.source, on_start=self._started.set)
            if self._stop_requested:
                return
            loop.run_until_complete(self._engine.run())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller by wait()/stop()
            self._error = exc
        finally:
            loop.close()
            self._finished.set()
            self._started.set()

    def _pump(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        cpu0 = time.thread_time()
        try:
            for line in self._proc.stdout:
                if line.strip():
                    event = Event.model_validate_json(line)
                    self._deliver(event)
                    if event.kind == LOAD_START:
                        self._started.set()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller by wait()/stop()
            self._error = exc
            self._proc.kill()
        finally:
            self._pump_cpu = time.thread_time() - cpu0
            code = self._proc.wait()
            if self._error is None and self.totals is None:
                killed = self._stop_requested and code in (-signal.SIGTERM, -signal.SIGINT, -signal.SIGKILL)
                if not killed:
                    self._error = RuntimeError(f"the load generator process exited with {code} (see its stderr)")
            self._finished.set()
            self._started.set()

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error
