"""Making a handle's state: opening a new context (root or child), attaching to one a
token names, and minting the token that names a context (opened first, from any
thread)."""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from typing import Any

from ..core.paths import Path, stored_ids
from ..core.plans import PLACEHOLDER_CONFIG, OpenPlan, placeholder_metadata
from ..core.snapshots import config_from_hash, metadata_from_hash, stored_metadata_json
from ..core.token_codec import MAX_TOKEN_BYTES, token_size
from ..errors import (
    BackendUnavailableError,
    ContextDepthError,
    ContextNotFoundError,
    TokenMalformedError,
)
from ..models import ChainMetadata
from ..runtime.coordinator import Coordinator
from ..shield.pipeline import ShieldPipeline
from ..store.errors import UNAVAILABLE
from ..store.health import BackendDown
from .edge import check_ladder
from .state import ContextState, PendingOpen

log = logging.getLogger("coordinator")

TOKEN_TTL_S = 24 * 3600
"""The longest life of a context token (it also ends at the context's deadline)."""


def check_type(name: str, value: object, kind: type) -> None:
    if not isinstance(value, kind):
        raise TypeError(f"{name} must be a {kind.__name__}; got {value!r}")


def open_state(coord: Coordinator, plan: OpenPlan, pipeline: ShieldPipeline | None,
               metadata: ChainMetadata | None, parent: ContextState | None,
               circuit_breaker: Any | None) -> ContextState:
    """Open a context (a child of ``parent``, else a root) and return its state. When
    Redis is unreachable, the state is returned unopened: every call halts until Redis
    answers and the open goes through (fail closed)."""
    if pipeline is not None:
        check_type("pipeline", pipeline, ShieldPipeline)
    if metadata is not None:
        check_type("metadata", metadata, ChainMetadata)
    if plan.config.degrade is not None:
        check_ladder(plan.config.degrade, coord.charging)
    if metadata is None:
        base = parent.metadata if parent is not None else None
        ctx_id = uuid.uuid4().hex
        metadata = (
            base.model_copy(update={"chain_id": ctx_id})
            if base is not None
            else ChainMetadata(request_id=uuid.uuid4().hex, chain_id=ctx_id)
        )
    path = (parent.path.child(metadata.chain_id) if parent is not None
            else Path(metadata.chain_id, (metadata.chain_id,)))
    check_depth(coord, path)
    state = ContextState(coord, path, plan.config, metadata, pipeline, circuit_breaker,
                         owner=True, pending_open=PendingOpen(
                             plan, stored_metadata_json(metadata), fresh=True))
    if parent is None and _on_event_loop():
        open_in_background(state)  # the loop's thread never waits on Redis
        return state
    if parent is not None and parent.pending_open is not None:
        open_pending(parent)  # a root made on an event loop and not yet opened
    open_pending(state)
    return state


def check_depth(coord: Coordinator, path: Path) -> None:
    """Refuse a context whose token would pass the token cap (``ContextDepthError``):
    with the default 32-character ids, from depth 86 on (the root is at depth 0), where
    the ancestor path fills 4 KiB. Shorter ids (``ChainMetadata.chain_id``) go deeper."""
    size = token_size(path.ids, coord.tenant, coord.signing_kid)
    if size > MAX_TOKEN_BYTES:
        raise ContextDepthError(len(path.ids) - 1, size, MAX_TOKEN_BYTES)


def open_pending(state: ContextState) -> None:
    """Open a context not opened yet; while Redis is unreachable (or known down) it stays
    unopened and its calls halt until the open goes through (fail closed)."""
    if not state.coord.backend.allow():
        log.warning("could not open context %s: Redis backend unavailable", state.ctx_id)
        return
    try:
        state.ensure_open()
    except UNAVAILABLE as exc:
        state.coord.backend.failed(exc)
        log.warning("could not open context %s: %s", state.ctx_id, exc)


def open_in_background(state: ContextState) -> None:
    """Open a root made on an event loop at once, on a thread of its own, so that it is
    listed while its agent thinks. Its first call (or ``async with``, a child, a token)
    waits for that open; one that failed leaves the root unopened, and the first call
    opens it or meets the failure as it would have (fail closed, ContextExistsError)."""
    threading.Thread(target=_open_quietly, args=(state,), name="budget-open",
                     daemon=True).start()


