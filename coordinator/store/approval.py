"""A tree waiting for approval (ExecutionConfig.approval_wait_s): while one of its calls
waits for an operator to raise a limit, the root context's hash names the wait in three
fields, ``approval_ctx`` (the waiting context), ``approval_reason`` (the stop reason it
waits on) and ``approval_until_ms`` (Redis ms when the wait ends). approval.lua sets them
when the wait starts and deletes them when it ends; readers (budgetctl top and tree, the
dashboard, /metrics) treat a tree as waiting while ``approval_until_ms`` is later than
Redis now, so the wait of a process that died stops showing at its end."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..core.contracts import APPROVAL_END, APPROVAL_START
from .state_check import canonical_int
from .tree import Store
from .wire import Op

APPROVAL_FIELDS = ("approval_ctx", "approval_reason", "approval_until_ms")
"""The root hash's fields that name a wait for approval."""


def start_wait(store: Store, root: str, ctx_id: str, reason: str, wait_ms: int) -> int:
    """Show tree ``root`` waiting for approval of context ``ctx_id``'s call, stopped for
    ``reason``, for ``wait_ms``. Returns approval_until_ms (Redis ms), 0 when the root is
    gone (nothing written)."""
    return int(store.wire.run(Op(APPROVAL_START.script, APPROVAL_START.key_list(
        root_ctx=store.ks.ctx(root, root)), APPROVAL_START.arg_list(
        mode="start", ctx_id=ctx_id, reason=reason, wait_ms=wait_ms))))


def end_wait_op(store: Store, root: str, ctx_id: str, until_ms: int) -> Op:
    """The op ending the wait ``start_wait`` began (returning ``until_ms``), unless a
    later wait replaced it; its reply is 1 when it deleted the fields, else 0."""
    return Op(APPROVAL_END.script, APPROVAL_END.key_list(root_ctx=store.ks.ctx(root, root)),
              APPROVAL_END.arg_list(mode="end", ctx_id=ctx_id, until_ms=until_ms))


def end_wait(store: Store, root: str, ctx_id: str, until_ms: int) -> bool:
    """End the wait now (see :func:`end_wait_op`). Returns whether the fields were
    deleted."""
    return bool(store.wire.run(end_wait_op(store, root, ctx_id, until_ms)))


def approval_of(fields: Mapping[str, Any], now_ms: int) -> dict[str, Any] | None:
    """The wait a root hash's fields (all of them, or just APPROVAL_FIELDS) show at Redis
    time ``now_ms``: ``{approval_ctx, approval_reason, approval_until_ms (int)}``, or None
    when none is shown or it has ended."""
    ctx, reason = fields.get("approval_ctx"), fields.get("approval_reason")
    until = canonical_int(None if fields.get("approval_until_ms") is None
                          else str(fields["approval_until_ms"]))
    if ctx is None or until is None or until <= now_ms:
        return None
    return {"approval_ctx": str(ctx), "approval_reason": str(reason or ""),
            "approval_until_ms": until}


def waiting_for_approval(store: Store, root: str) -> dict[str, Any] | None:
    """Whether tree ``root`` is waiting for approval now (one round trip, after this
    process's queued writes): the wait as :func:`approval_of` gives it, or None."""
    key = store.ks.ctx(root, root)

    def reads(pipe: Any) -> None:
        pipe.hmget(key, *APPROVAL_FIELDS)
        if not store.wire.topology.is_cluster:
            pipe.time()
        else:  # the tree's own node's clock (a cluster pipeline sends no key-less TIME)
            pipe.execute_command("EVAL", "return redis.call('TIME')", 1, key)

    values, (sec, usec) = store.wire.round_trip([], reads)[-2:]
    fields = {f: v for f, v in zip(APPROVAL_FIELDS, values, strict=True) if v is not None}
    return approval_of(fields, int(sec) * 1000 + int(usec) // 1000)
