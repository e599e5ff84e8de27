"""Every listing of open trees (the overview's pages, `/api/trees`, `budgetctl top
--limit`) is one total order, the sort key then the id, whatever path built it: the
indexer's index, the trees opened since its last pass, or the library's open-tree shards."""

from __future__ import annotations

import json

import pytest

from coordinator.cli import main
from coordinator.dashboard.indexer import Indexer
from coordinator.dashboard.model import SORTS
from coordinator.dashboard.service import Service
from coordinator.store.dashboard_index import DashboardIndex
from tests.support.dashboard_server import coordinator, open_tree, spend

pytest.importorskip("starlette")


def _top(capsys: pytest.CaptureFixture[str], redis_url: str, sort: str, limit: int
         ) -> list[str]:
    capsys.readouterr()
    assert main(["--redis", redis_url, "top", "--json", "--sort", sort,
                 "--limit", str(limit)]) == 0
    return [t["id"] for t in json.loads(capsys.readouterr().out)["trees"]]


def test_pages_show_every_tree_once_in_one_total_order(
        redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """55 open trees at $0 (and two that spent), 45 of them indexed, the others opened
    since the indexer's pass: two pages of 50 show each tree exactly once, in the order
    of the whole listing read at once; ties are broken by the id (largest first)."""
    coord = coordinator(redis_url)
    # ids in another order than creation's: creation time breaks no tie
    trees = [open_tree(coord, f"t{i * 37 % 55:02d}") for i in range(55)]
    spend(trees[0], 0.2)  # t00
    spend(trees[50], 0.1)  # t35, not indexed yet
    coord.store.flush()
    indexer = Indexer(DashboardIndex(coord.client, coord.keyspace))
    indexer.index([t.chain_id for t in trees[:45]])
    svc = Service({"": coord}, cache_s=0)
    everyone = sorted(t.chain_id for t in trees)
    zero = sorted(set(everyone) - {"t00", "t35"}, reverse=True)
    for sort in SORTS:
        for label in (None, "team=research"):
            pages = [svc.trees("", sort=sort, label=label, page=n, size=50) for n in (1, 2)]
            ids = [t["id"] for p in pages for t in p["trees"]]
            assert sorted(ids) == everyone, (sort, label)
            assert [p["total"] for p in pages] == [55, 55], (sort, label)
            whole = svc.trees("", sort=sort, label=label, size=200)["trees"]
            assert ids == [t["id"] for t in whole], (sort, label)
            if sort in ("spend", "fraction"):
                assert ids == ["t00", "t35", *zero], (sort, label)
            if sort == "burn":  # t35 is not rated before the indexer places it
                assert ids == ["t00", *sorted(set(everyone) - {"t00"}, reverse=True)], label
    for sort in ("spend", "fraction"):
        assert _top(capsys, redis_url, sort, 55) == ["t00", "t35", *zero]
        assert _top(capsys, redis_url, sort, 10) == ["t00", "t35", *zero][:10]
    assert _top(capsys, redis_url, "age", 10) == _top(capsys, redis_url, "age", 55)[:10]
    for ctx in trees:
        ctx.close()
    coord.close()
