"""Server-sent events split from the bytes of a streamed response, each kept as the raw
bytes it came in (handed on unchanged) with its ``data`` decoded from JSON (pure)."""

from __future__ import annotations

import json
import re
from typing import Any, NamedTuple

_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")
_MAX_BUFFER = 16 * 1024 * 1024


class Event(NamedTuple):
    """One event: its bytes (blank line included) and its data (None: not JSON). A named
    tuple: one is built per event, and a frozen dataclass's ``__init__`` costs more."""

    raw: bytes
    data: Any


class EventSplitter:
    """Feed it the body's bytes as they arrive; it returns the events completed so far."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, chunk: bytes) -> list[Event]:
        """The events that ``chunk`` completes (an event may span many chunks)."""
        buffer = self._buffer + chunk if self._buffer else chunk
        events, pos = [], 0
        search = _END.search
        while (end := search(buffer, pos)) is not None:
            stop, after = end.span()
            events.append(Event(buffer[pos:after], _data(buffer[pos:stop])))
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
        return json.loads(data.decode())  # (a str skips json's encoding detection)
    except ValueError:  # "[DONE]" and other non-JSON data (UnicodeDecodeError included)
        return None
