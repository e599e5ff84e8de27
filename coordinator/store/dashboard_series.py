"""The dashboard's spend series: per tree, its spend minute by minute as the indexer saw
it (a zset scored by the minute, capped at SERIES_MINUTES and expiring with the
retention), whatever the number of its calls; and the reads of the charts: one tree's
series, the last hour of each tree of an overview page, closed spend per day by label.

Written by the indexer outside the atomic scripts: a view, never the truth (a minute
with no indexer running has no point; the charts end at the tree's spend read now)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..core.keys import VIEW_SHARDS, KeySpace
from .topology import Client

SERIES_MINUTES = 2880
"""Points kept per tree: two days at one a minute (older ones are dropped)."""
SPARK_MINUTES = 60
"""The overview's sparkline covers the last hour."""


def _points(members: Sequence[tuple[object, object]]) -> list[tuple[int, int]]:
    """(minute, micro-USD) of ``minute:micro`` zset members, oldest first."""
    out = []
    for member, _ in members:
        minute, _, micro = str(member).partition(":")
        if minute.isdigit() and micro.isdigit():
            out.append((int(minute), int(micro)))
    return sorted(out)


class DashboardSeries:
    """Spend series of one tenant's key space (decoding client)."""

    def __init__(self, client: Client, keyspace: KeySpace) -> None:
        self.client = client
        self.ks = keyspace

    def write(self, points: Sequence[tuple[str, int, int]], ttl_s: int) -> None:
        """Record (root, minute, micro-USD) points, one per root and minute (a later one
        in the same minute replaces it), in one round trip of four commands a point."""
        pipe = self.client.pipeline(transaction=False)
        for root, minute, micro in points:
            key = self.ks.dash_series(root)
            pipe.zremrangebyscore(key, minute, minute)
            pipe.zadd(key, {f"{minute}:{micro}": minute})
            pipe.zremrangebyscore(key, "-inf", minute - SERIES_MINUTES)
            pipe.expire(key, ttl_s)
        pipe.execute()

    def tree(self, root: str) -> list[tuple[int, int]]:
        """The tree's points (minute, micro-USD), oldest first."""
        members: Any = self.client.zrange(self.ks.dash_series(root), 0, -1, withscores=True)
        return _points(members)

    def recent(self, roots: Sequence[str]) -> list[list[tuple[int, int]]]:
        """Each root's newest SPARK_MINUTES + 1 points (the last hour's, and one before
        it where the line starts), in one round trip of one command per root."""
        pipe = self.client.pipeline(transaction=False)
        for root in roots:
            pipe.zrevrange(self.ks.dash_series(root), 0, SPARK_MINUTES, withscores=True)
        return [_points(members) for members in pipe.execute()]

    def closed_by_day(self, label: str, days: Sequence[str]) -> dict[str, dict[str, int]]:
        """{day: {value: micro-USD}} of the trees closed on each day by ``label``
        (``org``, ``team``, ``service``, or ``total`` for ``all`` and ``unlabelled``),
        summed over the VIEW_SHARDS shards, in one round trip."""
        pipe = self.client.pipeline(transaction=False)
        for day in days:
            for shard in range(VIEW_SHARDS):
                pipe.hgetall(self.ks.spend_by(label, day, shard))
        res = pipe.execute()
        out: dict[str, dict[str, int]] = {}
        for i, day in enumerate(days):
            sums: dict[str, int] = {}
            for h in res[i * VIEW_SHARDS:(i + 1) * VIEW_SHARDS]:
                for k, v in h.items():
                    sums[str(k)] = sums.get(str(k), 0) + int(v)
            out[day] = sums
        return out
