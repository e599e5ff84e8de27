"""The trees opened in the last minute that the dashboard's indexer has not placed in its
indexes yet, read from the library's open-tree shards: a listing made just after a tree
was created shows it (read-your-writes), before the indexer's next pass."""

from __future__ import annotations

from collections.abc import Sequence

from ..core.keys import KeySpace
from .dashboard_reads import fields_of, redis_ms
from .topology import Client

FRESH_MS = 60_000
"""How far back a tree counts as just opened (creation scores come from the creating
process's clock: this much slack covers its skew and an indexer's pause)."""
PER_SHARD = 8
"""The newest trees of each shard looked at (a burst of more new trees than this in one
shard waits for the indexer)."""


def unindexed_new(client: Client, ks: KeySpace, row_fields: Sequence[str]
                  ) -> tuple[list[tuple[str, dict[str, str], float]], int]:
    """(root, row fields, creation ms in the open-tree shards) of the open trees created
    within FRESH_MS that the indexer has not placed, newest first, and Redis time. One
    round trip (the shards' newest and TIME); one more when some tree is that new (is it
    placed?), and one more when some is not placed yet (their rows)."""
    pipe = client.pipeline(transaction=False)
    for key in ks.roots_shards():
        pipe.zrevrange(key, 0, PER_SHARD - 1, withscores=True)
    pipe.time()
    res = pipe.execute()
    now = redis_ms(res[-1])
    recent = sorted(((float(s), str(r)) for shard in res[:-1] for r, s in shard
                     if float(s) >= now - FRESH_MS), reverse=True)
    if not recent:
        return [], now
    placed = client.hmget(ks.dash("indexed"), [r for _, r in recent])
    missing = [(r, s) for (s, r), p in zip(recent, placed, strict=True) if p is None]
    if not missing:
        return [], now
    pipe = client.pipeline(transaction=False)
    for root, _ in missing:
        pipe.hmget(ks.ctx(root, root), list(row_fields))
    return [(root, fields_of(row_fields, h), created)
            for (root, created), h in zip(missing, pipe.execute(), strict=True)], now
