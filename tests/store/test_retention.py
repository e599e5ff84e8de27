"""Retention: a closed root takes every key of its tree with it after the retention,
contexts never closed included; trees whose processes died without closing them are
found after an idle time and listed (dry run) or closed and expired (gc)."""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Iterator

import pytest
import redis

from coordinator import Coordinator, Decision, ExecutionConfig, ExecutionContext, report_usage
from coordinator.core.keys import KeySpace
from coordinator.core.paths import Path
from coordinator.store.gc import gc
from tests.support import procs

SPAWN = mp.get_context("spawn")
KS = KeySpace()
CFG = ExecutionConfig(max_cost_usd=1.0, max_steps=100, max_retries_total=10)


@pytest.fixture
def short(redis_url: str) -> Iterator[Coordinator]:
    """A coordinator whose closed trees are kept 1 second."""
    c = Coordinator.from_url(redis_url, token_keys=procs.TEST_KEYS, retention_s=1)
    yield c
    c.close()
    c.client.close()


def _tree_keys(client: redis.Redis, root: str, ids: list[str]) -> list[str]:
    keys = list(client.scan_iter(f"bc:{{{root}}}:*"))
    return keys + [k for i in ids if client.exists(k := KS.locator(i))]


def test_never_closed_child_under_closed_root_expires(short: Coordinator) -> None:
    root = ExecutionContext(CFG, coordinator=short)
    child = root.spawn_child()
    grandchild = child.spawn_child()
    assert grandchild.wrap_llm_call(lambda: report_usage(cost_usd=0.01)) == Decision.ALLOW
    grandchild.data.set("note", "expires with the tree")  # context data keys too
    short.store.flush()
    ids = [root.chain_id, child.chain_id, grandchild.chain_id]
    keys = _tree_keys(short.client, root.chain_id, ids)
    assert len(keys) >= 9
    assert KS.prefix + ":{" + root.chain_id + "}:data:" + grandchild.chain_id in keys
    root.close()  # the child and grandchild are never closed
    for key in _tree_keys(short.client, root.chain_id, ids):
        assert 0 < short.client.ttl(key) <= 1, key
    time.sleep(2.1)
    assert _tree_keys(short.client, root.chain_id, ids) == []


def _abandon(url: str) -> str:
    """A tree opened by a process that dies without closing it; returns the root id."""
    out = SPAWN.Queue()
    p = SPAWN.Process(target=_open_and_die, args=(url, out))
    p.start()
    root = str(out.get(timeout=60))
    p.join(60)
    return root


def _open_and_die(url: str, out: mp.Queue) -> None:  # type: ignore[type-arg]
    import os

    coord = Coordinator.from_url(url, token_keys=procs.TEST_KEYS)
    root = ExecutionContext(CFG, coordinator=coord)
    kid = root.spawn_child()
    kid.wrap_llm_call(lambda: report_usage(cost_usd=0.02))
    coord.store.flush()
    out.put(root.chain_id)
    out.close()
    out.join_thread()  # the id is sent before the process vanishes
    os._exit(0)  # no close, no atexit


def test_gc_lists_then_expires_trees_left_open(short: Coordinator, redis_url: str) -> None:
    dead = _abandon(redis_url)
    live = ExecutionContext(CFG, coordinator=short)
    time.sleep(1.2)
    assert live.wrap_llm_call(lambda: None) == Decision.ALLOW  # activity: not idle
    short.store.flush()
    assert set(short.views.active_roots()) == {dead, live.chain_id}

    listed = gc(short.store, short.retention_s, idle_s=1.0, dry_run=True)
    assert [t.root for t in listed.idle] == [dead]
    assert listed.idle[0].contexts == 2 and listed.idle[0].spent_usd == pytest.approx(0.02)
    assert listed.expired == 0 and short.views.active_roots().count(dead) == 1

    done = gc(short.store, short.retention_s, idle_s=1.0, dry_run=False)
    assert [t.root for t in done.idle] == [dead] and done.expired == 1
    assert short.views.active_roots() == [live.chain_id]
    assert short.client.hget(KS.ctx(dead, dead), "status") == "closed"
    # the day's spend counts a tree gc closed, once (a later close adds nothing)
    assert short.views.spend_totals() == {"all": 20_000, "unlabelled": 20_000}
    assert short.store.close(Path(dead, (dead,)), short.retention_s) == 0
    time.sleep(2.1)
    assert list(short.client.scan_iter(f"bc:{{{dead}}}:*")) == []
    live.close()


def test_gc_removes_index_entries_of_trees_that_are_gone(short: Coordinator) -> None:
    short.client.zadd(KS.roots_shard("vanished"), {"vanished": 1})
    assert gc(short.store, short.retention_s, idle_s=0, dry_run=True).stale == 0
    report = gc(short.store, short.retention_s, idle_s=0, dry_run=False)
    assert report.stale == 1 and report.examined == 1
    assert short.views.active_roots() == []


def test_open_trees_sorted_by_spend_or_fraction_with_the_total(coord: Coordinator) -> None:
    small = ExecutionContext(ExecutionConfig(max_cost_usd=0.1, max_steps=10,
                                             max_retries_total=1), coordinator=coord)
    big = ExecutionContext(ExecutionConfig(max_cost_usd=10.0, max_steps=10,
                                           max_retries_total=1), coordinator=coord)
    idle = ExecutionContext(CFG, coordinator=coord)
    small.wrap_llm_call(lambda: report_usage(cost_usd=0.05))
    big.wrap_llm_call(lambda: report_usage(cost_usd=0.2))
    coord.store.flush()
    by_spend, total, _ = coord.views.open_trees(limit=2)
    assert total == 3 and [t.root for t in by_spend] == [big.chain_id, small.chain_id]
    by_fraction, _, _ = coord.views.open_trees(limit=1, sort="fraction")
    assert by_fraction[0].root == small.chain_id
    assert by_fraction[0].fraction == pytest.approx(0.5)
    for ctx in (small, big, idle):
        ctx.close()


def test_finished_ids_are_kept_an_hour_then_trimmed_by_later_settles(coord: Coordinator
                                                                     ) -> None:
    ctx = ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_steps=1000,
                                           max_retries_total=1), coordinator=coord)
    fin = KS.finished(ctx.chain_id)
    hour_ago_ms = coord.store.server_time_ms() - 3_600_000
    coord.client.zadd(fin, {"finished-long-ago": hour_ago_ms - 1,
                            "finished-within-the-hour": hour_ago_ms + 60_000})
    # the trim runs on about one settle in 16 (by Redis time): 400 settles all but
    # surely include one ((15/16)^400 < 1e-11)
    for _ in range(400):
        assert ctx.wrap_llm_call(lambda: report_usage(cost_usd=0.0001)) == Decision.ALLOW
    coord.store.flush()
    assert coord.client.zscore(fin, "finished-long-ago") is None
    assert coord.client.zscore(fin, "finished-within-the-hour") is not None
    assert coord.client.zcard(fin) == 401  # every settle of the hour is remembered
    ctx.close()
