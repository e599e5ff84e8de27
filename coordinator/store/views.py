"""Cross-tree views: the indexes that span trees (where a context id lives, the trees still
open, spend of closed trees by label), read and written outside any one tree's slot."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import redis

from ..core.keys import KeySpace

SPEND_LABELS = ("org", "team", "service")
"""The labels whose closed trees' spend is kept per UTC day."""


def utc_day() -> str:
    """Today (UTC) as ``YYYY-MM-DD``, the key of a day's spend views."""
    return time.strftime("%Y-%m-%d", time.gmtime())


class Views:
    """The cross-tree views of one tenant's key space."""

    def __init__(self, client: redis.Redis, keyspace: KeySpace) -> None:
        self.client = client
        self.ks = keyspace

    def locate(self, ctx_id: str) -> str | None:
        """The root id of the tree holding ``ctx_id``."""
        root = self.client.get(self.ks.locator(ctx_id))
        return str(root) if root is not None else None

    def active_roots(self, limit: int = 50, *, newest_first: bool = False) -> list[str]:
        """Root ids of trees not yet closed, oldest first (or newest first)."""
        return [str(r) for r in self.client.zrange(self.ks.active_roots, 0, limit - 1,
                                                    desc=newest_first)]

    def count_active_roots(self) -> int:
        """How many trees are not yet closed."""
        return int(self.client.zcard(self.ks.active_roots))

    def roots_with_prefix(self, prefix: str, limit: int = 2) -> list[str]:
        """Up to ``limit`` ids of open trees' roots starting with ``prefix``: one pass over
        the open-trees index (ZSCAN with MATCH, filtered in Redis), never the keyspace."""
        pattern = "".join("\\" + c if c in "*?[]\\" else c for c in prefix) + "*"
        found: list[str] = []
        cursor = 0
        while True:
            cursor, batch = self.client.zscan(self.ks.active_roots, cursor, match=pattern,
                                              count=1000)
            found += [str(member) for member, _ in batch if str(member) not in found]
            if cursor == 0 or len(found) >= limit:
                return found[:limit]

    def read_contexts(self, refs: Sequence[tuple[str, str]]) -> list[dict[str, str]]:
        """The hashes of contexts given as (root id, context id), possibly of many trees,
        in one round trip per 500 ({} for a context whose keys are gone)."""
        out: list[dict[str, str]] = []
        for start in range(0, len(refs), 500):
            pipe = self.client.pipeline(transaction=False)
            for root, ctx_id in refs[start:start + 500]:
                pipe.hgetall(self.ks.ctx(root, ctx_id))
            out += [{str(k): str(v) for k, v in h.items()} for h in pipe.execute()]
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
        raw = self.client.hgetall(self.ks.spend_by(label, day or utc_day()))
        return {str(k): int(v) for k, v in raw.items()}

    def add_closed_tree(self, spent: int, labels: Mapping[str, str | None],
                        retention_s: int) -> None:
        """Add a closed tree's spend (micro-USD) to today's views named by ``labels``
        (``org``, ``team``, ``service``; empty values are skipped). One round trip; the
        views expire after ``retention_s``."""
        views = {k: v for k, v in labels.items() if v}
        if not spent or not views:
            return
        day = utc_day()
        pipe = self.client.pipeline(transaction=False)
        for label, value in views.items():
            pipe.hincrby(self.ks.spend_by(label, day), value, spent)
            pipe.expire(self.ks.spend_by(label, day), retention_s)
        pipe.execute()
