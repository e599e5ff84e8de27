"""One page of the overview as the API returns it: the indexer's page with the trees
opened since its last pass merged in at their place (pure; the reads are the store's)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..store.dashboard_reads import Page
from .model import row_from_hash, sort_scores


def page_rows(page: Page, fresh: Sequence[tuple[str, dict[str, str]]], sort: str,
              scope: tuple[str, str] | None, limit: int) -> tuple[list[dict[str, Any]], int]:
    """The rows of ``page`` (JSON), with the ``fresh`` trees (open, not yet indexed) of
    ``scope`` that rank within it, and the total counting every fresh one."""
    ranked: list[tuple[float, int, dict[str, Any]]] = []
    for i, (root, h, rate, score) in enumerate(zip(page.roots, page.hashes, page.rates,
                                                   page.scores, strict=True)):
        row = row_from_hash(h, page.now_ms, rate)
        ranked.append((score, -i, row.as_json() if row is not None else
                       {"id": root, "status": "expired", "labels": {}}))
    extra = 0
    lowest = page.scores[-1] if len(page.roots) >= limit and page.scores else None
    for _root, h in fresh:
        row = row_from_hash(h, page.now_ms)
        if row is None or (scope is not None and row.labels.get(scope[0]) != scope[1]):
            continue
        extra += 1
        score = sort_scores(row)[sort]
        if page.above is not None and score > page.above:
            continue  # it ranks on an earlier page
        if lowest is not None and score < lowest:
            continue  # on a later one
        ranked.append((score, 1, row.as_json()))
    ranked.sort(key=lambda e: (e[0], e[1]), reverse=True)
    return [r for _, _, r in ranked[:limit]], page.total + extra
