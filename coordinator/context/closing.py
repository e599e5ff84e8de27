"""Closing and detaching a context's handle: its lease ended, its writes flushed, and (for
the owner's close) the context closed in Redis with its quota grants ended and its spend
recorded; Redis away leaves queued writes queued."""

from __future__ import annotations

import logging

from ..data import chain as data_chain
from ..quotas.hooks import end_quota_grants
from ..store.errors import UNAVAILABLE
from ..store.health import BackendDown
from .lease_registry import end_lease
from .state import ContextState

log = logging.getLogger("coordinator")


def close_context(state: ContextState) -> None:
    """ExecutionContext.close's work (idempotent)."""
    if state.closed:
        return
    data_chain.step_closed(state, state.coord, state.path, state.metadata)
    state.closed = True
    coord = state.coord
    try:
        end_lease(state)  # queued, not sent, while Redis is away
        if not coord.backend.allow(state.backend_key):
            raise BackendDown()
        state.store.flush(state.path.root)  # this tree's node only
        if state.owner and state.is_open():  # (a background open done first)
            m = state.metadata
            spent = state.store.close(state.path, coord.retention_s)
            end_quota_grants(coord, state.path)  # what the tree's grants left returns
            coord.schedule_flush()  # index writes a dead node left queued
            coord.views.add_closed_tree(
                spent, {"org": m.org_id, "team": m.team, "service": m.service},
                coord.retention_s, root=state.path.root)
    except UNAVAILABLE as exc:
        log.warning("closing %s: Redis unavailable (%s); queued writes stay queued and "
                    "open leases will charge their estimates", state.ctx_id, exc)
    coord.unregister(state)


def detach_context(state: ContextState) -> None:
    """ExecutionContext.detach's work (idempotent)."""
    if state.closed:
        return
    state.closed = True
    try:
        end_lease(state)
        if state.is_open():
            state.store.expire_context(state.path, state.coord.retention_s)
        else:
            state.store.flush()
    except UNAVAILABLE as exc:
        log.warning("detaching %s: Redis unavailable (%s); queued writes stay queued",
                    state.ctx_id, exc)
    state.coord.unregister(state)
