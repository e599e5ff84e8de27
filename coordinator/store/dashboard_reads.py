"""The dashboard's reads: overview pages from its sorted indexes, the tree walk, spend,
breakers and windows, the open-tree counts for /metrics, and its pub/sub subscription.

The key names (``P:dash:*``, the tenant's prefix ``P``) are KeySpace's ``dash*``; the
indexes are written by store/dashboard_index.py. They are views, never the truth."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from ..core.keys import DASH_SORTS, VIEW_SHARDS, KeySpace
from .recent_entries import newest_entries
from .topology import Client
from .views import merge_shards

BACKEND_ERRORS: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
"""What a read raises when Redis cannot answer (the web part maps it to 503)."""

SHARDS_DEPTH = 200
"""How deep the newest of all trees is read from the library's open-tree shards; deeper
pages read the indexer's ``age`` index, so that no page reads more than this per shard."""


def fields_of(fields: Sequence[str], values: Sequence[Any]) -> dict[str, str]:
    """An HMGET reply as a dict, the missing fields left out."""
    return {f: str(v) for f, v in zip(fields, values, strict=True) if v is not None}


def redis_ms(reply: Sequence[Any]) -> int:
    """A TIME reply in milliseconds."""
    return int(reply[0]) * 1000 + int(reply[1]) // 1000


def _text(h: Mapping[Any, Any]) -> dict[str, str]:
    return {str(k): str(v) for k, v in h.items()}


@dataclass(frozen=True)
class Page:
    """One page of the overview, as read."""

    total: int
    roots: list[str]
    hashes: list[dict[str, str]]
    rates: list[float]
    now_ms: int
    scores: list[float]
    """Each root's score in the index read (creation ms for the newest of all trees)."""
    start: int
    """The rank of the first root read (the page's offset, less room for fresh trees)."""
    indexed: bool
    """Read from the indexer's index (False: the library's open-tree shards)."""
    placed: frozenset[str] = frozenset()
    """The fresh roots asked about that the index holds by now."""


@dataclass(frozen=True)
class TreeRead:
    """A whole tree as read: hashes by context id, children, recent node records and
    events."""

    root: str
    hashes: dict[str, dict[str, str]]
    children: dict[str, list[str]]
    truncated: bool
    nodes: list[tuple[str, str]]
    """(context id, node JSON), newest first."""
    events: list[tuple[str, str]]
    now_ms: int


class Subscription:
    """The process's pub/sub connection (messages as (channel, data) text)."""

    def __init__(self, client: Client, channels: Iterable[str]) -> None:
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


