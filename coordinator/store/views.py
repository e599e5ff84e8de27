"""Cross-tree views: the indexes that span trees (where a context id lives, the trees still
open, spend of closed trees by label), read and written outside any one tree's slot, each
split in VIEW_SHARDS keys by hash of the root and read together with bounded work."""

from __future__ import annotations

import heapq
import time
from collections.abc import Mapping
from dataclasses import dataclass

from ..core.keys import VIEW_SHARDS, KeySpace, shard_of
from .topology import Client

SPEND_LABELS = ("org", "team", "service")
"""The labels whose closed trees' spend is kept per UTC day."""


def utc_day() -> str:
    """Today (UTC) as ``YYYY-MM-DD``, the key of a day's spend views."""
    return time.strftime("%Y-%m-%d", time.gmtime())


@dataclass(frozen=True)
class OpenTree:
    """A tree not yet closed, as ``budgetctl top`` lists it."""

    root: str
    spent: int
    """Micro-USD settled in the tree."""
    ceiling: int | None
    """The root's micro-USD limit (None: none)."""
    created_ms: int

    @property
    def fraction(self) -> float:
        """Spend as a fraction of the ceiling (0 without one)."""
        return self.spent / self.ceiling if self.ceiling else 0.0


def _int(value: object) -> int:
    text = str(value) if value is not None else ""
    return int(text) if text.isdigit() else 0


class Views:
    """The cross-tree views of one tenant's key space."""

    def __init__(self, client: Client, keyspace: KeySpace) -> None:
        self.client = client
        self.ks = keyspace

    def locate(self, ctx_id: str) -> str | None:
        """The root id of the tree holding ``ctx_id``."""
        root = self.client.get(self.ks.locator(ctx_id))
        return str(root) if root is not None else None

    def active_roots(self, limit: int = 50) -> list[str]:
        """Root ids of trees not yet closed, oldest first (at most ``limit`` read from
        each shard, one round trip)."""
        pipe = self.client.pipeline(transaction=False)
        for key in self.ks.roots_shards():
            pipe.zrange(key, 0, limit - 1, withscores=True)
        merged = heapq.merge(*[[(float(s), str(r)) for r, s in shard]
                               for shard in pipe.execute()])
        return [root for _, root in list(merged)[:limit]]

    def active_root_count(self) -> int:
        """How many trees are not yet closed (one round trip)."""
        pipe = self.client.pipeline(transaction=False)
        for key in self.ks.roots_shards():
            pipe.zcard(key)
        return sum(int(n) for n in pipe.execute())

    def open_trees(self, limit: int = 50, *, sort: str = "spend", per_shard: int = 200
                   ) -> tuple[list[OpenTree], int]:
        """The ``limit`` open trees with the most spend (``sort="spend"``), the highest
        fraction of their ceiling (``"fraction"``) or the oldest (``"age"``), among the
        ``per_shard`` oldest of each shard (bounded work: two round trips), and how many
        trees are open in all."""
        if sort not in ("spend", "fraction", "age"):
            raise ValueError(f"sort must be 'spend', 'fraction' or 'age', not {sort!r}")
        pipe = self.client.pipeline(transaction=False)
        for key in self.ks.roots_shards():
            pipe.zrange(key, 0, per_shard - 1, withscores=True)
            pipe.zcard(key)
        replies = pipe.execute()
        candidates = [(str(r), int(score)) for shard in replies[0::2] for r, score in shard]
        total = sum(int(n) for n in replies[1::2])
        pipe = self.client.pipeline(transaction=False)
        for root, _ in candidates:
            pipe.hmget(self.ks.ctx(root, root), "u:usd", "l:usd")
        trees = [OpenTree(root, _int(used), _int(ceiling) if ceiling is not None else None,
                          created)
                 for (root, created), (used, ceiling) in zip(candidates, pipe.execute(),
                                                             strict=True)]
        def order(t: OpenTree) -> tuple[float, float]:
            if sort == "spend":
                return (-t.spent, t.created_ms)
            if sort == "fraction":
                return (-t.fraction, -t.spent)
            return (t.created_ms, 0)

        return sorted(trees, key=order)[:limit], total

    def spend_view(self, label: str, day: str | None = None) -> dict[str, int]:
        """Micro-USD of the trees closed on ``day`` (UTC; default today) by ``label``."""
        day = day or utc_day()
        pipe = self.client.pipeline(transaction=False)
        for shard in range(VIEW_SHARDS):
            pipe.hgetall(self.ks.spend_by(label, day, shard))
        out: dict[str, int] = {}
        for raw in pipe.execute():
            for k, v in raw.items():
                out[str(k)] = out.get(str(k), 0) + int(v)
        return out

    def add_closed_tree(self, spent: int, labels: Mapping[str, str | None],
                        retention_s: int, *, root: str = "") -> None:
        """Add a closed tree's spend (micro-USD) to today's views named by ``labels``
        (``org``, ``team``, ``service``; empty values are skipped), in the shard of
        ``root``. One round trip; the views expire after ``retention_s``."""
        views = {k: v for k, v in labels.items() if v}
        if not spent or not views:
            return
        day, shard = utc_day(), shard_of(root)
        pipe = self.client.pipeline(transaction=False)
        for label, value in views.items():
            pipe.hincrby(self.ks.spend_by(label, day, shard), value, spent)
            pipe.expire(self.ks.spend_by(label, day, shard), retention_s)
        pipe.execute()
