"""Quotas' part of a call's steps (context/call.py): a reserve refused because a quota
grant of its tree is short becomes a top-up (a store request, like a reserve: on the I/O
thread for async callers) and one more reserve; a refusal by the quota itself is a
``quota_exceeded`` refusal that stops the call, not the tree."""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any, TypeGuard

from ..core.vocabulary import StopReason
from ..store.requests import Reserve, StoreRequest, TopUp
from ..store.tree import Held, Refused, Replayed
from .keeper import MAX_STEPS

GRANT_SHORT = StopReason.QUOTA_GRANT
"""reserve.lua's refusal reason when a quota grant of the root cannot cover the call."""


def grant_short(result: object) -> TypeGuard[Refused]:
    """Whether a reserve was refused for a quota grant to top up."""
    return isinstance(result, Refused) and result.reason == GRANT_SHORT


def quota_need(amounts: Sequence[str | int]) -> dict[str, int]:
    """A call's reserve amounts in quota dimensions (usd, calls, tok)."""
    by_dim = {str(amounts[i]): int(amounts[i + 1]) for i in range(0, len(amounts), 2)}
    return {"usd": by_dim.get("usd", 0), "calls": by_dim.get("steps", 0),
            "tok": by_dim.get("tin", 0) + by_dim.get("tout", 0)}


def refill_and_reserve(request: Reserve, refused: Refused
                       ) -> Generator[StoreRequest, Any, Held | Refused | Replayed]:
    """Top up the short grant and send ``request`` again (as often as the tree has
    buckets); a quota's own refusal comes back as ``Refused`` (level -1: not a level of
    the path, nothing stopped)."""
    path = request.path
    need = quota_need(request.amounts)
    result: Held | Refused | Replayed = refused
    for _ in range(2 * MAX_STEPS):
        if not grant_short(result):
            return result
        assert isinstance(result, Refused)
        refill = yield TopUp(path, result.detail, need)
        if not refill.again:
            return Refused(-1, refill.reason, refill.detail, False, result.now_ms)
        result = yield request
    if grant_short(result):  # the grant keeps being taken elsewhere: refuse this call
        assert isinstance(result, Refused)
        return Refused(-1, "quota_exceeded", f"quota grant {result.detail}: could not be "
                       "topped up", False, result.now_ms)
    return result
