"""Settle the holds found expired (their process stopped renewing them): a reservation at
its estimate, a lease slice's unflushed part as used (or given back, on opt-in)."""

from __future__ import annotations

import time

from ..core.amounts import micro_to_usd
from ..core.paths import Path
from ..core.vocabulary import NodeStatus
from ..models_records import NodeFields
from ..store.leases_store import LeaseStore, is_slice
from ..store.requests import Expired
from .state import ContextState


def reap(state: ContextState, path: Path, expired: Expired) -> None:
    """Queue the settles of holds of ``path``'s tree whose worker stopped renewing them:
    a reservation at its estimate, a slice's unflushed part as used."""
    now = time.time()
    for reservation_id, record in expired:
        if is_slice(reservation_id):  # a slice: its unflushed part is charged as used
            LeaseStore(state.store).reclaim(path.root, reservation_id, record)
            continue
        lost: NodeFields = {
            "node_id": reservation_id, "kind": "llm", "operation_name": "(lease expired)",
            "start_ts": now, "end_ts": now, "status": NodeStatus.LOST,
            "cost_usd": micro_to_usd(record.held_amount("usd")),
            "input_tokens": record.held_amount("tin"),
            "output_tokens": record.held_amount("tout")}
        state.store.reap(path.root, reservation_id, record, lost)
    state.coord.schedule_flush()
