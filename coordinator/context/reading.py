"""Reading a context back: its snapshot (or the last one read, while Redis is away; or
any context's, located by id), the limits in force over its path, and the error a limit
raises in the exception style."""

from __future__ import annotations

from ..core.amounts import (
    ms_to_datetime,
    remaining_tokens,
    remaining_usd,
    remaining_usd_fraction,
)
from ..core.paths import Path, stored_ids
from ..core.snapshots import build_snapshot
from ..core.vocabulary import StopReason
from ..errors import BackendUnavailableError, ContextNotFoundError, PromptEvaluationError
from ..models import ActiveLimits, ContextSnapshot
from ..runtime.coordinator import Coordinator
from ..store.errors import UNAVAILABLE
from ..store.health import BackendDown
from ..store.tree import State
from .state import ContextState

PHASES: dict[str, str] = {StopReason.TIMEOUT: "deadline",
                          StopReason.TOKEN_BUDGET_EXCEEDED: "token_budget"}
"""The ``phase`` of a PromptEvaluationError by stop reason (else ``halted``)."""


def snapshot(state: ContextState) -> ContextSnapshot:
    """The context's current state, read from Redis (after this process's queued writes).
    When Redis is unreachable, the last one read (see :func:`offline_snapshot`)."""
    def read() -> State:
        state.ensure_open()
        return state.store.read_state(state.path)

    try:  # under the breaker: a stall seen here makes every call fail fast too
        hashes, nodes, events, now = state.coord.backend.guard(read, state.backend_key)
    except UNAVAILABLE:
        return offline_snapshot(state)
    snap = build_snapshot(state.path, hashes, nodes, events, now, state.offline_events)
    state.last_snapshot = snap
    return snap


def offline_snapshot(state: ContextState) -> ContextSnapshot:
    """The last snapshot read, with the events recorded and a stop seen here since."""
    last = state.last_snapshot
    events = [*(last.events if last else []), *state.offline_events]
    if last is not None:
        update: dict[str, object] = {"events": events}
        if state.stopped is not None and last.status == "running":
            update.update(aborted=True, abort_reason=state.stopped, status="stopped")
        return last.model_copy(update=update)
    return ContextSnapshot(
        chain_id=state.ctx_id, request_id=state.metadata.request_id, step_count=0,
        cost_usd_accumulated=0.0, retries_used=0, aborted=state.stopped is not None,
        abort_reason=state.stopped, elapsed_ms=0.0, nodes=[], events=events,
        parent_chain_id=state.path.parent_id, root_chain_id=state.path.root,
        metadata=state.metadata,
    )


def active_limits(state: ContextState) -> ActiveLimits:
    """The limits in force: the tightest over the context and its ancestors."""
    hashes, _, _, now = state.store.read_state(state.path, nodes=False, events=False)
    deadline_ms = int(hashes[-1].get("deadline") or 0)
    return ActiveLimits(
        deadline=ms_to_datetime(deadline_ms),
        time_remaining_ms=float(max(0, deadline_ms - now)) if deadline_ms else None,
        cost_usd_remaining=remaining_usd(hashes),
        cost_fraction_remaining=remaining_usd_fraction(hashes),
        tokens_remaining=remaining_tokens(hashes),
    )


def limit_error(state: ContextState, reason: str, detail: str) -> PromptEvaluationError:
    """The error of a stop for ``reason``, carrying the limits in force (or, while Redis
    is away, the deadline)."""
    phase = PHASES.get(reason, "halted")
    try:
        if not state.coord.backend.allow(state.backend_key):
            raise BackendDown()
        payload = active_limits(state).model_dump(mode="json")
    except UNAVAILABLE:
        deadline = ms_to_datetime(state.deadline_ms)
        payload = {"deadline": deadline.isoformat() if deadline else None}
    return PromptEvaluationError(f"{reason}: {detail}" if detail else reason,
                                 phase=phase, reason=reason, provider_payload=payload)


def load_snapshot(coord: Coordinator, ctx_id: str) -> ContextSnapshot:
    """The current state of any context, located through the cross-tree locator."""
    def read() -> tuple[Path, State]:
        root = coord.views.locate(ctx_id)
        h = coord.store.read_hash(root, ctx_id) if root is not None else {}
        if root is None or not h:
            raise ContextNotFoundError(ctx_id)
        path = Path(root, stored_ids(h, root, ctx_id))
        return path, coord.store.read_state(path)

    try:
        path, (hashes, nodes, events, now) = coord.backend.guard(read)
    except UNAVAILABLE as exc:
        raise BackendUnavailableError("load_snapshot", exc) from exc
    return build_snapshot(path, hashes, nodes, events, now, [])
