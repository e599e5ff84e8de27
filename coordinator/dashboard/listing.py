"""One page of the overview as the API returns it: the indexer's page with the trees
opened since its last pass merged in at their place, every tree ranked by its score, then
its id, largest first (Redis' order of an index read from the top), so that pages never
overlap nor skip a tree (pure; the reads are the store's)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..store.dashboard_reads import Page
from .model import row_from_hash, sort_scores

Ranked = tuple[float, str, dict[str, Any]]
"""A tree in a listing: its score, its id, its row (JSON)."""


def fresh_rows(fresh: Sequence[tuple[str, dict[str, str], float]], now_ms: int, sort: str,
               scope: tuple[str, str] | None) -> list[Ranked]:
    """The ``fresh`` trees (root, hash, creation ms in the open-tree shards) of ``scope``,
    ranked by ``sort`` (``age``: the creation ms the indexer ranks them by too)."""
    out = []
    for root, h, created in fresh:
        row = row_from_hash(h, now_ms)
        if row is None or (scope is not None and row.labels.get(scope[0]) != scope[1]):
            continue
        out.append((created if sort == "age" else sort_scores(row)[sort], root, row.as_json()))
    return out


def page_rows(page: Page, fresh: Sequence[Ranked], offset: int, limit: int
              ) -> tuple[list[dict[str, Any]], int]:
    """The rows at ``offset`` of ``page`` (read from rank ``page.start``) and the
    ``fresh`` trees merged, and the total counting the fresh ones. ``page.start`` is at
    most ``offset`` less the fresh trees, so every tree ranked before the page's first
    one read is known: the fresh ones ahead of it, and ``page.start`` indexed ones."""
    extra = [f for f in fresh if f[1] not in page.placed]
    read: list[Ranked] = []
    for root, h, rate, score in zip(page.roots, page.hashes, page.rates, page.scores,
                                    strict=True):
        row = row_from_hash(h, page.now_ms, rate)
        read.append((score, root, row.as_json() if row is not None else
                     {"id": root, "status": "expired", "labels": {}}))
    total = page.total + len(extra)
    if page.start > 0:
        if not read:
            return [], total
        first = read[0][:2]
        ahead = sum(1 for f in extra if f[:2] > first)
        extra, position = [f for f in extra if f[:2] < first], page.start + ahead
    else:
        position = 0
    ranked = sorted(read + extra, key=lambda e: e[:2], reverse=True)
    return [r for _, _, r in ranked[offset - position:offset - position + limit]], total
