"""Keep-alive HTTP/1.1 connections from the gateway to one replica (stdlib ``http.client``).

Contract: :meth:`Pool.request` sends one request and returns ``(status, body)``, or raises ``OSError`` /
``http.client.HTTPException`` (refused, reset, timed out, malformed). ``timeout`` bounds the connect and each
socket read; the replica answers in one piece, so that is the attempt's deadline in practice. A request
that fails on a REUSED connection before any answer (the replica closed it while idle, or was restarted)
is retried once on a fresh connection: predictions are idempotent, and a stale socket says nothing about
the replica's health. Thread-safe.
"""

from __future__ import annotations

import http.client
import threading


class Pool:
    def __init__(self, host: str, port: int, *, max_idle: int = 64) -> None:
        self.host = host
        self.port = port
        self.max_idle = max_idle
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def request(
        self, method: str, path: str, body: bytes | None, timeout: float, headers: dict[str, str] | None = None
    ) -> tuple[int, bytes]:
        conn, reused = self._take(timeout)
        try:
            return self._send(conn, method, path, body, headers)
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
            if not reused:
                raise
            self.clear()  # one stale socket means the others from the same server life are stale too
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        return self._send(conn, method, path, body, headers)

    def clear(self) -> None:
        """Close every idle connection (after the replica went away)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def _take(self, timeout: float) -> tuple[http.client.HTTPConnection, bool]:
        with self._lock:
            conn = self._idle.pop() if self._idle else None  # newest first: the least likely to be stale
        if conn is None:
            return http.client.HTTPConnection(self.host, self.port, timeout=timeout), False
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        return conn, True

    def _send(
        self,
        conn: http.client.HTTPConnection,
        method: str,
        path: str,
        body: bytes | None,
        headers: dict[str, str] | None,
    ) -> tuple[int, bytes]:
        try:
            conn.request(method, path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
            response = conn.getresponse()
            data = response.read()
        except BaseException:
            conn.close()
            raise
        kept = False
        if not response.will_close:
            with self._lock:
                if len(self._idle) < self.max_idle:
                    self._idle.append(conn)
                    kept = True
        if not kept:
            conn.close()
        return response.status, data


def fetch_once(host: str, port: int, method: str, path: str, body: bytes | None, timeout: float) -> tuple[int, bytes]:
    """One request on a connection of its own, closed afterwards: what probes use, so a probe tests that
    the replica accepts connections, not that an old socket is still open."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()
