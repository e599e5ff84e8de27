"""Whether a settle or release is late: it may reach Redis after the trace of its
reservation's finish was trimmed (``bc:{R}:fin`` keeps an id 5 s at least, then only
among the latest 1000: lua/lib/finished_ids.lua). A late finish that finds no trace of its id is
taken as finished and charges nothing, so it can never charge twice (docs/bounds.md).

A finish is late when its op was first sent over ``LATE_AFTER_S`` ago (a repeat whose
first send may have landed), or when its reservation's lease was not confirmed within
half a lease (it may have lapsed, and the reaper charged the estimate)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any

LATE_AFTER_S = 2.0
"""A repeat sent later than this after the first send is late (under the 5 s floor of
lib/finished_ids.lua's FINISHED_FLOOR_MS, with room for the send itself, a hot-path timeout)."""


class Lateness:
    """The confirmed leases of this process's reservations, and the flag of each finish."""

    def __init__(self, lease_ms: int) -> None:
        self.lease_s = lease_ms / 1000
        self._confirmed: dict[str, float] = {}
        self._lock = threading.Lock()

    def confirm(self, reservation_ids: Iterable[str]) -> None:
        """These reservations are held now (reserved, or every lease renewed)."""
        now = time.monotonic()
        with self._lock:
            for reservation_id in reservation_ids:
                self._confirmed[reservation_id] = now

    def forget(self, reservation_id: str) -> None:
        self._confirmed.pop(reservation_id, None)

    def args(self, op: Any) -> list[Any]:
        """``op.args`` with its late flag (at ``op.late_at``) set as of this send."""
        now = time.monotonic()
        if not op.first_sent:
            op.first_sent = now
        confirmed = self._confirmed.get(op.reservation_id or "")
        late = (now - op.first_sent > LATE_AFTER_S
                or (confirmed is not None and now - confirmed > self.lease_s / 2))
        args = list(op.args)
        args[op.late_at] = "1" if late else "0"
        return args
