"""The dashboard indexer's writes: its lease, the sorted indexes and open-tree views it
keeps beside the library's keys (from the tree hashes it reads), the breaker and window
keys it discovers, and alert dedup and emission.

Key names: KeySpace's ``dash*``. Written outside the atomic scripts: views, never the
truth, rebuilt from the tree hashes at any time."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.keys import DASH_SORTS, KeySpace
from ..core.script_constants import EVENT_STREAM_CAP
from ..core.vocabulary import StopReason
from .dashboard_reads import fields_of, redis_ms
from .topology import Client
from .views import merge_shards

REFUSAL_REASONS = tuple(r.value for r in StopReason)
INDEX_FIELDS = ("u:usd", "h:usd", "l:usd", "status", "reason", "created_ms", "meta",
                "u:steps", "u:tin", "u:tout", "id", *(f"nr:{r}" for r in REFUSAL_REASONS))
"""The context hash fields the indexer reads of a root (``nr:<reason>``: its own refused
calls by reason, lib/calls_counted.lua)."""


@dataclass(frozen=True)
class IndexEntry:
    """What the indexer writes for one root."""

    root: str
    scores: dict[str, float]
    """The scores that changed (all of them when the root is new to its scopes)."""
    scopes: list[str]
    old_scopes: list[str]
    labels: dict[str, str] | None
    """None: unchanged."""
    rate: float | None
    """None: unchanged."""
    samples: list[tuple[int, int]] | None
    """None: unchanged."""


class DashboardIndex:
    """The indexer's reads and writes of one tenant's key space (decoding client)."""

    def __init__(self, client: Client, keyspace: KeySpace) -> None:
        self.client = client
        self.ks = keyspace

    def lead(self, owner: str, ttl_ms: int) -> bool:
        """Take or keep the indexer's lease; True when ``owner`` holds it."""
        key = self.ks.dash("leader")
        if self.client.set(key, owner, nx=True, px=ttl_ms):
            return True
        if self.client.get(key) == owner:
            self.client.pexpire(key, ttl_ms)
            return True
        return False

    def resign(self, owner: str) -> None:
        key = self.ks.dash("leader")
        if self.client.get(key) == owner:
            self.client.delete(key)

    def announce(self, roots: Sequence[str]) -> None:
        """Tell every dashboard that these trees are now in the indexes."""
        self.client.publish(self.ks.dash("index"), json.dumps({"roots": list(roots)[:100]}))

    def open_roots(self, shard: int, start: int, count: int) -> list[tuple[str, float]]:
        """A slice of one shard (0 to VIEW_SHARDS - 1) of the library's index of open trees
        (root, creation ms), oldest first."""
        res: Any = self.client.zrange(self.ks.roots_shards()[shard], start,
                                      start + count - 1, withscores=True)
        return [(str(r), float(s)) for r, s in res]

    def indexed(self) -> dict[str, str]:
        """Every indexed root with the labels JSON it is indexed under (once per sweep)."""
        return {str(k): str(v) for k, v in self.client.hgetall(self.ks.dash("indexed")).items()}

    def new_roots(self, score: float, limit: int) -> list[tuple[str, float]]:
        """The ``limit`` oldest open trees created at or after ``score`` (creation ms),
        oldest first: at most ``limit`` of each shard, merged, in one round trip."""
        pipe = self.client.pipeline(transaction=False)
        for key in self.ks.roots_shards():
            pipe.zrangebyscore(key, score, "+inf", start=0, num=limit, withscores=True)
        return merge_shards(pipe.execute(), newest_first=False)[:limit]

    def read_for_index(self, roots: Sequence[str]) -> tuple[
            list[dict[str, str]], list[str | None], list[str | None], list[float | None], int]:
        """Per root: its index fields, its burn samples JSON, the labels it is indexed
        under (JSON), its creation ms in the open-tree shards (the newest of all trees
        are listed from there: the age index ranks by the same score); and Redis time.
        One round trip."""
        pipe = self.client.pipeline(transaction=False)
        for root in roots:
            pipe.hmget(self.ks.ctx(root, root), list(INDEX_FIELDS))
        for root in roots:
            pipe.zscore(self.ks.roots_shard(root), root)
        pipe.hmget(self.ks.dash("samples"), list(roots))
        pipe.hmget(self.ks.dash("indexed"), list(roots))
        pipe.time()
        res = pipe.execute()
        n = len(roots)
        return ([fields_of(INDEX_FIELDS, v) for v in res[:n]], list(res[2 * n]),
                list(res[2 * n + 1]), [None if s is None else float(s) for s in res[n:2 * n]],
                redis_ms(res[-1]))

    def write_index(self, entries: Sequence[IndexEntry]) -> None:
        """Write what changed of each root (its scores in its scopes, leaving the scopes it
        left; its rate, samples and labels), in one round trip of one command per key
        touched (members of one index go in one ZADD)."""
        zadd: dict[str, dict[str, float]] = {}
        zrem: dict[str, list[str]] = {}
        hashes: dict[str, dict[Any, Any]] = {"rate": {}, "indexed": {}, "samples": {}}
        for e in entries:
            for scope in e.old_scopes:
                if scope not in e.scopes:
                    for sort in DASH_SORTS:
                        zrem.setdefault(self.ks.dash_index(sort, scope), []).append(e.root)
            for scope in e.scopes:
                for sort, score in e.scores.items():
                    zadd.setdefault(self.ks.dash_index(sort, scope), {})[e.root] = score
            if e.rate is not None:
                hashes["rate"][e.root] = repr(e.rate)
            if e.labels is not None:
                hashes["indexed"][e.root] = json.dumps(e.labels)
            if e.samples is not None:
                hashes["samples"][e.root] = json.dumps(e.samples)
        pipe = self.client.pipeline(transaction=False)
        for key, members in zrem.items():
            pipe.zrem(key, *members)
        for key, scores in zadd.items():
            pipe.zadd(key, scores)
        for name, values in hashes.items():
            if values:
                pipe.hset(self.ks.dash(name), mapping=values)
        pipe.execute()

    def unindex(self, gone: Mapping[str, Sequence[str]]) -> None:
        """Remove closed or expired roots (root -> its scopes) from every index."""
        pipe = self.client.pipeline(transaction=False)
        for root, root_scopes in gone.items():
            for scope in root_scopes:
                for sort in DASH_SORTS:
                    pipe.zrem(self.ks.dash_index(sort, scope), root)
            for name in ("rate", "indexed", "samples"):
                pipe.hdel(self.ks.dash(name), root)
        pipe.execute()

    def full_hashes(self, roots: Sequence[str]) -> list[dict[str, str]]:
        """All fields of each root's hash (for the per-provider token counters)."""
        pipe = self.client.pipeline(transaction=False)
        for root in roots:
            pipe.hgetall(self.ks.ctx(root, root))
        return [{str(k): str(v) for k, v in h.items()} for h in pipe.execute()]

    def write_aggregates(self, views: Mapping[str, Mapping[str, float]], ttl_s: int) -> None:
        """Replace the open-trees views (``dash_open``): new values written, values gone
        deleted (no moment without a view; no cross-key transaction, which a Redis
        Cluster would refuse)."""
        keys = {name: self.ks.dash_open(name) for name in views}
        pipe = self.client.pipeline(transaction=False)
        for key in keys.values():
            pipe.hkeys(key)
        old = dict(zip(keys, pipe.execute(), strict=True))
        pipe = self.client.pipeline(transaction=False)
        for name, values in views.items():
            if values:
                pipe.hset(keys[name], mapping={k: int(v) for k, v in values.items()})
                pipe.expire(keys[name], ttl_s)
            gone = [str(k) for k in old[name] if str(k) not in values]
            if gone:
                pipe.hdel(keys[name], *gone)
        pipe.execute()

    def add_closed_provider(self, day: str, by_provider: Mapping[str, int], ttl_s: int) -> None:
        key = self.ks.dash_closed_provider(day)
        pipe = self.client.pipeline(transaction=False)
        for provider, micro in by_provider.items():
            pipe.hincrby(key, provider, micro)
        pipe.expire(key, ttl_s)
        pipe.execute()

    def discover_shield(self, cursor: int, count: int) -> int:
        """One SCAN step for breaker and window keys (remembered in ``dash("shield")``);
        returns the next cursor (0: the keyspace was walked once)."""
        shield = self.ks.dash("shield")
        cursor, keys = self.client.scan(cursor, match=f"{self.ks.prefix}:{{*", count=count)
        found = [str(k) for k in keys
                 if (":{brk:" in str(k) and str(k).endswith(":state"))
                 or (":{win:" in str(k) and str(k).endswith(":calls"))]
        pipe = self.client.pipeline(transaction=False)
        if found:
            pipe.sadd(shield, *found)
        members = list(self.client.smembers(shield))
        for key in members:
            pipe.exists(key)
        res = pipe.execute()[1 if found else 0:]
        stale = [m for m, alive in zip(members, res, strict=True) if not alive]
        if stale:
            self.client.srem(shield, *stale)
        return int(cursor)

    def claim_alerts(self, keys: Sequence[tuple[str, str]], ttl_s: int) -> list[bool]:
        """SET NX of each (root, threshold) dedup key: True where this call claimed it."""
        pipe = self.client.pipeline(transaction=False)
        for root, threshold in keys:
            pipe.set(self.ks.dash_alerted(root, threshold), "1", nx=True, ex=ttl_s)
        return [bool(r) for r in pipe.execute()]

    def publish_alert(self, alert_json: str) -> None:
        """Publish an alert that belongs to no context (a quota bucket's)."""
        self.client.publish(self.ks.dash("alerts"), alert_json)

    def emit_alert(self, root: str, ctx_id: str, event_json: str, alert_json: str) -> None:
        """Append the alert's SafetyEvent to the context's event list and publish it."""
        pipe = self.client.pipeline(transaction=False)
        pipe.rpush(self.ks.events(root, ctx_id), event_json)
        pipe.ltrim(self.ks.events(root, ctx_id), -EVENT_STREAM_CAP, -1)
        pipe.publish(self.ks.dash("alerts"), alert_json)
        pipe.execute()
