"""The tree chart draws only spend that was measured: flat at $0 until the first call,
a step at each call the tree recorded, flat after the last one (an abort after it shows
no spend rising), never a line interpolated between two readings."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from coordinator.dashboard.indexer import Indexer
from coordinator.dashboard.service import Service
from coordinator.store.dashboard_index import DashboardIndex
from tests.support.dashboard_server import coordinator, open_tree, spend

pytest.importorskip("starlette")


def _vertices(points: str) -> list[tuple[float, float]]:
    return [(float(x), float(y)) for x, y in (p.split(",") for p in points.split())]


def _y_at(line: Sequence[tuple[float, float]], x: float) -> float:
    """The line's height at ``x``: a step line holds the last vertex's height until the
    next vertex (at a vertical step, the height after it)."""
    return [v for v in line if v[0] <= x][-1][1]


def _no_slopes(line: Sequence[tuple[float, float]]) -> bool:
    return all(a[0] == b[0] or a[1] == b[1] for a, b in zip(line, line[1:], strict=False))


def test_the_chart_steps_at_the_calls_and_is_flat_after_the_abort(redis_url: str) -> None:
    coord = coordinator(redis_url)
    run = open_tree(coord, "chart-run", ceiling=1.0)
    spend(run, 0.25)
    spend(run, 0.125)
    run.abort("enough")
    coord.store.flush()
    # the indexer's reading of this minute comes after the abort
    Indexer(DashboardIndex(coord.client, coord.keyspace)).index(["chart-run"])
    chart = Service({"": coord}, cache_s=0).tree("", "chart-run")["chart"]
    line = _vertices(chart["points"])
    assert _no_slopes(line), line
    zero, final = chart["y_labels"][0]["y"], chart["last"]["y"]
    assert line[0][1] == zero and line[-1][1] == final
    (stop,) = chart["stops"]
    assert _y_at(line, stop["x"]) == final  # all of it was spent before the abort
    assert all(final <= y <= zero for _, y in line)  # (y grows downwards)
    run.close()
    coord.close()
