"""Lease renewal: extends the leases of this process's calls in flight every third of a
lease, so that only the calls of a process that died expire."""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..store.errors import RedisError

log = logging.getLogger("coordinator")


class LeaseRenewer:
    """Runs ``renew`` (the store's) every ``lease_ms / 3`` on the background timers until
    ``stopped()`` says so."""

    def __init__(self, renew: Callable[[], None], lease_ms: int,
                 call_later: Callable[[float, Callable[[], None]], None],
                 stopped: Callable[[], bool]) -> None:
        self._renew = renew
        self._period_s = lease_ms / 3000
        self._call_later = call_later
        self._stopped = stopped

    def start(self) -> None:
        self._call_later(self._period_s, self._run)

    def _run(self) -> None:
        if self._stopped():
            return
        try:
            self._renew()
        except RedisError as exc:
            log.warning("lease renewal failed: %s", exc)
        self._call_later(self._period_s, self._run)
