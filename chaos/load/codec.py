"""What goes on the wire for each request, and what each response says about who served it.

:class:`Codec` turns request ``i`` of a :class:`LoadSpec` into HTTP/1.1 request bytes (method, target, Host,
the spec's headers, the priority and session headers, the body template with ``{i}`` / ``{priority}`` /
``{session}`` replaced; a streaming spec also asks for its stream format with ``Accept``) and reads the
``served_by`` and ``degraded`` rules off a response's headers and JSON body, or off one streamed event. It
knows nothing about sockets, so the rules work the same against any HTTP server.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from chaos.spec.load import BodyFile, HeaderField, HeaderMatch, JsonField, JsonMatch, LoadSpec, session_of

ACCEPT = {"sse": "text/event-stream", "chunked": "application/x-ndjson"}  # what a streaming spec asks for
_FALSY = frozenset({"", "0", "false", "no", "off"})
MISSING: Any = object()  # a JSON path that leads nowhere (distinct from a JSON null)


def lookup(doc: object, path: str) -> object:
    """``doc`` followed along a dotted path (``meta.backend``, ``choices.0.id``, optional leading ``$.``);
    list indices may be negative. :data:`MISSING` when any step does not exist."""
    for part in path.removeprefix("$.").split("."):
        if isinstance(doc, dict):
            doc = doc.get(part, MISSING)
        elif isinstance(doc, list) and part.lstrip("-").isdigit() and -len(doc) <= int(part) < len(doc):
            doc = doc[int(part)]
        else:
            return MISSING
        if doc is MISSING:
            return MISSING
    return doc


def truthy(value: object) -> bool:
    """Truthiness of a header or JSON value; the strings ``"", 0, false, no, off`` count as false."""
    if isinstance(value, str):
        return value.strip().lower() not in _FALSY
    return bool(value)


def _parse_json(body: bytes) -> object:
    try:
        return json.loads(body)
    except ValueError:
        return MISSING


class Codec:
    """Request bytes and response reading for one spec. Reads a body file at construction (an error then,
    not per request) and caches the bytes of requests that do not depend on ``i``."""

    def __init__(self, spec: LoadSpec) -> None:
        self.spec = spec
        parts = urlsplit(spec.url)
        self.host = parts.hostname or ""
        self.tls = parts.scheme == "https"
        self.port = parts.port or (443 if self.tls else 80)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._bodies: list[str] | None = None
        if isinstance(spec.body, BodyFile):
            lines = Path(spec.body.file).read_text(encoding="utf-8").splitlines()
            self._bodies = [line for line in lines if line.strip()]
            if not self._bodies:
                raise ValueError(f"body file {spec.body.file} has no non-blank line")
            sample = self._bodies[0]
        else:
            sample = spec.body or ""
        self._per_request = self._bodies is not None or "{i}" in sample
        self._cache: dict[tuple[str | None, str | None], bytes] = {}
        names = {name.lower() for name in spec.headers}
        head = [f"{spec.method} {target} HTTP/1.1"]
        if "host" not in names:
            head.append(f"Host: {self.host}" + ("" if self.port == (443 if self.tls else 80) else f":{self.port}"))
        if "user-agent" not in names:
            head.append("User-Agent: mlchaos-load")
        if spec.stream is not None and "accept" not in names:
            head.append(f"Accept: {ACCEPT[spec.stream]}")
        if spec.body is not None and "content-type" not in names:
            looks_json = sample.lstrip()[:1] in ("{", "[")
            head.append(f"Content-Type: {'application/json' if looks_json else 'text/plain; charset=utf-8'}")
        head += [f"{name}: {value}" for name, value in spec.headers.items()]
        self._head = "\r\n".join(head) + "\r\n"
        self._needs_json = isinstance(spec.served_by, JsonField) or isinstance(spec.degraded, JsonMatch)

    def payload(self, i: int, priority: str | None) -> bytes:
        """The complete request ``i`` (head and body) as bytes."""
        spec = self.spec
        session = session_of(spec, i)
        if not self._per_request and (cached := self._cache.get((priority, session))) is not None:
            return cached
        head = self._head
        if priority is not None and spec.priority_header is not None:
            head += f"{spec.priority_header}: {priority}\r\n"
        if session is not None:
            head += f"{spec.session_header}: {session}\r\n"
        if spec.body is None:
            body = b""
            if spec.method in ("POST", "PUT", "PATCH"):
                head += "Content-Length: 0\r\n"
        else:
            text = self._bodies[i % len(self._bodies)] if self._bodies is not None else str(spec.body)
            text = text.replace("{i}", str(i)).replace("{priority}", priority or "")
            body = text.replace("{session}", session or "").encode()
            head += f"Content-Length: {len(body)}\r\n"
        payload = (head + "\r\n").encode() + body
        if not self._per_request:
            self._cache[(priority, session)] = payload
        return payload

    def read(self, headers: dict[str, str], body: bytes) -> tuple[str | None, bool | None]:
        """``(backend, degraded)`` of one response; ``headers`` has lower-case names. The backend is None
        when the rule finds nothing; degraded is None when there is no rule."""
        spec = self.spec
        doc = _parse_json(body) if self._needs_json else MISSING
        backend: str | None = None
        rule = spec.served_by
        if isinstance(rule, HeaderField):
            backend = headers.get(rule.header.lower())
        elif isinstance(rule, JsonField):
            value = lookup(doc, rule.json_path)
            if value is not MISSING and value is not None:
                backend = value if isinstance(value, str) else json.dumps(value)
        degraded: bool | None = None
        match = spec.degraded
        if isinstance(match, HeaderMatch):
            text = headers.get(match.header.lower())
            if match.value is None:
                degraded = text is not None and truthy(text)
            else:
                degraded = text is not None and text.strip().lower() == match.value.strip().lower()
        elif isinstance(match, JsonMatch):
            value = lookup(doc, match.json_path)
            if match.value is None:
                degraded = value is not MISSING and truthy(value)
            else:
                degraded = value is not MISSING and value == match.value
        return backend, degraded

    def event_backend(self, doc: object) -> str | None:
        """The backend one streamed event names by a ``{json: path}`` served_by rule (None otherwise, or when
        the event does not name one)."""
        rule = self.spec.served_by
        if not isinstance(rule, JsonField):
            return None
        value = lookup(doc, rule.json_path)
        if value is MISSING or value is None:
            return None
        return value if isinstance(value, str) else json.dumps(value)

    def event_degraded(self, doc: object) -> bool:
        """Whether one streamed event is marked degraded by a ``{json: path}`` degraded rule."""
        match = self.spec.degraded
        if not isinstance(match, JsonMatch):
            return False
        value = lookup(doc, match.json_path)
        if match.value is None:
            return value is not MISSING and truthy(value)
        return value is not MISSING and value == match.value