class DashboardReads:
    """The dashboard's reads of one tenant's key space. The client must decode responses
    (``Coordinator.client`` does); ``row_fields`` are the context hash fields of a row."""

    def __init__(self, client: Client, keyspace: KeySpace,
                 row_fields: Sequence[str]) -> None:
        self.client = client
        self.ks = keyspace
        self.row_fields = list(row_fields)

    def channels(self) -> list[str]:
        """The channels the live feed listens to: stops, ledger updates, alerts, trees
        newly indexed."""
        return [self.ks.abort_channel, self.ks.ledger_channel, self.ks.dash("alerts"),
                self.ks.dash("index")]

    def subscribe(self, channels: Iterable[str]) -> Subscription:
        return Subscription(self.client, channels)

    def ping(self) -> bool:
        return bool(self.client.ping())

    def now_ms(self) -> int:
        return redis_ms(self.client.time())

    # -- overview ------------------------------------------------------------------------

    def from_shards(self, sort: str, scope: str | None, offset: int, limit: int) -> bool:
        """Whether :meth:`page` reads the library's open-tree shards (the newest of all
        trees down to SHARDS_DEPTH), which hold every open tree, not the indexer's index."""
        return sort == "age" and scope is None and offset + limit <= SHARDS_DEPTH

    def page(self, sort: str, scope: str | None, offset: int, limit: int,
             fresh: Sequence[str] = ()) -> Page:
        """Roots ordered by ``sort`` within ``scope`` (None: all trees), by score then
        id, largest first, two round trips: the index range (for the newest of all trees
        down to SHARDS_DEPTH, the library's VIEW_SHARDS shards of open trees, each read
        up to ``offset + limit`` and merged), then each root's hash: at most ``limit`` +
        2 * VIEW_SHARDS + 2 commands, whatever the number of trees or the depth of the
        page. An index range starts ``len(fresh)`` ranks early, so that the ``fresh``
        roots (opened since the indexer's pass) can be merged in at their place
        (dashboard/listing.py); which of them the index holds by now is asked too."""
        if sort not in DASH_SORTS:
            raise ValueError(f"sort must be one of {DASH_SORTS}")
        pipe = self.client.pipeline(transaction=False)
        placed: frozenset[str] = frozenset()
        if self.from_shards(sort, scope, offset, limit):
            # the library's own index, by creation time: a tree shows at once, before
            # the indexer places it
            for key in self.ks.roots_shards():
                pipe.zcard(key)
                pipe.zrevrange(key, 0, offset + limit - 1, withscores=True)
            res = pipe.execute()
            total = sum(int(n) for n in res[0::2])
            newest = merge_shards(res[1::2], newest_first=True)
            roots = [r for r, _ in newest[offset:offset + limit]]
            scores = [s for _, s in newest[offset:offset + limit]]
            start, indexed = offset, False
        else:
            key = self.ks.dash_index(sort, scope or "all")
            start = max(0, offset - len(fresh))
            pipe.zcard(key)
            pipe.zrevrange(key, start, offset + limit - 1, withscores=True)
            for root in fresh:
                pipe.zscore(key, root)
            total, found, *held = pipe.execute()
            placed = frozenset(r for r, h in zip(fresh, held, strict=True) if h is not None)
            roots, scores, indexed = [str(r) for r, _ in found], [float(s) for _, s in found], True
        pipe = self.client.pipeline(transaction=False)
        for root in roots:
            pipe.hmget(self.ks.ctx(root, root), self.row_fields)
        if roots:
            pipe.hmget(self.ks.dash("rate"), roots)
        pipe.time()
        res = pipe.execute()
        hashes = [fields_of(self.row_fields, v) for v in res[: len(roots)]]
        rates = [float(r or 0) for r in res[len(roots)]] if roots else []
        return Page(int(total), roots, hashes, rates, redis_ms(res[-1]), scores, start,
                    indexed, placed)

    def root_hashes(self, roots: Sequence[str]) -> tuple[list[dict[str, str]], int]:
        """The row fields of each root, and Redis time, in one round trip."""
        pipe = self.client.pipeline(transaction=False)
        for root in roots:
            pipe.hmget(self.ks.ctx(root, root), self.row_fields)
        pipe.time()
        res = pipe.execute()
        return [fields_of(self.row_fields, v) for v in res[:-1]], redis_ms(res[-1])

    def rate(self, root: str) -> float:
        value = self.client.hget(self.ks.dash("rate"), root)
        return float(value) if value else 0.0

    # -- one tree ------------------------------------------------------------------------

    def locate(self, ctx_id: str) -> str | None:
        root = self.client.get(self.ks.locator(ctx_id))
        return str(root) if root is not None else None

    def context(self, root: str, ctx_id: str) -> dict[str, str]:
        return _text(self.client.hgetall(self.ks.ctx(root, ctx_id)))

    def tree(self, root: str, *, max_contexts: int, recent: int) -> TreeRead:
        """The tree under ``root``, breadth first (one round trip per depth), at most
        ``max_contexts`` contexts; then the ``recent`` newest node records and events of
        the whole tree (two round trips each, store/recent_entries.py) and Redis time."""
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
                hashes[cid] = _text(res[2 * i])
                kids = sorted(str(k) for k in res[2 * i + 1])
                # contexts taken so far: read, still to read at this depth, queued below
                room = max_contexts - len(hashes) - (len(frontier) - i - 1) - len(nxt)
                if len(kids) > room:
                    kids, truncated = kids[:max(0, room)], True
                children[cid] = kids
                nxt += kids
            frontier = nxt
        nodes = newest_entries(self.client, [(c, self.ks.nodes(root, c)) for c in hashes],
                               recent)
        events = newest_entries(self.client, [(c, self.ks.events(root, c)) for c in hashes],
                                recent)
        return TreeRead(root, hashes, children, truncated, nodes, events, self.now_ms())

    # -- spend, shield, counts -----------------------------------------------------------

    def spend(self, day: str, labels: Sequence[str]) -> dict[str, dict[str, dict[str, int]]]:
        """{label: {"closed": {value: micro}, "open": {value: micro}}} for ``day`` (closed
        trees, the library's views, summed over their VIEW_SHARDS shards) and now (open
        trees, the indexer's view). One round trip."""
        pipe = self.client.pipeline(transaction=False)
        parts: list[int] = []  # how many closed-spend hashes each label has
        for label in labels:
            if label == "provider":
                pipe.hgetall(self.ks.dash_closed_provider(day))
                parts.append(1)
            else:
                for shard in range(VIEW_SHARDS):
                    pipe.hgetall(self.ks.spend_by(label, day, shard))
                parts.append(VIEW_SHARDS)
            pipe.hgetall(self.ks.dash_open(label))
        res = pipe.execute()
        out, i = {}, 0
        for label, n in zip(labels, parts, strict=True):
            closed: dict[str, int] = {}
            for h in res[i:i + n]:
                for k, v in h.items():
                    closed[str(k)] = closed.get(str(k), 0) + int(v)
            out[label] = {"closed": closed,
                          "open": {str(k): int(v) for k, v in res[i + n].items()}}
            i += n + 1
        return out

    def shield(self, limit: int = 500) -> tuple[list[tuple[str, dict[str, str]]],
                                                list[tuple[str, int, int]], int]:
        """Breakers (key, state hash) and windows (calls key, calls, micro-USD) that the
        indexer has seen, and Redis time."""
        members: Any = self.client.srandmember(self.ks.dash("shield"), limit)
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
                breakers.append((key, _text(res[i])))
                i += 1
            else:
                windows.append((key, int(res[i]), int(res[i + 1] or 0)))
                i += 2
        return breakers, windows, redis_ms(res[-1])

    def counts(self) -> tuple[int, dict[str, dict[str, int]]]:
        """Open trees (the sum of the shards' sizes) and the open-spend views by label,
        for /metrics (one round trip)."""
        pipe = self.client.pipeline(transaction=False)
        for key in self.ks.roots_shards():
            pipe.zcard(key)
        names = ("org", "team", "service", "provider", "stops", "held", "near", "refused")
        for name in names:
            pipe.hgetall(self.ks.dash_open(name))
        res = pipe.execute()
        return sum(int(n) for n in res[:VIEW_SHARDS]), {
            n: {str(k): int(v) for k, v in r.items()}
            for n, r in zip(names, res[VIEW_SHARDS:], strict=True)}
