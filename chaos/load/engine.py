"""The open-loop HTTP/1.1 client behind the load generator: one asyncio loop, keep-alive connections.

Contract:
- Sends follow :func:`chaos.spec.load.schedule` and nothing else. A request that finds ``max_in_flight``
  requests outstanding is recorded as ``dropped_client`` at its due time instead of waiting, so a slow
  server can never slow the sender (no coordinated omission).
- Latency and the timeout both count from the SCHEDULED send time, so the generator's own lateness shows up
  as latency (and separately as ``send_lag_s``) instead of vanishing.
- Every scheduled request becomes exactly one ``load.request`` event (see :mod:`chaos.load`), bracketed by
  one ``load.start`` and one ``load.end`` (totals and the generator's own CPU seconds).
- With ``stream`` set, a 2xx body is read as it arrives by :class:`~chaos.load.stream.StreamRead` (token
  times, backends); the request ends at the stream's end marker (``[DONE]`` for sse: the connection is reused
  once its body ends) or when the connection does. A stream that was not complete is ``status: "error"``.

HTTP/1.1 only (http and https), one request at a time per connection (no pipelining); idle connections are
reused newest-first. A reused connection that the server closed while idle is retried once on a fresh one,
as browsers and HTTP libraries do, so keep-alive expiry on the server does not read as errors.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from pydantic import JsonValue

from chaos.event_kinds import LOAD_END, LOAD_REQUEST, LOAD_START
from chaos.history.timeline import Event
from chaos.load.codec import Codec
from chaos.load.stream import StreamRead, count_stream, stream_fields, unfinished
from chaos.spec.load import LoadSpec, priority_sequence, schedule, session_of

__all__ = ["LOAD_END", "LOAD_REQUEST", "LOAD_START", "LoadEngine"]

_MAX_HEAD = 64 * 1024

# Response parser states.
_HEAD, _LENGTH, _CHUNKED, _UNTIL_CLOSE = range(4)


class _BadResponse(Exception):
    pass


class _Request:
    __slots__ = ("i", "due", "due_ns", "priority", "payload", "conn", "done", "retried", "sent_at", "timer", "stream")

    def __init__(self, i: int, due: float, due_ns: int, priority: str | None, payload: bytes) -> None:
        self.i = i
        self.due = due  # loop clock
        self.due_ns = due_ns  # wall clock, the harness timeline
        self.priority = priority
        self.payload = payload
        self.conn: _Conn | None = None
        self.done = False
        self.retried = False
        self.sent_at: float | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.stream: StreamRead | None = None  # set once a streaming request's 2xx head arrived


class _Conn(asyncio.Protocol):
    """One keep-alive connection carrying at most one request at a time, with an incremental parser."""

    def __init__(self, engine: LoadEngine) -> None:
        self.engine = engine
        self.transport: asyncio.Transport | None = None
        self.req: _Request | None = None
        self.reused = False
        self.got_bytes = False
        self.buf = bytearray()
        self.state = _HEAD
        self.status = 0
        self.headers: dict[str, str] = {}
        self.keep_alive = True
        self.need = 0
        self.body = bytearray()

    # -- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        req = self.req
        if req is None:  # bytes nobody asked for: the connection is out of step, drop it
            self.abort()
            return
        self.got_bytes = True
        self.buf += data
        try:
            self._parse()
        except (_BadResponse, ValueError, UnicodeDecodeError) as exc:
            self.req = None
            self.abort()
            self.engine._failed(req, f"bad response: {exc}"[:300])

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        req, self.req = self.req, None
        if req is None:
            self.engine._forget(self)
        elif self.state == _UNTIL_CLOSE and exc is None:
            if req.stream is not None:
                req.stream.body_ended()
            self.engine._responded(self, req, self.status, self.headers, bytes(self.buf), False)
        else:
            self.engine._lost(self, req, exc)

    # -- used by the engine
    def send(self, req: _Request) -> None:
        assert self.transport is not None
        self.req = req
        req.conn = self
        req.sent_at = self.engine.loop.time()
        req.stream = None
        self.got_bytes = False
        self.state = _HEAD
        self.buf.clear()
        self.transport.write(req.payload)

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _feed(self, stream: StreamRead, data: bytes | bytearray) -> None:
        stream.feed(data, self.engine.loop.time())
        req = self.req
        if stream.done and req is not None and not req.done:
            self.engine._answered(req, self.status)
            self.engine._draining.add(self)  # the body's last bytes may follow: then the connection is reused

    def _parse(self) -> None:
        buf = self.buf
        stream = self.req.stream if self.req is not None else None
        while True:
            if self.state == _HEAD:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(buf) > _MAX_HEAD:
                        raise _BadResponse("response head over 64 KiB")
                    return
                lines = buf[:end].decode("latin-1").split("\r\n")
                del buf[: end + 4]
                version, _, rest = lines[0].partition(" ")
                if not version.startswith("HTTP/1."):
                    raise _BadResponse(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
                status = int(rest[:3])
                if 100 <= status < 200:
                    continue  # interim response (100 Continue): the real one follows
                headers: dict[str, str] = {}
                for line in lines[1:]:
                    name, sep, value = line.partition(":")
                    if sep:
                        key = name.strip().lower()
                        headers[key] = f"{headers[key]}, {value.strip()}" if key in headers else value.strip()
                self.status, self.headers = status, headers
                connection = headers.get("connection", "").lower()
                self.keep_alive = "close" not in connection if version == "HTTP/1.1" else "keep-alive" in connection
                if self.engine.head_only or status in (204, 304):
                    self._complete(b"")
                    return
                if self.req is not None:
                    stream = self.req.stream = self.engine._stream_for(status, headers)
                if "chunked" in headers.get("transfer-encoding", "").lower():
                    self.state, self.body = _CHUNKED, bytearray()
                elif "content-length" in headers:
                    self.state, self.need = _LENGTH, int(headers["content-length"])
                else:
                    self.state, self.keep_alive = _UNTIL_CLOSE, False
            if self.state == _LENGTH:
                if stream is not None:
                    part = buf[: self.need]
                    self.need -= len(part)
                    del buf[: len(part)]
                    self._feed(stream, part)
                    if self.need:
                        return
                    stream.body_ended()
                    self._complete(b"")
                    return
                if len(buf) < self.need:
                    return
                self._complete(bytes(buf[: self.need]))
                return
            if self.state == _CHUNKED:
                while True:
                    eol = buf.find(b"\r\n")
                    if eol < 0:
                        return
                    size = int(bytes(buf[:eol]).split(b";", 1)[0].strip() or b"x", 16)
                    if size == 0:  # last chunk, then optional trailers and an empty line
                        if buf[eol + 2 : eol + 4] != b"\r\n" and buf.find(b"\r\n\r\n", eol) < 0:
                            return
                        if stream is not None:
                            stream.body_ended()
                        self._complete(bytes(self.body))
                        return
                    if len(buf) < eol + 2 + size + 2:
                        return
                    if stream is not None:
                        self._feed(stream, buf[eol + 2 : eol + 2 + size])
                    else:
                        self.body += buf[eol + 2 : eol + 2 + size]
                    del buf[: eol + 2 + size + 2]
            if self.state == _UNTIL_CLOSE:
                if stream is not None:
                    self._feed(stream, buf)
                    buf.clear()
                return  # the body ends when the server closes (connection_lost)

    def _complete(self, body: bytes) -> None:
        req, self.req = self.req, None
        self.state = _HEAD
        self.buf.clear()
        assert req is not None
        self.engine._responded(self, req, self.status, self.headers, body, self.keep_alive)


def _describe(exc: BaseException | None) -> str:
    if exc is None:
        return "connection closed before the response was complete"
    return f"{type(exc).__name__}: {exc}"[:300]


class LoadEngine:
    """Runs one :class:`LoadSpec` on the running asyncio loop; ``emit`` receives every event, in the loop.

    ``await engine.run()`` returns the totals (also the data of the ``load.end`` event). :meth:`stop` ends it
    early (call it in the loop's thread; :meth:`stop_threadsafe` from any other).
    """

    def __init__(
        self,
        spec: LoadSpec,
        emit: Callable[[Event], None],
        *,
        source: str = "load",
        on_start: Callable[[], None] | None = None,
    ) -> None:
        self.spec = spec
        self.emit = emit
        self.source = source
        self.on_start = on_start
        self.codec: Codec | None = None  # built by run(): it may read a body file
        self.head_only = spec.method == "HEAD"
        self.loop: asyncio.AbstractEventLoop  # set by run(); every other method runs inside it
        self._family = 0
        self._addr: tuple[str, int] = ("", 0)
        self._ssl: ssl.SSLContext | None = None
        self._sched = schedule(spec)
        self._prio = priority_sequence(spec)
        self._next: float | None = None
        self._i = 0
        self._mono0 = 0.0
        self._wall0 = 0
        self._idle: list[_Conn] = []
        self._draining: set[_Conn] = set()  # connections whose stream ended before their body did
        self._flight: set[_Request] = set()
        self._connecting: set[asyncio.Task[None]] = set()
        self._stopping = False
        self._sending_done = False
        self._tick_handle: asyncio.TimerHandle | None = None
        self._done: asyncio.Future[None] | None = None
        self._error: BaseException | None = None
        self.totals: dict[str, int | float] = dict.fromkeys(
            (
                "scheduled",
                "sent",
                "responded",
                "ok",
                "timeouts",
                "errors",
                "dropped_client",
                "cancelled",
                "retries",
                "connections",
            ),
            0,
        )
        if spec.stream is not None:
            self.totals.update(complete=0, cut=0, resumed=0, tokens=0)
        self.max_send_lag_s = 0.0

    # -- public
    async def run(self) -> dict[str, JsonValue]:
        self.loop = asyncio.get_running_loop()
        self._done = self.loop.create_future()
        self.loop.set_exception_handler(self._on_loop_error)
        self.codec = codec = Codec(self.spec)
        codec.payload(0, next(priority_sequence(self.spec)))  # a bad template fails here, not per request
        infos = await self.loop.getaddrinfo(codec.host, codec.port, type=socket.SOCK_STREAM)
        self._family, _, _, _, addr = infos[0]  # resolved once: no resolver call per connection
        self._addr = (str(addr[0]), int(addr[1]))
        if codec.tls:
            self._ssl = ssl.create_default_context()
            if not self.spec.verify_tls:
                self._ssl.check_hostname = False
                self._ssl.verify_mode = ssl.CERT_NONE
        cpu0 = time.thread_time()
        self._mono0, self._wall0 = self.loop.time(), time.time_ns()
        self.emit(self._start_event())
        if self.on_start is not None:
            self.on_start()
        self._next = next(self._sched, None)
        self._tick()
        try:
            await self._done
        finally:
            for conn in self._idle:
                conn.close()
            for conn in self._draining:
                conn.abort()
            for task in list(self._connecting):
                task.cancel()
        wall = self.loop.time() - self._mono0
        totals: dict[str, JsonValue] = {
            **self.totals,
            "cpu_s": time.thread_time() - cpu0,
            "wall_s": wall,
            "max_send_lag_s": self.max_send_lag_s,
            "stopped_early": self._stopping,
        }
        self.emit(
            Event.model_construct(ts_ns=time.time_ns(), kind=LOAD_END, source=self.source, rank=None, data=totals)
        )
        if self._error is not None:
            raise self._error
        return totals

    def stop(self, drain: bool = True) -> None:
        """Stop sending. ``drain``: let in-flight requests finish (each within its timeout); otherwise record
        them at once as ``cancelled``."""
        self._stopping = True
        if self._tick_handle is not None:
            self._tick_handle.cancel()
        self._sending_done = True
        if not drain:
            for req in list(self._flight):
                self._abandon(req, "cancelled")
        self._maybe_done()

    def stop_threadsafe(self, drain: bool = True) -> None:
        loop: asyncio.AbstractEventLoop | None = getattr(self, "loop", None)
        if loop is None:
            self._stopping = True  # not running yet: run() will send nothing
            return
        try:
            loop.call_soon_threadsafe(self.stop, drain)
        except RuntimeError:  # the loop already closed: the run is over
            pass

    # -- schedule
    def _tick(self) -> None:
        loop = self.loop
        now = loop.time()
        base = self._mono0
        while self._next is not None and base + self._next <= now and not self._stopping:
            self._fire(base + self._next)
            self._next = next(self._sched, None)
        if self._next is None or self._stopping:
            self._sending_done = True
            self._maybe_done()
        else:
            self._tick_handle = loop.call_at(base + self._next, self._tick)

    def _fire(self, due: float) -> None:
        i = self._i
        self._i += 1
        totals = self.totals
        totals["scheduled"] += 1
        priority = next(self._prio)
        due_ns = self._wall0 + round((due - self._mono0) * 1e9)
        if len(self._flight) >= self.spec.max_in_flight:
            totals["dropped_client"] += 1
            extra = self._extra(None, due, "dropped_client", i)
            self._emit_request(i, due_ns, None, "dropped_client", priority, None, None, None, None, extra)
            return
        assert self.codec is not None
        req = _Request(i, due, due_ns, priority, self.codec.payload(i, priority))
        self._flight.add(req)
        totals["sent"] += 1
        req.timer = self.loop.call_at(due + self.spec.timeout, self._abandon, req, "timeout")
        if self._idle:
            self._idle.pop().send(req)
        else:
            self._open(req)

    # -- connections
    def _open(self, req: _Request) -> None:
        task = self.loop.create_task(self._connect(req))
        self._connecting.add(task)
        task.add_done_callback(self._connecting.discard)

    async def _connect(self, req: _Request) -> None:
        if req.sent_at is None:
            req.sent_at = self.loop.time()
        try:
            _, conn = await self.loop.create_connection(
                partial(_Conn, self),
                self._addr[0],
                self._addr[1],
                family=self._family,
                ssl=self._ssl,
                server_hostname=self.codec.host if self.codec is not None and self._ssl is not None else None,
            )
        except OSError as exc:
            if not req.done:
                self._finish(req, "error", error=_describe(exc))
            return
        self.totals["connections"] += 1
        if req.done:  # timed out or cancelled while connecting: keep the connection for the next request
            self._park(conn)
        else:
            conn.send(req)

    def _park(self, conn: _Conn) -> None:
        if self._sending_done or conn.transport is None:
            conn.close()
        else:
            conn.reused = True
            self._idle.append(conn)

    def _forget(self, conn: _Conn) -> None:
        self._draining.discard(conn)
        if conn in self._idle:
            self._idle.remove(conn)

    def _stream_for(self, status: int, headers: dict[str, str]) -> StreamRead | None:
        """The reader of a response whose head just came: a streaming spec's 2xx answers only."""
        if self.spec.stream is None or not 200 <= status < 300:
            return None
        assert self.codec is not None
        backend, degraded = self.codec.read(headers, b"")
        return StreamRead(self.codec, backend, degraded)

    # -- outcomes
    def _responded(
        self, conn: _Conn, req: _Request, status: int, headers: dict[str, str], body: bytes, keep_alive: bool
    ) -> None:
        self._draining.discard(conn)
        if keep_alive:
            self._park(conn)
        else:
            conn.close()
        if req.done:
            return
        if req.stream is not None and not req.stream.done:  # the body ended without the stream's end marker
            self._finish(req, "error", error=unfinished(req.stream))
            return
        assert self.codec is not None
        backend, degraded = self.codec.read(headers, body) if req.stream is None else (None, None)
        self._answered(req, status, backend, degraded)

    def _answered(self, req: _Request, status: int, backend: str | None = None, degraded: bool | None = None) -> None:
        self.totals["responded"] += 1
        if 200 <= status < 400:
            self.totals["ok"] += 1
        self._finish(req, status, backend=backend, degraded=degraded)

    def _lost(self, conn: _Conn, req: _Request, exc: Exception | None) -> None:
        self._draining.discard(conn)
        if req.done:
            return
        if conn.reused and not conn.got_bytes and not req.retried:
            req.retried = True  # the server closed an idle keep-alive connection under us: retry once
            self.totals["retries"] += 1
            req.conn = None
            self._open(req)
            return
        stream = req.stream
        cut = stream is not None and stream.tokens > 0
        self._finish(req, "error", error=unfinished(stream, _describe(exc)) if stream and cut else _describe(exc))

    def _failed(self, req: _Request, error: str) -> None:
        if not req.done:
            self._finish(req, "error", error=error)

    def _abandon(self, req: _Request, status: str) -> None:
        if req.done:
            return
        conn, req.conn = req.conn, None
        if conn is not None:  # the answer may still come: this connection can never be reused
            conn.req = None
            conn.abort()
        self._finish(req, status)

    def _finish(
        self,
        req: _Request,
        status: int | str,
        *,
        backend: str | None = None,
        degraded: bool | None = None,
        error: str | None = None,
    ) -> None:
        req.done = True
        if req.timer is not None:
            req.timer.cancel()
        self._flight.discard(req)
        if status == "timeout":
            self.totals["timeouts"] += 1
        elif status == "error":
            self.totals["errors"] += 1
        elif status == "cancelled":
            self.totals["cancelled"] += 1
        now = self.loop.time()
        lag = None
        if req.sent_at is not None:
            lag = req.sent_at - req.due
            if lag > self.max_send_lag_s:
                self.max_send_lag_s = lag
        if req.stream is not None:  # who produced the tokens, whatever ended the stream
            backend, degraded = req.stream.backend(), req.stream.degraded
        extra = self._extra(req.stream, req.due, status, req.i)
        self._emit_request(req.i, req.due_ns, now - req.due, status, req.priority, backend, degraded, lag, error, extra)
        self._maybe_done()

    def _extra(self, stream: StreamRead | None, due: float, status: int | str, i: int) -> dict[str, JsonValue] | None:
        """A request's fields beyond the plain ones: its stream's (counted in the totals), or its session."""
        session = session_of(self.spec, i)
        if self.spec.stream is not None:
            return count_stream(self.totals, stream_fields(stream, due, status, session))
        return None if session is None else {"session": session}

    def _emit_request(
        self,
        i: int,
        due_ns: int,
        latency: float | None,
        status: int | str,
        priority: str | None,
        backend: str | None,
        degraded: bool | None,
        lag: float | None,
        error: str | None,
        extra: dict[str, JsonValue] | None = None,
    ) -> None:
        data: dict[str, JsonValue] = {
            "i": i,
            "scheduled_ns": due_ns,
            "latency_s": latency,
            "status": status,
            "backend": backend,
            "degraded": degraded,
            "priority": priority,
            "send_lag_s": lag,
        }
        if error is not None:
            data["error"] = error
        if extra is not None:
            data.update(extra)
        ts = due_ns if latency is None else due_ns + int(latency * 1e9)
        # Built without validation: every value above is already JSON-typed, and this is the hot path.
        self.emit(Event.model_construct(ts_ns=ts, kind=LOAD_REQUEST, source=self.source, rank=None, data=data))

    def _maybe_done(self) -> None:
        if self._sending_done and not self._flight and self._done is not None and not self._done.done():
            self._done.set_result(None)

    def _on_loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """A bug or a failing ``emit`` ends the run loudly (re-raised by run); network trouble stays per request."""
        exc = context.get("exception")
        if not isinstance(exc, Exception) or isinstance(exc, OSError):
            loop.default_exception_handler(context)
            return
        if self._error is None:
            self._error = exc
        self.stop(drain=False)

    def _start_event(self) -> Event:
        spec = self.spec
        data: dict[str, JsonValue] = {
            "url": spec.url,
            "method": spec.method,
            "rate": spec.rate,
            "pattern": spec.pattern if isinstance(spec.pattern, str) else spec.pattern.model_dump(mode="json"),
            "arrivals": spec.arrivals,
            "duration_s": spec.duration,
            "timeout_s": spec.timeout,
            "max_in_flight": spec.max_in_flight,
            "seed": spec.seed,
            "start_ns": self._wall0,
        }
        if spec.stream is not None:
            data["stream"] = spec.stream
            data["sessions"] = spec.sessions
        return Event.model_construct(ts_ns=self._wall0, kind=LOAD_START, source=self.source, rank=None, data=data)
