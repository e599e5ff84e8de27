"""Every Redis command the dashboard sends: page reads, the tree walk, the sorted
indexes it keeps beside the library's keys, alert dedup and events, and its one pub/sub
subscription. (This module moves into the Redis layer, ``coordinator/store/``.)

The indexes are views, never the truth: written outside the atomic scripts by the
dashboard's indexer, rebuilt from the tree hashes at any time. Their keys, under the
tenant's prefix ``P`` (``bc`` or ``bc:t:<tenant>``)::

    P:dash:idx:<sort>:<scope>   zset    root -> score (sort: spend, fraction, burn, age;
                                         scope: all, or label=value)
    P:dash:rate                 hash    root -> USD per minute (burn rate)
    P:dash:samples              hash    root -> JSON [[redis ms, micro-USD], ...]
    P:dash:indexed              hash    root -> JSON labels (the scopes it is indexed in)
    P:dash:open:<label>         hash    value -> micro-USD of the open trees (org, team,
                                         service, provider)
    P:dash:closed:provider:<day> hash   provider -> micro-USD of trees closed that day
    P:dash:shield               set     breaker and window keys seen by the indexer
    P:dash:alerted:<root>:<threshold>   string  alert dedup (SET NX, expires)
    P:dash:leader               string  which dashboard process maintains the indexes
    P:dash:alerts               channel alerts as they are emitted
    P:dash:index                channel trees just placed in the indexes
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from ..keys import KeySpace
from .model import ROW_FIELDS, SORTS

BACKEND_ERRORS: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
"""What a read raises when Redis cannot answer (the web part maps it to 503)."""
STREAM_CAP = 10_000
_INDEX_FIELDS = ("u:usd", "h:usd", "l:usd", "status", "reason", "created_ms", "meta",
                 "u:steps", "u:tin", "u:tout", "id")


def _h(fields: Sequence[str], values: Sequence[Any]) -> dict[str, str]:
    return {f: str(v) for f, v in zip(fields, values, strict=True) if v is not None}


@dataclass(frozen=True)
class Page:
    """One page of the overview, as read."""

    total: int
    roots: list[str]
    hashes: list[dict[str, str]]
    rates: list[float]
    now_ms: int


@dataclass(frozen=True)
class TreeRead:
    """A whole tree as read: hashes by context id, children, recent stream entries."""

    root: str
    hashes: dict[str, dict[str, str]]
    children: dict[str, list[str]]
    truncated: bool
    nodes: list[tuple[str, str, str]]
    """(stream id, context id, node JSON), newest first."""
    events: list[tuple[str, str, str]]
    now_ms: int


class Subscription:
    """The process's pub/sub connection (messages as (channel, data) text)."""

    def __init__(self, client: redis.Redis, channels: Iterable[str]) -> None:
        self._pubsub = client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
        self._pubsub.subscribe(*channels)

    def get(self, timeout: float) -> tuple[str, str] | None:
        msg = self._pubsub.get_message(timeout=timeout)
        if msg is None:
            return None
        return str(msg["channel"]), str(msg["data"])

    def close(self) -> None:
        try:
            self._pubsub.close()
        except BACKEND_ERRORS:
            pass


