"""The SSE splitter of the SDK transport (pure): events split across chunks and with any
line ending, each handed on as the bytes it came in, its data read from JSON whether it
came on one line (the fast path) or on several."""

from __future__ import annotations

from coordinator.integrations.sse import EventSplitter


def _events(*chunks: bytes) -> list[tuple[bytes, object]]:
    splitter = EventSplitter()
    out = [(e.raw, e.data) for c in chunks for e in splitter.feed(c)]
    assert splitter.rest() == b""
    return out


def test_one_line_events_across_chunks() -> None:
    got = _events(b'data: {"a": 1}\n\ndata: {"b"', b': 2}\n\n', b"data: [DONE]\n\n")
    assert got == [(b'data: {"a": 1}\n\n', {"a": 1}), (b'data: {"b": 2}\n\n', {"b": 2}),
                   (b"data: [DONE]\n\n", None)]


def test_other_shapes_take_the_line_by_line_reading() -> None:
    got = _events(b'event: delta\r\ndata: {"a":\r\ndata: 1}\r\n\r\n',
                  b'data:{"c": 3}\n\n', b": a comment\n\n", b'data: {"d": "\xff"}\n\n',
                  b'data: {"e": 5}\r\r')
    assert [data for _, data in got] == [{"a": 1}, {"c": 3}, None, None, {"e": 5}]
    assert got[0][0] == b'event: delta\r\ndata: {"a":\r\ndata: 1}\r\n\r\n'
