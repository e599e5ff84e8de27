"""Cross-tree views: the indexes that span trees (where a context id lives, the trees still
open, spend of closed trees by label), read and written outside any one tree's slot, each
split in VIEW_SHARDS keys by hash of the root and read together with bounded work."""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.keys import VIEW_SHARDS, KeySpace, shard_of
from .model_spend import add_closed_models
from .state_check import canonical_int, readable
from .topology import Client

SPEND_LABELS = ("org", "team", "service")
"""The labels whose closed trees' spend is kept per UTC day."""
TOTAL = "total"
"""The day's view of every closed tree: fields ``all`` and ``unlabelled`` (the trees with
none of SPEND_LABELS)."""


def utc_day() -> str:
    """Today (UTC) as ``YYYY-MM-DD``, the key of a day's spend views."""
    return time.strftime("%Y-%m-%d", time.gmtime())


def _int(value: object) -> int:
    return canonical_int(str(value) if value is not None else None) or 0


def merge_shards(replies: Iterable[Sequence[tuple[Any, Any]]], *, newest_first: bool
                 ) -> list[tuple[str, float]]:
    """(root, creation ms) of ZRANGE ... WITHSCORES replies of the open-tree shards, each
    already in the order asked for, merged in that order: by score, then by id (Redis'
    own order of equal scores, reversed with the scores for the newest first)."""
    merged = heapq.merge(*[[(float(s), str(r)) for r, s in reply] for reply in replies],
                         reverse=newest_first)
    return [(r, s) for s, r in merged]


@dataclass(frozen=True)
class OpenTree:
    """A tree not yet closed, as ``budgetctl top`` lists it."""

    root: str
    spent: int
    """Micro-USD settled in the tree."""
    ceiling: int | None
    """The root's micro-USD limit (None: none)."""
    created_ms: int
    fields: dict[str, str] = field(default_factory=dict, compare=False)
    """The root's context hash as read."""

    @property
    def fraction(self) -> float:
        """Spend as a fraction of the ceiling (0 without one)."""
        return self.spent / self.ceiling if self.ceiling else 0.0


_ORDER = {
    "spend": lambda t: (t.spent, t.root),
    "fraction": lambda t: (t.fraction, t.root),
    "age": lambda t: (t.created_ms, t.root),
}
"""The key of each sort, largest first: one total order (the sort key, then the id), the
dashboard's (store/dashboard_reads.py)."""