class Views:
    """The dashboard's Redis reads and index writes for one tenant's key space. The
    client must decode responses (``Coordinator.client`` does)."""

    def __init__(self, client: redis.Redis, keyspace: KeySpace) -> None:
        self.client = client
        self.ks = keyspace
        self.dash = f"{keyspace.prefix}:dash"

    # -- keys ----------------------------------------------------------------------------

    def index_key(self, sort: str, scope: str) -> str:
        return f"{self.dash}:idx:{sort}:{scope}"

    @property
    def alert_channel(self) -> str:
        return f"{self.dash}:alerts"

    def channels(self) -> list[str]:
        """The channels the live feed listens to: stops, ledger updates, alerts, trees
        newly indexed."""
        return [self.ks.abort_channel, self.ks.ledger_channel, self.alert_channel,
                f"{self.dash}:index"]

    def announce(self, roots: Sequence[str]) -> None:
        """Tell every dashboard that these trees are now in the indexes."""
        self.client.publish(f"{self.dash}:index", json.dumps({"roots": list(roots)[:100]}))

    def subscribe(self, channels: Iterable[str]) -> Subscription:
        return Subscription(self.client, channels)

    # -- health --------------------------------------------------------------------------

    def ping(self) -> bool:
        return bool(self.client.ping())

    def now_ms(self) -> int:
        sec, usec = self.client.time()
        return int(sec) * 1000 + int(usec) // 1000

    # -- overview ------------------------------------------------------------------------

    def page(self, sort: str, scope: str | None, offset: int, limit: int) -> Page:
        """Roots ordered by ``sort`` within ``scope`` (None: all trees), two round trips
        of at most ``limit`` + 4 commands: the index range, then each root's hash."""
        if sort not in SORTS:
            raise ValueError(f"sort must be one of {SORTS}")
        if sort == "age" and scope is None:
            key = self.ks.active_roots  # the library's own index, by creation time
        else:
            key = self.index_key(sort, scope or "all")
        pipe = self.client.pipeline(transaction=False)
        pipe.zcard(key)
        pipe.zrevrange(key, offset, offset + limit - 1)
        total, roots = pipe.execute()
        roots = [str(r) for r in roots]
        pipe = self.client.pipeline(transaction=False)
        for root in roots:
            pipe.hmget(self.ks.ctx(root, root), list(ROW_FIELDS))
        if roots:
            pipe.hmget(f"{self.dash}:rate", roots)
        pipe.time()
        res = pipe.execute()
        hashes = [_h(ROW_FIELDS, v) for v in res[: len(roots)]]
        rates = [float(r or 0) for r in res[len(roots)]] if roots else []
        sec, usec = res[-1]
        return Page(int(total), roots, hashes, rates, int(sec) * 1000 + int(usec) // 1000)

    def root_hashes(self, roots: Sequence[str]) -> tuple[list[dict[str, str]], int]:
        """The row fields of each root, and Redis time, in one round trip."""
        pipe = self.client.pipeline(transaction=False)
        for root in roots:
            pipe.hmget(self.ks.ctx(root, root), list(ROW_FIELDS))
        pipe.time()
        res = pipe.execute()
        sec, usec = res[-1]
        return [_h(ROW_FIELDS, v) for v in res[:-1]], int(sec) * 1000 + int(usec) // 1000

    def rate(self, root: str) -> float:
        value = self.client.hget(f"{self.dash}:rate", root)
        return float(value) if value else 0.0

    # -- one tree ------------------------------------------------------------------------

    def locate(self, ctx_id: str) -> str | None:
        root = self.client.get(self.ks.locator(ctx_id))
        return str(root) if root is not None else None

    def context(self, root: str, ctx_id: str) -> dict[str, str]:
        return {str(k): str(v) for k, v in self.client.hgetall(self.ks.ctx(root, ctx_id)).items()}

    def tree(self, root: str, *, max_contexts: int, recent: int) -> TreeRead:
        """The tree under ``root``, breadth first (one round trip per depth), at most
        ``max_contexts`` contexts; then the ``recent`` newest node records and events of
        each of the first 100 contexts, in one more round trip."""
        hashes: dict[str, dict[str, str]] = {}
        children: dict[str, list[str]] = {}
        frontier, truncated = [root], False
        while frontier:
            pipe = self.client.pipeline(transaction=False)
            for cid in frontier:
                pipe.hgetall(self.ks.ctx(root, cid))
                pipe.smembers(self.ks.kids(root, cid))
            res = pipe.execute()
            nxt: list[str] = []
            for i, cid in enumerate(frontier):
                hashes[cid] = {str(k): str(v) for k, v in res[2 * i].items()}
                kids = sorted(str(k) for k in res[2 * i + 1])
                # contexts taken so far: read, still to read at this depth, queued below
                room = max_contexts - len(hashes) - (len(frontier) - i - 1) - len(nxt)
                if len(kids) > room:
                    kids, truncated = kids[:max(0, room)], True
                children[cid] = kids
                nxt += kids
            frontier = nxt
        shown = list(hashes)[:100]
        pipe = self.client.pipeline(transaction=False)
        for cid in shown:
            pipe.xrevrange(self.ks.nodes(root, cid), count=recent)
            pipe.xrevrange(self.ks.events(root, cid), count=recent)
        pipe.time()
        res = pipe.execute()
        nodes: list[tuple[str, str, str]] = []
        events: list[tuple[str, str, str]] = []
        for i, cid in enumerate(shown):
            nodes += [(str(sid), cid, str(f.get("n", ""))) for sid, f in res[2 * i]]
            events += [(str(sid), cid, str(f.get("e", ""))) for sid, f in res[2 * i + 1]]
        nodes.sort(key=lambda e: _stream_order(e[0]), reverse=True)
        events.sort(key=lambda e: _stream_order(e[0]), reverse=True)
        sec, usec = res[-1]
        return TreeRead(root, hashes, children, truncated, nodes[:recent], events[:recent],
                        int(sec) * 1000 + int(usec) // 1000)

    # -- spend and shield ----------------------------------------------------------------

    def spend(self, day: str, labels: Sequence[str]) -> dict[str, dict[str, dict[str, int]]]:
        """{label: {"closed": {value: micro}, "open": {value: micro}}} for ``day`` (closed
        trees, the library's views) and now (open trees, the indexer's view)."""
        pipe = self.client.pipeline(transaction=False)
        for label in labels:
            if label == "provider":
                pipe.hgetall(f"{self.dash}:closed:provider:{day}")
            else:
                pipe.hgetall(self.ks.spend_by(label, day))
            pipe.hgetall(f"{self.dash}:open:{label}")
        res = pipe.execute()
        out = {}
        for i, label in enumerate(labels):
            out[label] = {"closed": {str(k): int(v) for k, v in res[2 * i].items()},
                          "open": {str(k): int(v) for k, v in res[2 * i + 1].items()}}
        return out

    def shield(self, limit: int = 500) -> tuple[list[tuple[str, dict[str, str]]],
                                                list[tuple[str, int, int]], int]:
        """Breakers (key, state hash) and windows (calls key, calls, micro-USD) that the
        indexer has seen, and Redis time."""
        members: Any = self.client.srandmember(f"{self.dash}:shield", limit)
        keys = sorted(str(k) for k in members or [])
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            if key.endswith(":state"):
                pipe.hgetall(key)
            else:
                pipe.zcard(key)
                pipe.get(key[: -len("calls")] + "usd")
        pipe.time()
        res = pipe.execute()
        breakers, windows, i = [], [], 0
        for key in keys:
            if key.endswith(":state"):
                breakers.append((key, {str(k): str(v) for k, v in res[i].items()}))
                i += 1
            else:
                windows.append((key, int(res[i]), int(res[i + 1] or 0)))
                i += 2
        sec, usec = res[-1]
        return breakers, windows, int(sec) * 1000 + int(usec) // 1000

    def counts(self) -> tuple[int, dict[str, dict[str, int]]]:
        """Open trees and the open-spend views by label, for /metrics (one round trip)."""
        pipe = self.client.pipeline(transaction=False)
        pipe.zcard(self.ks.active_roots)
        names = ("org", "team", "service", "provider", "stops", "held")
        for name in names:
            pipe.hgetall(f"{self.dash}:open:{name}")
        res = pipe.execute()
        return int(res[0]), {n: {str(k): int(v) for k, v in r.items()}
                             for n, r in zip(names, res[1:], strict=True)}

    # -- index maintenance (the indexer) -------------------------------------------------

    def lead(self, owner: str, ttl_ms: int) -> bool:
        """Take or keep the indexer's lease; True when ``owner`` holds it."""
        key = f"{self.dash}:leader"
        if self.client.set(key, owner, nx=True, px=ttl_ms):
            return True
        if self.client.get(key) == owner:
            self.client.pexpire(key, ttl_ms)
            return True
        return False

    def resign(self, owner: str) -> None:
        key = f"{self.dash}:leader"
        if self.client.get(key) == owner:
            self.client.delete(key)

    def open_roots(self, start: int, count: int) -> list[tuple[str, float]]:
        """A slice of the library's index of open trees (root, creation ms)."""
        res: Any = self.client.zrange(self.ks.active_roots, start, start + count - 1,
                                      withscores=True)
        return [(str(r), float(s)) for r, s in res]

    def indexed(self) -> dict[str, str]:
        """Every indexed root with the labels JSON it is indexed under (once per sweep)."""
        return {str(k): str(v) for k, v in self.client.hgetall(f"{self.dash}:indexed").items()}

    def new_roots(self, score: float, limit: int) -> list[tuple[str, float]]:
        """Open trees created at or after ``score`` (creation ms), oldest first."""
        res: Any = self.client.zrangebyscore(self.ks.active_roots, score, "+inf", start=0,
                                             num=limit, withscores=True)
        return [(str(r), float(s)) for r, s in res]

    def read_for_index(self, roots: Sequence[str]
                       ) -> tuple[list[dict[str, str]], list[str | None], list[str | None], int]:
        """Per root: its index fields, its burn samples JSON, the labels it is indexed
        under (JSON); and Redis time. One round trip."""
        pipe = self.client.pipeline(transaction=False)
        for root in roots:
            pipe.hmget(self.ks.ctx(root, root), list(_INDEX_FIELDS))
        pipe.hmget(f"{self.dash}:samples", list(roots))
        pipe.hmget(f"{self.dash}:indexed", list(roots))
        pipe.time()
        res = pipe.execute()
        n = len(roots)
        sec, usec = res[-1]
        return ([_h(_INDEX_FIELDS, v) for v in res[:n]], list(res[n]), list(res[n + 1]),
                int(sec) * 1000 + int(usec) // 1000)

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
                    for sort in SORTS:
                        zrem.setdefault(self.index_key(sort, scope), []).append(e.root)
            for scope in e.scopes:
                for sort, score in e.scores.items():
                    zadd.setdefault(self.index_key(sort, scope), {})[e.root] = score
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
                pipe.hset(f"{self.dash}:{name}", mapping=values)
        pipe.execute()

    def unindex(self, gone: Mapping[str, Sequence[str]]) -> None:
        """Remove closed or expired roots (root -> its scopes) from every index."""
        pipe = self.client.pipeline(transaction=False)
        for root, root_scopes in gone.items():
            for scope in root_scopes:
                for sort in SORTS:
                    pipe.zrem(self.index_key(sort, scope), root)
            for name in ("rate", "indexed", "samples"):
                pipe.hdel(f"{self.dash}:{name}", root)
        pipe.execute()

    def full_hashes(self, roots: Sequence[str]) -> list[dict[str, str]]:
        """All fields of each root's hash (for the per-provider token counters)."""
        pipe = self.client.pipeline(transaction=False)
        for root in roots:
            pipe.hgetall(self.ks.ctx(root, root))
        return [{str(k): str(v) for k, v in h.items()} for h in pipe.execute()]

    def write_aggregates(self, views: Mapping[str, Mapping[str, float]], ttl_s: int) -> None:
        """Replace the open-trees views (``P:dash:open:<name>``): new values written,
        values gone deleted (no moment without a view; no cross-key transaction, which
        a Redis Cluster would refuse)."""
        keys = {name: f"{self.dash}:open:{name}" for name in views}
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
        key = f"{self.dash}:closed:provider:{day}"
        pipe = self.client.pipeline(transaction=False)
        for provider, micro in by_provider.items():
            pipe.hincrby(key, provider, micro)
        pipe.expire(key, ttl_s)
        pipe.execute()

    def discover_shield(self, cursor: int, count: int) -> int:
        """One SCAN step for breaker and window keys (remembered in ``P:dash:shield``);
        returns the next cursor (0: the keyspace was walked once)."""
        cursor, keys = self.client.scan(cursor, match=f"{self.ks.prefix}:{{*", count=count)
        found = [str(k) for k in keys
                 if (":{brk:" in str(k) and str(k).endswith(":state"))
                 or (":{win:" in str(k) and str(k).endswith(":calls"))]
        pipe = self.client.pipeline(transaction=False)
        if found:
            pipe.sadd(f"{self.dash}:shield", *found)
        members = list(self.client.smembers(f"{self.dash}:shield"))
        for key in members:
            pipe.exists(key)
        res = pipe.execute()[1 if found else 0:]
        stale = [m for m, alive in zip(members, res, strict=True) if not alive]
        if stale:
            self.client.srem(f"{self.dash}:shield", *stale)
        return int(cursor)

    # -- alerts --------------------------------------------------------------------------

    def claim_alerts(self, keys: Sequence[tuple[str, str]], ttl_s: int) -> list[bool]:
        """SET NX of each (root, threshold) dedup key: True where this call claimed it."""
        pipe = self.client.pipeline(transaction=False)
        for root, threshold in keys:
            pipe.set(f"{self.dash}:alerted:{root}:{threshold}", "1", nx=True, ex=ttl_s)
        return [bool(r) for r in pipe.execute()]

    def emit_alert(self, root: str, ctx_id: str, event_json: str, alert_json: str) -> None:
        """Append the alert's SafetyEvent to the context's event stream and publish it."""
        pipe = self.client.pipeline(transaction=False)
        pipe.xadd(self.ks.events(root, ctx_id), {"e": event_json}, maxlen=STREAM_CAP,
                  approximate=True)
        pipe.publish(self.alert_channel, alert_json)
        pipe.execute()


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


def _stream_order(stream_id: str) -> tuple[int, int]:
    ms, _, seq = stream_id.partition("-")
    return int(ms), int(seq or 0)
