"""An HTTP endpoint someone else runs (``target: {type: http, url: ...}``): mlchaos starts nothing, waits
until the endpoint answers, then drives the scenario's load at it while faults hit its replicas (over SSH,
Docker or on this machine, selected by ``hosts`` and process ``name``/``pid``).

The run ends when the load ends (or a safety limit is reached); "stopping" this target only ends the wait.
"""

from __future__ import annotations

import http.client
import threading
import time
from urllib.parse import urlsplit

from chaos.event_kinds import TARGET_EXIT, TARGET_READY
from chaos.history.timeline import Event, now_ns
from chaos.spec.targets import HttpTarget


class HttpJob:
    """The Target for :class:`HttpTarget`: reports ``target.ready`` once the endpoint answers, ``target.exit``
    (code 1, with the last error) if it never does within ``ready_timeout``."""

    ready_event = TARGET_READY

    def __init__(self, spec: HttpTarget) -> None:
        self.spec = spec
        self._events: list[Event] = []
        self._lock = threading.Lock()
        self._code: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return self.spec.url

    def start(self) -> None:
        self._thread = threading.Thread(target=self._wait_ready, name="http-target-ready", daemon=True)
        self._thread.start()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.spec.ready_timeout
        error = ""
        while not self._stop.is_set():
            try:
                status = _get(self.spec.url + (self.spec.health or "/"), timeout=2.0)
                if self.spec.health is None or 200 <= status < 400:
                    self._push(Event(ts_ns=now_ns(), kind=TARGET_READY, source="runner", data={"url": self.url}))
                    return
                error = f"{self.spec.health} answered {status}"
            except OSError as exc:
                error = str(exc) or type(exc).__name__
            if time.monotonic() > deadline:
                self._code = 1
                reason = f"{self.url} not ready within {self.spec.ready_timeout:g}s: {error}"
                self._push(Event(ts_ns=now_ns(), kind=TARGET_EXIT, source="runner", data={"code": 1, "error": reason}))
                return
            self._stop.wait(0.5)

    def _push(self, event: Event) -> None:
        with self._lock:
            self._events.append(event)

    def poll_events(self) -> list[Event]:
        with self._lock:
            events, self._events = self._events, []
        return events

    def exit_code(self) -> int | None:
        return self._code

    def stop(self, grace: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=grace)

    def describe(self) -> str:
        return f"http endpoint {self.url}"


def _get(url: str, timeout: float) -> int:
    parts = urlsplit(url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.hostname or "", parts.port, timeout=timeout)
    try:
        conn.request("GET", (parts.path or "/") + (f"?{parts.query}" if parts.query else ""))
        return conn.getresponse().status
    finally:
        conn.close()