def _open_quietly(state: ContextState) -> None:
    try:
        if state.coord.backend.allow(state.backend_key):
            state.ensure_open(unless_closed=True)
    except UNAVAILABLE as exc:  # (the breaker heard it)
        log.warning("could not open context %s: %s", state.ctx_id, exc)
    except Exception:  # noqa: BLE001 - met again by the first call's open
        log.debug("background open of %s failed", state.ctx_id, exc_info=True)


def open_to_name(state: ContextState) -> None:
    """Open a context not opened yet before a token names it (the token is read, or the
    context goes to a Celery task or an HTTP request), so that whoever attaches the token
    finds it. With an event loop running on this thread, the open runs on a thread of its
    own, waited for at most the long timeout. Raises BackendUnavailableError when Redis
    cannot take it (no token then names a context that is not there)."""
    if state.pending_open is None:
        return
    if not state.coord.backend.allow():
        raise BackendUnavailableError("open", BackendDown())
    failed: list[BaseException] = []

    def run() -> None:
        try:
            state.ensure_open()
        except BaseException as exc:  # raised again in the caller's thread
            failed.append(exc)

    if _on_event_loop():
        opener = threading.Thread(target=run, name="budget-open", daemon=True)
        opener.start()
        wait_ms = state.coord.long_timeout_ms
        opener.join(wait_ms / 1000)
        if opener.is_alive():
            raise BackendUnavailableError("open", TimeoutError(f"no answer in {wait_ms} ms"))
    else:
        run()
    if failed:
        exc = failed[0]
        if isinstance(exc, UNAVAILABLE):
            state.coord.backend.failed(exc)
            raise BackendUnavailableError("open", exc) from exc
        raise exc


def _on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def attach_state(coord: Coordinator, token: str) -> ContextState:
    """The state of the context a token names, read from Redis."""
    claims = coord.token_codec().decode(token, now=coord.redis_now_ms() / 1000,
                                        tenant=coord.tenant)
    try:
        return coord.backend.guard(lambda: state_from_redis(coord, Path(claims.root,
                                                                          claims.path)))
    except UNAVAILABLE as exc:
        raise BackendUnavailableError("attach", exc) from exc


def token_state(coord: Coordinator, token: str) -> ContextState:
    """A state for the context a token names, without reading it (placeholder limits and
    metadata): enough to open a child, whose open script checks every ancestor."""
    claims = coord.token_codec().decode(token, now=coord.redis_now_ms() / 1000,
                                        tenant=coord.tenant)
    return ContextState(coord, Path(claims.root, claims.path), PLACEHOLDER_CONFIG,
                        placeholder_metadata(claims.context), None, None, owner=False)


def state_from_redis(coord: Coordinator, path: Path) -> ContextState:
    h = coord.store.read_hash(path.root, path.ctx_id)
    if not h:
        raise ContextNotFoundError(path.ctx_id)
    if stored_ids(h, path.root, path.ctx_id) != path.ids:
        # Defence in depth: a validly signed token whose ancestor path is not the one
        # recorded at open (a leaked key, a buggy issuer) could dodge a level's limits.
        raise TokenMalformedError("the token's ancestor path is not the context's")
    state = ContextState(coord, path, config_from_hash(h),
                         metadata_from_hash(h), None, None, owner=False)
    state.activate(int(h.get("deadline") or 0))
    if h.get("status") == "stopped":
        state.handle_stop(h.get("reason") or "stopped")
    return state


def mint_token(state: ContextState) -> str:
    """A signed token naming the context, for another process to attach, opened first if
    it was not yet (open_to_name). It expires at the context's deadline, or after
    TOKEN_TTL_S."""
    open_to_name(state)
    coord = state.coord
    now_s = coord.redis_now_ms() / 1000
    ttl = TOKEN_TTL_S
    if state.deadline_ms:
        ttl = max(1, min(ttl, int(state.deadline_ms / 1000 - now_s) + 1))
    return coord.token_codec().encode(root=state.path.root, path=state.path.ids,
                                      tenant=coord.tenant, ttl_s=ttl, now=now_s)
