"""Waiting for what another process writes: a poll with a deadline, never a fixed sleep."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

POLL_S = 0.02


def until(check: Callable[[], T], what: str, timeout_s: float = 60.0) -> T:
    """The first truthy value ``check`` returns; AssertionError naming ``what`` and the
    last value seen if none comes within ``timeout_s`` (generous: CI machines are busy)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached within {timeout_s} s (last: {value!r})")
        time.sleep(POLL_S)
