"""The flusher: sends the queued writes in the background shortly after they were queued,
retrying while Redis is unreachable."""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..store.errors import RedisError
from .settings import FLUSH_AFTER_S

log = logging.getLogger("coordinator")

RETRY_AFTER_S = 0.5


class Flusher:
    """Schedules ``flush`` (the store's) on the background timers, at most once at a time."""

    def __init__(self, flush: Callable[[], None],
                 call_later: Callable[[float, Callable[[], None]], None]) -> None:
        self._flush = flush
        self._call_later = call_later
        self._scheduled = False

    def schedule(self) -> None:
        """Make sure queued writes are sent within FLUSH_AFTER_S."""
        if self._scheduled:
            return
        self._scheduled = True
        self._call_later(FLUSH_AFTER_S, self._run)

    def _run(self) -> None:
        self._scheduled = False
        try:
            self._flush()
        except RedisError as exc:
            log.warning("write-behind flush failed, retrying: %s", exc)
            self._scheduled = True
            self._call_later(RETRY_AFTER_S, self._run)
