"""Trees waiting for approval, for the overview's ``state=waiting`` filter, /metrics and the
``approval_needed`` alerts: the open trees (newest first, from the library's open-tree
shards) whose root hash shows a wait (store/approval.py: ``approval_until_ms`` later
than Redis now). A wait is written by the waiting process and no indexer hears it, so
this reads the roots' three approval fields directly: bounded work, at most MAX_SCAN
roots (the newest), 500 per round trip."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..core.keys import VIEW_SHARDS, KeySpace
from ..core.limit_text import limit_text
from ..core.vocabulary import DIMENSION_REASONS
from ..models_limits import limit_name
from ..store.approval import APPROVAL_FIELDS, approval_of
from ..store.dashboard_reads import fields_of, redis_ms
from ..store.topology import Client
from ..store.views import merge_shards

MAX_SCAN = 10_000
"""Open trees (the newest) looked at for a wait, as ``budgetctl top`` sorts among."""
CHUNK = 500


@dataclass(frozen=True)
class Wait:
    """Tree ``root`` waits: a call of context ``ctx`` met ``reason``, until ``until_ms``."""

    root: str
    ctx: str
    reason: str
    until_ms: int

    def as_json(self) -> dict[str, Any]:
        return {"ctx": self.ctx, "reason": self.reason, "until_ms": self.until_ms}


def wait_of(root: str, fields: dict[str, str], now_ms: int) -> Wait | None:
    """The wait a root's fields show at Redis time ``now_ms`` (None: none, or ended)."""
    got = approval_of(fields, now_ms)
    if got is None:
        return None
    return Wait(root, str(got["approval_ctx"]), str(got["approval_reason"]),
                int(got["approval_until_ms"]))


def open_waits(client: Client, ks: KeySpace, scan: int = MAX_SCAN) -> tuple[list[Wait], int]:
    """The waits of the ``scan`` newest open trees (newest first), and Redis time."""
    pipe = client.pipeline(transaction=False)
    for key in ks.roots_shards():
        pipe.zrevrange(key, 0, math.ceil(scan / VIEW_SHARDS) - 1, withscores=True)
    roots = [r for r, _ in merge_shards(pipe.execute(), newest_first=True)][:scan]
    waits: list[Wait] = []
    now = 0
    for start in range(0, max(1, len(roots)), CHUNK):
        part = roots[start:start + CHUNK]
        pipe = client.pipeline(transaction=False)
        for root in part:
            pipe.hmget(ks.ctx(root, root), list(APPROVAL_FIELDS))
        pipe.time()
        res = pipe.execute()
        now = redis_ms(res[-1])
        waits += [w for root, values in zip(part, res[:-1], strict=True)
                  if (w := wait_of(root, fields_of(APPROVAL_FIELDS, values), now))]
    return waits, now


def count_by_reason(waits: Sequence[Wait]) -> dict[str, int]:
    """How many trees wait, by the stop reason they wait on."""
    out: dict[str, int] = {}
    for w in waits:
        out[w.reason] = out.get(w.reason, 0) + 1
    return out


_DIMENSION_OF = {str(reason): dim for dim, reason in DIMENSION_REASONS.items()}


def limit_reached(reason: str, h: dict[str, str]) -> str:
    """The limit a wait is on, from the waiting context's hash: ``max_cost_usd $0.05``
    (a token limit: its stop's detail, or the reason alone)."""
    dim = _DIMENSION_OF.get(reason)
    value = h.get(f"l:{dim}") if dim else None
    if dim is None or value is None or not value.isdigit():
        return h.get("detail") or reason
    name = limit_name(dim)
    amount = int(value) / 1e6 if dim == "usd" else int(value)
    return f"{name} {limit_text(name, amount)}"
