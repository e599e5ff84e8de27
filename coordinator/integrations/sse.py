"""Server-sent events split from the bytes of a streamed response, each kept as the raw
bytes it came in (handed on unchanged) with its ``data`` decoded from JSON (pure).

A splitter made with ``text_deltas`` reads a Chat Completions text delta by its text alone
once it has seen an event of the same shape: the event's data is then a :class:`TextDelta`
(what metering reads of it) instead of the whole JSON. The shape is the data's text around
its ``"content"`` string; a shape is decoded once in full, with a marker in place of that
string, and accepted only when the marker is where metering reads the text (the rest of
the shape then decodes the same whatever the string holds). Any other event is decoded in
full, as without ``text_deltas``."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from json import decoder
from typing import Any, NamedTuple

from ..context.chunk_meter import text_delta_content

_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")
_MAX_BUFFER = 16 * 1024 * 1024
_MAX_SHAPES = 16
"""Shapes remembered per stream; past that (a stream whose events all differ around their
text), every event is decoded in full."""
_MARKER = "\ufdd0"  # a noncharacter: no text delta holds it
_UNSEEN, _OTHER = object(), object()
_scanstring: Callable[[str, int], tuple[str, int]] = decoder.scanstring  # type: ignore[attr-defined]


class Event(NamedTuple):
    """One event: its bytes (blank line included) and its data (None: not JSON). A named
    tuple: one is built per event, and a frozen dataclass's ``__init__`` costs more."""

    raw: bytes
    data: Any


class TextDelta(NamedTuple):
    """The data of a Chat Completions text delta read by its text alone: its ``model`` and
    its one choice's ``delta.content`` (see ``chunk_meter.text_delta_content``)."""

    model: Any
    text: str


class EventSplitter:
    """Feed it the body's bytes as they arrive; it returns the events completed so far."""

    def __init__(self, text_deltas: bool = False) -> None:
        self._buffer = b""
        self._shapes: dict[tuple[str, str], Any] | None = {} if text_deltas else None

    def feed(self, chunk: bytes) -> list[Event]:
        """The events that ``chunk`` completes (an event may span many chunks)."""
        buffer = self._buffer + chunk if self._buffer else chunk
        events, pos = [], 0
        search, data = _END.search, _data if self._shapes is None else self._data
        while (end := search(buffer, pos)) is not None:
            stop, after = end.span()
            events.append(Event(buffer[pos:after], data(buffer[pos:stop])))
            pos = after
        self._buffer = buffer[pos:] if pos else buffer
        if len(self._buffer) > _MAX_BUFFER:  # not an event stream: pass it on
            events.append(Event(self._buffer, None))
            self._buffer = b""
        return events

    def rest(self) -> bytes:
        """What is left after the last complete event (handed on at the end)."""
        rest, self._buffer = self._buffer, b""
        return rest

    def _data(self, block: bytes) -> Any:
        """``_data(block)``, or a :class:`TextDelta` for a text delta of a known shape."""
        if not block.startswith(b"data: {") or b"\n" in block or b"\r" in block:
            return _data(block)
        try:
            text = block[6:].decode()
        except UnicodeDecodeError:
            return None
        at = text.find('"content"')
        start = text.find('"', at + 9) if at >= 0 else -1
        if start >= 0:
            try:
                content, end = _scanstring(text, start + 1)
            except ValueError:  # not a string literal there
                return _loads(text)
            shape = (text[:start], text[end:])
            model = self._shapes.get(shape, _UNSEEN) if self._shapes is not None else _OTHER
            if model is _UNSEEN:
                model = self._learn(shape)
            if model is not _OTHER:
                return TextDelta(model, content)
        return _loads(text)

    def _learn(self, shape: tuple[str, str]) -> Any:
        """The model of a new shape's text deltas, or _OTHER: not a text delta (or not one
        this can tell: an escape or the marker outside the text)."""
        assert self._shapes is not None
        if len(self._shapes) >= _MAX_SHAPES:
            self._shapes = None  # the events differ around their text: no shape repeats
            return _OTHER
        prefix, suffix = shape
        model = _OTHER
        if not any("\\" in part or _MARKER in part for part in shape):
            # no other string in the shape can decode to the marker: where the marker is
            # read back, the event's own text is
            chunk = _loads(f'{prefix}"{_MARKER}"{suffix}')
            if text_delta_content(chunk) == _MARKER:
                model = chunk.get("model")
        self._shapes[shape] = model
        return model


def _data(block: bytes) -> Any:
    if block.startswith(b"data: {") and b"\n" not in block and b"\r" not in block:
        data = block[6:]  # the common event: one data line of JSON (no line scan)
    else:
        lines = [line[5:].removeprefix(b" ") for line in block.splitlines()
                 if line.startswith(b"data:")]
        if not lines:
            return None
        data = b"\n".join(lines)
    try:
        return _loads(data.decode())  # (a str skips json's encoding detection)
    except UnicodeDecodeError:
        return None


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:  # "[DONE]" and other non-JSON data
        return None
