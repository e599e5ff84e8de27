"""Settle the holds found expired (their process stopped renewing them): a reservation at
its estimate, a lease slice's unflushed part as used (or given back, on opt-in)."""

from __future__ import annotations

import time

from ..core.amounts import micro_to_usd
from ..store.leases_store import LeaseStore, is_slice
from ..store.records import ReservationRecord
from .state import ContextState


def reap(state: ContextState, expired: list[tuple[str, ReservationRecord]]) -> None:
    """Settle reservations whose worker stopped renewing them, at their estimate."""
    now = time.time()
    for reservation_id, record in expired:
        if is_slice(reservation_id):  # a slice: its unflushed part is charged as used
            LeaseStore(state.store).reclaim(state.path.root, reservation_id, record)
            continue
        lost = {"node_id": reservation_id, "kind": "llm", "operation_name": "(lease expired)",
                "start_ts": now, "end_ts": now, "status": "lost",
                "cost_usd": micro_to_usd(record.held_amount("usd")),
                "input_tokens": record.held_amount("tin"),
                "output_tokens": record.held_amount("tout")}
        state.store.reap(state.path.root, reservation_id, record, lost)
    state.coord.schedule_flush()
