"""Reading streamed answers token by token (pure logic: bytes in, tokens, gaps, backends and outcomes out)."""

from __future__ import annotations

import json

from chaos.history.timeline import Event
from chaos.load.codec import Codec
from chaos.load.stream import StreamRead, count_stream, stream_fields
from chaos.load.stream_stats import stream_stats
from chaos.spec.load import LoadSpec


def _codec(stream: str, **fields: object) -> Codec:
    spec = LoadSpec.model_validate(
        {"url": "http://127.0.0.1:1/v1/chat", "rate": 1, "duration": 1, "stream": stream, **fields}
    )
    return Codec(spec)


def _chunk(content: str | None, backend: str | None = None, role: bool = False) -> bytes:
    delta: dict[str, object] = {"role": "assistant"} if role else {}
    if content is not None:
        delta["content"] = content
    doc: dict[str, object] = {"choices": [{"index": 0, "delta": delta}]}
    if backend is not None:
        doc["backend"] = backend
    return json.dumps(doc).encode()


def _sse(*payloads: bytes) -> bytes:
    return b"".join(b"data: " + p + b"\n\n" for p in payloads)


def test_sse_split_anywhere_counts_tokens_gaps_and_backends() -> None:
    body = (
        b": a comment\n\n"
        + _sse(_chunk(None, "a", role=True), _chunk("x ", "a"), _chunk("y ", "a"), _chunk("", "a"))
        + b"event: message\nid: 7\r\ndata: "
        + _chunk("z ", "b")
        + b"\r\n\r\n"
        + _sse(_chunk("w ", "a"), b"[DONE]", _chunk("after the end", "c"))
    )
    read = StreamRead(_codec("sse", served_by={"json": "backend"}), "header-backend", None)
    for k, byte in enumerate(body):  # one byte at a time: framing may split anywhere
        read.feed(bytes([byte]), float(k))
    assert read.done and read.tokens == 4
    assert read.backends == ["a", "b"] and read.backend() == "a"
    assert len(read.gaps) == 3 and all(g > 0 for g in read.gaps)
    fields = stream_fields(read, due=-1.0, status=200, session="s1")
    assert fields["ended"] == "complete" and fields["resumed"] is True and fields["session"] == "s1"
    assert read.first is not None and fields["ttft_s"] == round(read.first + 1.0, 6)


def test_multi_line_data_text_payloads_and_the_header_backend() -> None:
    read = StreamRead(_codec("sse", served_by={"header": "X-Backend"}), "gw", None)
    read.feed(b'data: {"choices": [{"delta":\ndata: {"content": "hi"}}]}\n\ndata: plain text\n\n', 1.0)
    read.feed(b'data: {"token": 3}\n\n', 1.5)
    assert read.tokens == 3 and read.backends == ["gw"] and read.gaps == [0.0, 0.5] and not read.done
    assert read.ended(timed_out=False) == "cut" and read.ended(timed_out=True) == "timeout"


def test_chunked_lines_end_with_the_body_and_degraded_per_event() -> None:
    codec = _codec("chunked", served_by={"json": "backend"}, degraded={"json": "degraded"})
    read = StreamRead(codec, None, None)
    read.feed(b'{"backend": "p", "choices": [{"delta": {"content": "a"}}]}\n{"backend": "p", "deg', 0.1)
    read.feed(b'raded": true, "choices": [{"delta": {"content": "b"}}]}\n\n{"backend": "q"}', 0.2)
    assert read.tokens == 2 and read.degraded is True and not read.done
    read.body_ended()  # the last line had no newline: it still counts
    assert read.done and read.tokens == 3 and read.backends == ["p", "q"]
    assert read.ended(timed_out=False) == "complete"


def test_nothing_streamed_and_the_totals() -> None:
    for status, ended in ((503, "error"), ("error", "error"), ("timeout", "timeout"), ("dropped_client", "error")):
        fields = stream_fields(None, 0.0, status, None)
        assert fields["ended"] == ended and fields["tokens"] == 0 and fields["ttft_s"] is None
        assert fields["backends"] == [] and fields["resumed"] is False and fields["gaps_s"] == []
    read = StreamRead(_codec("sse"), None, None)
    read.feed(_sse(_chunk(None, role=True)), 0.0)
    assert read.ended(timed_out=False) == "error"  # a 200 that ended before any token
    totals: dict[str, int | float] = {"complete": 0, "cut": 0, "resumed": 0, "tokens": 0}
    read.feed(_sse(_chunk("t")), 1.0)
    count_stream(totals, stream_fields(read, 0.0, "error", None))
    assert totals == {"complete": 0, "cut": 1, "resumed": 0, "tokens": 1}


def test_session_header_accept_and_body_placeholder() -> None:
    codec = _codec("sse", sessions=3, method="POST", body='{"user": "{session}", "n": {i}}')
    first, fourth = codec.payload(0, None).decode(), codec.payload(4, None).decode()
    assert "Accept: text/event-stream\r\n" in first and "X-Session: s0\r\n" in first and '"user": "s0"' in first
    assert "X-Session: s1\r\n" in fourth and '"user": "s1", "n": 4' in fourth
    plain = _codec("chunked", sessions=2, session_header="X-User", headers={"Accept": "*/*"})
    text = plain.payload(3, None).decode()
    assert "X-User: s1\r\n" in text and "Accept: */*" in text and "x-ndjson" not in text
    assert plain.payload(5, None) == plain.payload(3, None)  # cached per session


def test_stream_stats_over_events() -> None:
    def request(i: int, **data: object) -> Event:
        return Event(
            ts_ns=i, kind="load.request", source="load", data={"i": i, "scheduled_ns": i, "stream": True, **data}
        )

    events = [
        request(0, ended="complete", tokens=3, ttft_s=0.1, gaps_s=[0.01, 0.02], resumed=False),
        request(1, ended="complete", tokens=2, ttft_s=0.3, gaps_s=[0.05], resumed=True),
        request(2, ended="cut", tokens=1, ttft_s=0.2, gaps_s=[]),
        request(3, ended="error", tokens=0, ttft_s=None, gaps_s=[]),
        Event(ts_ns=9, kind="load.request", source="load", data={"i": 9, "status": 200}),  # not a stream
    ]
    s = stream_stats(events)
    assert s.streams == 4 and s.ended == {"complete": 2, "cut": 1, "error": 1} and s.resumed == 1 and s.tokens == 6
    assert (s.ttft_p50_s, s.ttft_p99_s, s.gap_p50_s, s.gap_max_s) == (0.2, 0.3, 0.02, 0.05)
