"""The sync twins generated from their async source, httpcore's ``unasync`` way: the
source is the async file; its sync twin is the same text with ``async``/``await`` dropped
and the async names replaced by their sync ones. The generated files are checked in, and
tests/unit/test_unasync.py fails when one is stale. Regenerate after editing a source:
``python -m tests.support.unasync``."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PAIRS = {"coordinator/integrations/async_transport.py": "coordinator/integrations/transport.py"}
"""Each async source and the sync file generated from it."""

HEADER = ("# Generated from {source} by tests/support/unasync.py: edit that file, then run\n"
          "# `python -m tests.support.unasync`.\n")
"""The first lines of a generated file."""

NAMES = {
    "AsyncBudgetTransport": "BudgetTransport",
    "AsyncMeteredBody": "MeteredBody",
    "AsyncBaseTransport": "BaseTransport",
    "AsyncHTTPTransport": "HTTPTransport",
    "AsyncByteStream": "SyncByteStream",
    "AsyncIterator": "Iterator",
    "handle_async_request": "handle_request",
    "__aiter__": "__iter__",
    "aclose": "close",
    "aget_snapshot": "get_snapshot",
    "arun_steps": "run_steps",
    "asend_request": "send_request",
}
"""Async names and their sync twins (whole words only)."""

_IMPORT = re.compile(r"^(from \S+ import )([\w, ]+)$", re.MULTILINE)
_KEYWORDS = [(re.compile(r"\bawait "), ""), (re.compile(r"\basync (def|for|with)\b"), r"\1")]
_NAMES = re.compile(r"\b(" + "|".join(map(re.escape, NAMES)) + r")\b")


def unasync(source: str, name: str) -> str:
    """The sync twin of the async source text of the file ``name``."""
    for pattern, replacement in _KEYWORDS:
        source = pattern.sub(replacement, source)
    text = _NAMES.sub(lambda m: NAMES[m.group(1)], source)
    return HEADER.format(source=name) + _IMPORT.sub(_sorted_names, text)


def _sorted_names(line: re.Match[str]) -> str:
    """An import line whose names a replacement put out of order, sorted as ruff's isort
    sorts them (constants, classes, then functions)."""
    names = sorted(line.group(2).split(", "), key=lambda n: (
        0 if n.isupper() else 1 if n[0].isupper() else 2, n))
    return line.group(1) + ", ".join(names)


def stale() -> list[str]:
    """The generated files that differ from what their source generates."""
    return [target for source, target in PAIRS.items()
            if (ROOT / target).read_text() != _generated(source)]


def _generated(source: str) -> str:
    return unasync((ROOT / source).read_text(), Path(source).name)


def main() -> None:
    for source, target in PAIRS.items():
        (ROOT / target).write_text(_generated(source))
        print(f"{source} -> {target}")


if __name__ == "__main__":
    main()