class Views:
    """The cross-tree views of one tenant's key space."""

    def __init__(self, client: Client, keyspace: KeySpace) -> None:
        self.client = client
        self.ks = keyspace

    def locate(self, ctx_id: str) -> str | None:
        """The root id of the tree holding ``ctx_id``."""
        root = self.client.get(self.ks.locator(ctx_id))
        return str(root) if root is not None else None

    def _newest(self, per_shard: int, *, newest_first: bool) -> list[tuple[float, str]]:
        """(created ms, root) of the ``per_shard`` oldest (or newest) open trees of each
        shard, merged in that order (one round trip)."""
        pipe = self.client.pipeline(transaction=False)
        for key in self.ks.roots_shards():
            pipe.zrange(key, 0, per_shard - 1, desc=newest_first, withscores=True)
        return [(s, r) for r, s in merge_shards(pipe.execute(), newest_first=newest_first)]

    def active_roots(self, limit: int = 50, *, newest_first: bool = False) -> list[str]:
        """Root ids of trees not yet closed, oldest first (or newest first): at most
        ``limit`` read from each shard, one round trip."""
        return [root for _, root in self._newest(limit, newest_first=newest_first)[:limit]]

    def count_active_roots(self) -> int:
        """How many trees are not yet closed (one round trip)."""
        pipe = self.client.pipeline(transaction=False)
        for key in self.ks.roots_shards():
            pipe.zcard(key)
        return sum(int(n) for n in pipe.execute())

    def open_trees(self, limit: int = 50, *, sort: str = "spend", scan: int = 10_000
                   ) -> tuple[list[OpenTree], int, int]:
        """The ``limit`` open trees with the most spend (``sort="spend"``), the highest
        fraction of their ceiling (``"fraction"``) or the newest (``"age"``), with how
        many trees are open in all and how many the sort looked at: for spend and
        fraction, about the ``scan`` newest (the newest scan / VIEW_SHARDS of each
        shard); for age, exactly the newest ``limit``. Bounded work: two round trips,
        the second reading the root hashes of the trees looked at, 500 per pipeline."""
        if sort not in _ORDER:
            raise ValueError(f"sort must be 'spend', 'fraction' or 'age', not {sort!r}")
        per_shard = limit if sort == "age" else max(limit, math.ceil(scan / VIEW_SHARDS))
        candidates = self._newest(per_shard, newest_first=True)
        if sort == "age":
            candidates = candidates[:limit]
        total = self.count_active_roots()
        hashes = self.read_contexts([(root, root) for _, root in candidates])
        trees = [OpenTree(root, _int(h.get("u:usd")),
                          _int(h["l:usd"]) if "l:usd" in h else None, int(created), h)
                 for (created, root), h in zip(candidates, hashes, strict=True) if h]
        return sorted(trees, key=_ORDER[sort], reverse=True)[:limit], total, len(candidates)

    def burn_rates(self, roots: Sequence[str]) -> dict[str, float]:
        """USD per minute over the last minute of each root, as the dashboard's indexer
        last computed it (roots it has not rated are left out; none without an indexer)."""
        if not roots:
            return {}
        values = self.client.hmget(self.ks.dash("rate"), list(roots))
        return {r: float(v) for r, v in zip(roots, values, strict=True) if v is not None}

    def roots_with_prefix(self, prefix: str, limit: int = 2) -> list[str]:
        """Up to ``limit`` ids of open trees' roots starting with ``prefix``: one pass over
        each shard of the open-trees index (ZSCAN with MATCH, filtered in Redis), never the
        keyspace."""
        pattern = "".join("\\" + c if c in "*?[]\\" else c for c in prefix) + "*"
        found: list[str] = []
        for shard in self.ks.roots_shards():
            if len(found) >= limit:
                break
            cursor = 0
            while True:
                cursor, batch = self.client.zscan(shard, cursor, match=pattern, count=1000)
                found += [str(member) for member, _ in batch if str(member) not in found]
                if cursor == 0 or len(found) >= limit:
                    break
        return found[:limit]

    def read_contexts(self, refs: Sequence[tuple[str, str]]) -> list[dict[str, str]]:
        """The hashes of contexts given as (root id, context id), possibly of many trees,
        in one round trip per 500 ({} for a context whose keys are gone), corrupt numbers
        read as 0 (state_check.readable)."""
        out: list[dict[str, str]] = []
        for start in range(0, len(refs), 500):
            pipe = self.client.pipeline(transaction=False)
            for root, ctx_id in refs[start:start + 500]:
                pipe.hgetall(self.ks.ctx(root, ctx_id))
            out += [readable({str(k): str(v) for k, v in h.items()}) for h in pipe.execute()]
        return out

    def read_level(self, root: str, ids: Sequence[str]
                   ) -> tuple[list[dict[str, str]], list[list[str]]]:
        """The hashes and the sorted children of contexts of one tree, in one round trip
        per 250 contexts (a tree view reads one level of the tree at a time)."""
        hashes: list[dict[str, str]] = []
        kids: list[list[str]] = []
        for start in range(0, len(ids), 250):
            pipe = self.client.pipeline(transaction=False)
            for ctx_id in ids[start:start + 250]:
                pipe.hgetall(self.ks.ctx(root, ctx_id))
                pipe.smembers(self.ks.kids(root, ctx_id))
            replies = pipe.execute()
            hashes += [{str(k): str(v) for k, v in h.items()} for h in replies[0::2]]
            kids += [sorted(str(k) for k in members) for members in replies[1::2]]
        return hashes, kids

    def now_ms(self) -> int:
        """Redis time in ms (the clock deadlines are compared with)."""
        sec, usec = self.client.time()
        return int(sec) * 1000 + int(usec) // 1000

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

    def spend_totals(self, day: str | None = None) -> dict[str, int]:
        """``{"all": micro, "unlabelled": micro}`` of the trees closed on ``day`` (UTC;
        default today): every one, and those with none of SPEND_LABELS."""
        view = self.spend_view(TOTAL, day)
        return {"all": view.get("all", 0), "unlabelled": view.get("unlabelled", 0)}

    def add_closed_tree(self, spent: int, labels: Mapping[str, str | None],
                        retention_s: int, *, root: str = "") -> None:
        """Add a closed tree's spend (micro-USD) to today's views named by ``labels``
        (``org``, ``team``, ``service``; empty values are skipped) and to the day's
        total (``unlabelled`` too when no label is set) and, by provider and model, to
        the ``model`` view (store/model_spend.py), in the shard of ``root``. Three round
        trips; the views expire after ``retention_s``."""
        views: dict[str, str] = {k: v for k, v in labels.items() if v}
        if not spent:
            return
        day, shard = utc_day(), shard_of(root)
        pipe = self.client.pipeline(transaction=False)
        total = self.ks.spend_by(TOTAL, day, shard)
        pipe.hincrby(total, "all", spent)
        if not views:
            pipe.hincrby(total, "unlabelled", spent)
        pipe.expire(total, retention_s)
        for label, value in views.items():
            pipe.hincrby(self.ks.spend_by(label, day, shard), value, spent)
            pipe.expire(self.ks.spend_by(label, day, shard), retention_s)
        pipe.execute()
        add_closed_models(self.client, self.ks, root, spent, day, retention_s)
