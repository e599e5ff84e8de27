"""One ceiling across OS processes: many processes hammering one tree through tokens,
abort reaching another process, a SIGKILLed worker's reservation reclaimed."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time

import pytest
import redis

from coordinator import (
    Coordinator,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    WrapOptions,
    report_usage,
)
from coordinator.core.keys import KeySpace
from tests.support import procs
from tests.support.invariants import check_tree

SPAWN = mp.get_context("spawn")


def test_siblings_cannot_overspend_parent(coord: Coordinator) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_steps=1000,
                                          max_retries_total=10)) as parent:
        kids = [parent.spawn_child(max_cost_usd=5.0) for _ in range(10)]
        spent = 0
        for _ in range(20):
            for kid in kids:
                d = kid.wrap_llm_call(lambda: report_usage(cost_usd=0.05),
                                      WrapOptions(cost_estimate_hint=0.05))
                spent += d == Decision.ALLOW
        snap = parent.get_snapshot()
        assert snap.cost_usd_accumulated == pytest.approx(1.0)
        assert spent == 20
        assert snap.aborted and snap.abort_reason == "budget_exceeded"
        # the stop cascades: every child halts, whatever its own limit
        assert all(k.wrap_llm_call(lambda: None) == Decision.HALT for k in kids)
        assert kids[0].get_snapshot().stopped_by == parent.chain_id
        for kid in kids:
            kid.close()
    check_tree(coord.client, parent.chain_id)


def test_eight_processes_hammer_one_tree(coord: Coordinator, redis_url: str) -> None:
    root = ExecutionContext(ExecutionConfig(max_cost_usd=2.0, max_steps=100_000,
                                            max_retries_total=100_000))
    mids = [root.spawn_child(max_cost_usd=1.2) for _ in range(2)]
    leaves = [m.spawn_child(max_cost_usd=0.8) for m in mids for _ in range(2)]
    out = SPAWN.Queue()
    workers = [SPAWN.Process(target=procs.hammer,
                             args=(redis_url, leaves[i % 4].token, i, 400, out))
               for i in range(8)]
    for w in workers:
        w.start()
    results = [out.get(timeout=120) for _ in workers]
    for w in workers:
        w.join(30)
        assert w.exitcode == 0
    assert sum(r["allowed"] for r in results) > 50
    used = check_tree(coord.client, root.chain_id)
    # the ceilings were reached, not exceeded: each estimate is at most $0.05
    assert 2_000_000 - 50_000 <= used <= 2_000_000 or all(
        ExecutionContext.load_snapshot(m.chain_id).aborted for m in mids)
    root.close()


def test_abort_reaches_sync_call_in_other_process(coord: Coordinator, redis_url: str) -> None:
    _abort_reaches_other_process(redis_url, use_async=False)


def test_abort_cancels_coroutine_in_other_process(coord: Coordinator, redis_url: str) -> None:
    _abort_reaches_other_process(redis_url, use_async=True)


def _abort_reaches_other_process(redis_url: str, *, use_async: bool) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_steps=10,
                                          max_retries_total=3)) as parent:
        child = parent.spawn_child()
        grandchild = child.spawn_child()
        ready, out = SPAWN.Event(), SPAWN.Queue()
        p = SPAWN.Process(target=procs.wait_for_cancel,
                          args=(redis_url, grandchild.token, use_async, ready, out))
        p.start()
        assert ready.wait(60)
        sent = time.time()
        parent.abort("operator pressed stop")
        res = out.get(timeout=30)
        p.join(30)
        assert res["decision"] == "HALT"
        assert res["status"] == "aborted"
        assert res["after"] == "HALT"
        assert res["aborted"] and res["reason"] == "aborted"
        assert res["ended"] - sent < 5  # heard through pub/sub, not by polling Redis
        snap = parent.get_snapshot()
        assert snap.abort_reason == "aborted"
        assert any(e.event_type == "aborted" and e.reason == "operator pressed stop"
                   and e.hook == "ExecutionContext" for e in snap.events)
        # the call in flight was charged its estimate (it may have been billed)
        assert snap.cost_usd_accumulated == pytest.approx(0.1)
        assert snap.cost_usd_reserved == 0
        child.close()
        grandchild.close()


def test_sigkilled_worker_reservation_is_reclaimed(redis_url: str) -> None:
    coord = Coordinator.from_url(redis_url, token_keys=procs.TEST_KEYS, lease_ms=400)
    try:
        with ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_steps=10,
                                              max_retries_total=3),
                              coordinator=coord) as root:
            ready = SPAWN.Event()
            p = SPAWN.Process(target=procs.hold_call, args=(redis_url, root.token, 400, ready))
            p.start()
            assert ready.wait(60)
            time.sleep(1.0)  # the live worker keeps renewing its lease meanwhile
            assert root.get_snapshot().cost_usd_reserved == pytest.approx(0.30)
            os.kill(p.pid, signal.SIGKILL)
            p.join()
            time.sleep(0.6)  # let the lease expire (Redis time)
            # the next reserve in the tree reaps it, charging the estimate
            assert root.wrap_llm_call(lambda: report_usage(cost_usd=0.01)) == Decision.ALLOW
            snap = root.get_snapshot()
            assert snap.cost_usd_accumulated == pytest.approx(0.31)
            assert snap.cost_usd_reserved == 0
            lost = [n for n in snap.nodes if n.status == "lost"]
            assert len(lost) == 1 and lost[0].cost_usd == pytest.approx(0.30)
        check_tree(coord.client, root.chain_id)
    finally:
        coord.close()


def test_write_behind_settle_is_flushed_at_exit(coord: Coordinator, redis_url: str) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_steps=10,
                                          max_retries_total=3)) as root:
        p = SPAWN.Process(target=procs.spend_and_exit, args=(redis_url, root.token))
        p.start()
        p.join(60)
        assert p.exitcode == 0
        snap = root.get_snapshot()
        assert snap.cost_usd_accumulated == pytest.approx(0.07)
        assert snap.cost_usd_reserved == 0
    check_tree(coord.client, root.chain_id)


def test_ledger_keys_are_one_slot_per_tree(coord: Coordinator) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_steps=10,
                                          max_retries_total=3)) as root:
        child = root.spawn_child()
        child.wrap_llm_call(lambda: None)
        child.close()
    keys = [k for k in coord.client.scan_iter(f"bc:{{{root.chain_id}}}:*")]
    assert len(keys) >= 4
    slots = {coord.client.execute_command("CLUSTER KEYSLOT", k) for k in keys} if False else {
        k.split("}")[0] for k in keys}
    assert slots == {f"bc:{{{root.chain_id}"}
    assert KeySpace().ctx(root.chain_id, child.chain_id) in keys
    assert isinstance(coord.client, redis.Redis)
