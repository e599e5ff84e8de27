"""Cost spent outside a wrapped call (a bill that arrives later), charged to a context and
every ancestor at once like a settle: ``ExecutionContext.propagate_child_cost``."""

from __future__ import annotations

import logging
import secrets
import time

from ..core.amounts import micro_to_usd, usd_to_micro
from ..core.vocabulary import NodeStatus
from ..errors import BackendUnavailableError, ContextNotFoundError, InvalidCostError
from ..models import MAX_USD, check_usd
from ..models_records import NodeFields
from ..store.charges import propagate
from ..store.errors import UNAVAILABLE
from .state import ContextState

log = logging.getLogger("coordinator")


def propagate_child_cost(state: ContextState, cost_usd: float) -> None:
    """Charge ``cost_usd`` to the context of ``state`` and every ancestor, atomically: a
    level that reaches its ceiling is stopped (``budget_exceeded``), and everything below
    it halts. The charge is recorded as a ``charge`` node of the context. Raises
    InvalidCostError for an amount that is not a number from 0 to 1e9 (nothing is
    charged). When Redis cannot be reached the charge is queued and sent when it answers
    (once); a context that could not be opened yet raises BackendUnavailableError."""
    try:
        micro = usd_to_micro(check_usd(cost_usd, "cost_usd"))
    except ValueError:
        raise InvalidCostError("cost_usd", cost_usd, MAX_USD) from None
    if micro == 0:
        return
    charge_id = secrets.token_hex(16)
    now = time.time()
    node: NodeFields = {"node_id": charge_id, "kind": "charge", "start_ts": now, "end_ts": now,
            "operation_name": "propagate_child_cost", "status": NodeStatus.OK,
            "cost_usd": micro_to_usd(micro)}
    try:
        state.ensure_open()
    except UNAVAILABLE as exc:  # no context in Redis to queue the charge for
        raise BackendUnavailableError("propagate_child_cost", exc) from exc
    try:
        stops = propagate(state.store, state.path, charge_id, ["usd", micro], node)
    except UNAVAILABLE as exc:
        log.warning("charge of %s to %s queued: Redis unavailable (%s)", cost_usd,
                    state.ctx_id, exc)
        state.coord.schedule_flush()
        return
    if stops is None:
        raise ContextNotFoundError(state.ctx_id)
    for stop in stops:
        state.handle_stop(stop.reason)
