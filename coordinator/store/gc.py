"""Garbage collection of trees left open by processes that died: found after an idle time,
listed (dry run) or closed and set to expire (``budgetctl gc``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import redis

from ..core.keys import KeySpace
from ..core.labels import labels_of
from ..core.paths import Path
from .recent_entries import entry_ms
from .retention import walk
from .topology import Client
from .tree import Store
from .views import SPEND_LABELS, Views

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class IdleTree:
    """A tree still listed open with no activity for ``idle_s``."""

    root: str
    idle_s: float
    contexts: int
    spent_usd: float


@dataclass
class GcReport:
    """What a sweep found and did."""

    open: int = 0
    """Trees listed open, young ones included."""
    examined: int = 0
    """Open trees looked at (those created more than ``idle_s`` ago)."""
    idle: list[IdleTree] = field(default_factory=list)
    expired: int = 0
    """Idle trees closed and set to expire (0 on a dry run)."""
    stale: int = 0
    """Index entries of trees whose root no longer exists, removed (0 on a dry run)."""
    dry_run: bool = True


def _last_activity_ms(client: Client, ks: KeySpace, root: str, contexts: list[str]) -> int:
    """The latest of: a context's creation or stop, its last node record, and a lease
    still held (a live process renews it: now or later)."""
    pipe = client.pipeline(transaction=False)
    for cid in contexts:
        pipe.hmget(ks.ctx(root, cid), "created_ms", "stopped_ms")
        pipe.lindex(ks.nodes(root, cid), -1)
    pipe.zrange(ks.leases(root), -1, -1, withscores=True)
    replies = pipe.execute()
    latest = 0
    for times in replies[0:-1:2]:
        latest = max([latest, *(int(t) for t in times if t and str(t).isdigit())])
    for last in replies[1:-1:2]:
        if last is not None:
            latest = max(latest, entry_ms(str(last)))
    if replies[-1]:
        latest = max(latest, int(replies[-1][0][1]))
    return latest


def sweep(store: Store, retention_s: int, idle_s: float, *, dry_run: bool = True,
          limit: int = 1000) -> GcReport:
    """Find the trees still listed open (oldest first, at most ``limit`` from each index
    shard) with no activity for ``idle_s`` seconds: their processes died without
    closing them. Unless ``dry_run``, close each (its summary event is written, later
    calls in it halt) and start the retention clock on all its keys; index entries of
    trees whose root is gone are removed. Closed trees expire after ``retention_s``."""
    client, ks = store.client, store.ks
    now_ms = store.server_time_ms()
    cutoff = now_ms - idle_s * 1000
    report = GcReport(dry_run=dry_run)
    for shard in ks.roots_shards():
        report.open += int(client.zcard(shard))
        for raw in client.zrangebyscore(shard, "-inf", cutoff, start=0, num=limit):
            root = str(raw)
            report.examined += 1
            try:
                _sweep_one(store, retention_s, shard, root, now_ms, cutoff, report)
            except redis.RedisError as exc:
                log.warning("gc: tree %s skipped: %s", root, exc)
    return report


def _sweep_one(store: Store, retention_s: int, shard: str, root: str, now_ms: int,
               cutoff: float, report: GcReport) -> None:
    client, ks = store.client, store.ks
    if not client.exists(ks.ctx(root, root)):
        if not report.dry_run:
            client.zrem(shard, root)
            report.stale += 1
        return
    contexts = walk(client, ks, root)
    last = _last_activity_ms(client, ks, root, contexts)
    if last > cutoff:
        return
    spent_raw, meta = client.hmget(ks.ctx(root, root), "u:usd", "meta")
    spent = int(spent_raw or 0)
    report.idle.append(IdleTree(root, (now_ms - last) / 1000, len(contexts), spent / 1e6))
    if report.dry_run:
        return
    spent_now = store.close(Path(root, (root,)), retention_s)  # expires the tree
    report.expired += 1
    labels = labels_of(None if meta is None else str(meta))
    Views(client, ks).add_closed_tree(  # the day's spend counts it, as an owner's close
        spent_now, {k: labels.get(k) for k in SPEND_LABELS}, retention_s, root=root)


def gc(store: Store, retention_s: int, idle_s: float, dry_run: bool) -> GcReport:
    """``budgetctl gc``: list (``dry_run``) or close and expire the trees idle for
    ``idle_s`` seconds (see :func:`sweep`)."""
    return sweep(store, retention_s, idle_s, dry_run=dry_run)
