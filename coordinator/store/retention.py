"""Retention: every key of a tree expires after its root closes (contexts never closed
included); store/gc.py finds the trees left open by processes that died."""

from __future__ import annotations

from collections.abc import Iterator

from ..core.data_keys import DataKeys
from ..core.keys import KeySpace
from .topology import Client

MAX_CONTEXTS = 100_000
"""A tree walk stops here (a bound on the work of one sweep per tree)."""


def walk(client: Client, ks: KeySpace, root: str) -> list[str]:
    """The ids of a tree's contexts, root first, breadth first (one round trip per
    level of the tree), at most MAX_CONTEXTS."""
    out, level = [root], [root]
    while level and len(out) < MAX_CONTEXTS:
        pipe = client.pipeline(transaction=False)
        for cid in level:
            pipe.smembers(ks.kids(root, cid))
        level = sorted({str(k) for kids in pipe.execute() for k in kids} - set(out))
        out += level[: MAX_CONTEXTS - len(out)]
    return out


def _context_keys(ks: KeySpace, root: str, ctx_id: str) -> Iterator[str]:
    yield from (ks.ctx(root, ctx_id), ks.nodes(root, ctx_id), ks.events(root, ctx_id),
                ks.kids(root, ctx_id), ks.locator(ctx_id),
                *DataKeys(ks).context_keys(root, ctx_id))


def tree_keys(ks: KeySpace, root: str, contexts: list[str]) -> list[str]:
    """Every key of a tree: each context's hash, streams, children, locator and context
    data, and the tree's own (reservations, leases, ledger, finished and keyed outcomes,
    spend by model, checkpoints, causal chain)."""
    keys = [k for cid in contexts for k in _context_keys(ks, root, cid)]
    return keys + [ks.reservations(root), ks.leases(root), ks.ledger(root), ks.done(root),
                   ks.finished(root), ks.by_model(root), *DataKeys(ks).tree_keys(root)]

