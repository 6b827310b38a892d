"""The byte plumbing of one Docker exec: the daemon's hijacked connection and its multiplexed frames.

``docker exec`` with a socket gives one connection: the process's stdin going in, its stdout and stderr
coming out as frames (an 8-byte header: stream 1 or 2, then the payload size). :class:`ExecConn` reads
those frames; :class:`FrameReader` turns their payloads into a byte stream. Nothing here imports the Docker
SDK: the connection object is whatever ``exec_start(socket=True)`` returned.
"""

from __future__ import annotations

import io
import socket
import struct
from collections.abc import Callable
from typing import Any

_HEADER = struct.Struct(">BxxxI")  # the exec stream's frame header: stream (1 stdout, 2 stderr), size


def exit_code(code: int) -> int:
    """The daemon's exit code, ``128 + signum`` read as ``-signum`` (Popen's convention)."""
    return -(code - 128) if 128 < code <= 128 + 64 else code


class ExecConn:
    """The hijacked connection of one exec: demultiplexed frames out, raw bytes in (the process's stdin)."""

    def __init__(self, raw: Any) -> None:
        self._raw = raw
        self._sock: Any = getattr(raw, "_sock", raw)
        self._buffer = b""
        # http.client may have read past the response headers into its buffer: the first frames live there.
        response = getattr(raw, "_response", None)
        reader = getattr(getattr(getattr(response, "raw", None), "_fp", None), "fp", None)
        if reader is not None and hasattr(reader, "read1") and hasattr(self._sock, "settimeout"):
            self._sock.settimeout(0)
            try:
                self._buffer = reader.read1(1 << 16) or b""
            except (BlockingIOError, OSError):
                self._buffer = b""
        self.settimeout(None)
        self.closed = False

    def settimeout(self, timeout: float | None) -> None:
        if hasattr(self._sock, "settimeout"):
            self._sock.settimeout(timeout)

    def _exactly(self, size: int) -> bytes | None:
        while len(self._buffer) < size:
            chunk: bytes = self._sock.recv(max(65536, size - len(self._buffer)))
            if not chunk:
                return None
            self._buffer += chunk
        data, self._buffer = self._buffer[:size], self._buffer[size:]
        return data

    def frame(self) -> tuple[int, bytes] | None:
        """The next ``(stream, payload)``, or None at EOF. socket timeouts propagate (TimeoutError)."""
        header = self._exactly(_HEADER.size)
        if header is None:
            return None
        stream, size = _HEADER.unpack(header)
        payload = self._exactly(size) if size else b""
        return None if payload is None else (stream, payload)

    def unread(self, frame: tuple[int, bytes]) -> None:
        """Put ``frame`` back in front, so the next :meth:`frame` returns it again (a peek)."""
        self._buffer = _HEADER.pack(frame[0], len(frame[1])) + frame[1] + self._buffer

    def send(self, data: bytes) -> None:
        self._sock.sendall(data)

    def shutdown_write(self) -> None:
        if isinstance(self._sock, socket.socket):
            self._sock.shutdown(socket.SHUT_WR)
        elif hasattr(self._sock, "shutdown_write"):  # a paramiko channel (ssh:// daemon URLs)
            self._sock.shutdown_write()

    def close(self) -> None:
        self.closed = True
        if isinstance(self._sock, socket.socket):
            try:
                self._sock.shutdown(socket.SHUT_RDWR)  # wakes a reader blocked in recv (close alone does not)
            except OSError:
                pass
        for thing in (self._sock, self._raw):
            try:
                thing.close()
            except OSError:
                pass


class FrameReader(io.RawIOBase):
    """An exec's stdout and stderr payloads as one raw byte stream (EOF when the exec's output closes)."""

    def __init__(self, conn: ExecConn, pending: bytes, on_eof: Callable[[], None]) -> None:
        super().__init__()
        self._conn = conn
        self._pending = pending
        self._on_eof = on_eof

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._pending:
            if self._conn.closed:
                return 0
            try:
                got = self._conn.frame()
            except OSError:
                got = None
            if got is None:
                self._on_eof()
                return 0
            self._pending = got[1]
        size = min(len(buffer), len(self._pending))
        buffer[:size] = self._pending[:size]
        self._pending = self._pending[size:]
        return size
