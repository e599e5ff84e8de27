"""Cross-tree views: the indexes that span trees (where a context id lives, the trees still
open, spend of closed trees by label), read and written outside any one tree's slot."""

from __future__ import annotations

import time
from collections.abc import Mapping

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

    def active_roots(self, limit: int = 50) -> list[str]:
        """Root ids of trees not yet closed, oldest first."""
        return [str(r) for r in self.client.zrange(self.ks.active_roots, 0, limit - 1)]

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
