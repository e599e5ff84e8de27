"""Lease mode: slices held like reservations, calls served locally and flushed in
batches, slices shrinking near a ceiling, stops ending slices, a dead process's slice
reclaimed; many OS processes in lease and strict mode on one tree, then the invariants."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import statistics
import time

import pytest
import redis

from coordinator import (
    Coordinator,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    LeasePolicy,
    WrapOptions,
    report_usage,
)
from coordinator.context.lease_registry import slice_of
from coordinator.core.keys import KeySpace
from coordinator.errors import InvalidConfigError
from tests import lease_procs, procs
from tests.invariants import check_tree

SPAWN = mp.get_context("spawn")
KS = KeySpace()


def _cfg(usd: float, lease: LeasePolicy | None = None) -> ExecutionConfig:
    return ExecutionConfig(max_cost_usd=usd, max_steps=100_000, max_retries_total=1000,
                           lease=lease)


def _hash(client: redis.Redis, root: str, ctx_id: str) -> dict[str, int]:
    h = client.hgetall(KS.ctx(root, ctx_id))
    return {str(k): int(v) for k, v in h.items() if str(k)[:2] in ("u:", "h:", "l:")}


def test_policy_is_validated_and_inherited(coord: Coordinator) -> None:
    with pytest.raises(InvalidConfigError):
        LeasePolicy(usd=-1)
    with pytest.raises(InvalidConfigError):
        LeasePolicy(steps=0)
    policy = LeasePolicy(usd=0.05, steps=10)
    with ExecutionContext(_cfg(1.0, policy)) as root:
        assert root.spawn_child().config.lease == policy
        assert root.spawn_child(lease=False).config.lease is None
        with pytest.raises(TypeError):
            root.spawn_child(lease="yes")  # type: ignore[arg-type]
        other = LeasePolicy(usd=0.01)
        assert root.spawn_child(lease=other).config.lease == other
        # a process attaching by token reads the policy recorded with the context
        assert ExecutionContext.attach(root.token).config.lease == policy


def test_calls_served_from_a_slice_then_flushed(coord: Coordinator) -> None:
    client = coord.client
    with ExecutionContext(_cfg(1.0, LeasePolicy(usd=0.1, steps=50))) as root:
        kid = root.spawn_child()
        for _ in range(10):
            assert kid.wrap_llm_call(lambda: report_usage(cost_usd=0.003),
                                     WrapOptions(cost_estimate_hint=0.005)) == Decision.ALLOW
        # one slice held at both levels, spend not yet written
        lease = slice_of(kid._state)
        assert lease is not None and lease.slice_id is not None
        for level in (root.chain_id, kid.chain_id):
            h = _hash(client, root.chain_id, level)
            assert h["h:usd"] == 100_000 and h["h:steps"] == 50 and "u:usd" not in h
        # the handle reads its own writes: its snapshot flushes the batch first
        snap = kid.get_snapshot()
        assert len(snap.nodes) == 10 and snap.cost_usd_accumulated == pytest.approx(0.03)
        h = _hash(client, root.chain_id, kid.chain_id)
        assert h["u:usd"] == 30_000 and h["u:steps"] == 10
        kid.close()
        h = _hash(client, root.chain_id, root.chain_id)
        assert h["h:usd"] == 0 and h["h:steps"] == 0 and h["u:usd"] == 30_000
    check_tree(client, root.chain_id)


def test_slices_shrink_near_a_ceiling_and_large_calls_go_strict(coord: Coordinator) -> None:
    client = coord.client
    with ExecutionContext(_cfg(0.1, LeasePolicy(usd=1.0, steps=1000))) as root:
        # a call larger than a slice can be (0.1 / 4) takes a strict reserve
        assert root.wrap_llm_call(lambda: report_usage(cost_usd=0.05),
                                  WrapOptions(cost_estimate_hint=0.05)) == Decision.ALLOW
        lease = slice_of(root._state)
        assert lease is not None and lease.slice_id is None
        assert _hash(client, root.chain_id, root.chain_id)["u:usd"] == 50_000
        # a small one takes a slice of what remains / 4: 12_500
        assert root.wrap_llm_call(lambda: report_usage(cost_usd=0.001),
                                  WrapOptions(cost_estimate_hint=0.001)) == Decision.ALLOW
        assert _hash(client, root.chain_id, root.chain_id)["h:usd"] == 12_500
        spent = 1000 + 50_000
        while True:
            d = root.wrap_llm_call(lambda: report_usage(cost_usd=0.001),
                                   WrapOptions(cost_estimate_hint=0.001))
            if d != Decision.ALLOW:
                break
            spent += 1000
        # the whole ceiling was used, call by call, not exceeded
        assert spent == 100_000 and root.stop_reason == "budget_exceeded"
    check_tree(client, root.chain_id)


def test_abort_ends_the_slice_and_halts(coord: Coordinator) -> None:
    client = coord.client
    root = ExecutionContext(_cfg(1.0, LeasePolicy(usd=0.1)))
    assert root.wrap_llm_call(lambda: None, WrapOptions(cost_estimate_hint=0.01)) \
        == Decision.ALLOW
    root.abort("enough")
    deadline = time.monotonic() + 5
    while _hash(client, root.chain_id, root.chain_id).get("h:usd", 0) and (
            time.monotonic() < deadline):
        time.sleep(0.01)
    assert _hash(client, root.chain_id, root.chain_id)["h:usd"] == 0
    assert root.wrap_llm_call(lambda: None) == Decision.HALT
    root.close()
    check_tree(client, root.chain_id)


@pytest.mark.slow
def test_mixed_lease_and_strict_processes_keep_the_invariants(
        coord: Coordinator, redis_url: str) -> None:
    root = ExecutionContext(_cfg(2.0))
    leased = root.spawn_child(max_cost_usd=1.2, lease=LeasePolicy(usd=0.2, steps=40,
                                                                  max_age_ms=300))
    strict = root.spawn_child(max_cost_usd=1.2)
    leaves = [leased.spawn_child(max_cost_usd=0.8) for _ in range(2)] + [
        strict.spawn_child(max_cost_usd=0.8) for _ in range(2)]
    assert leaves[0].config.lease is not None and leaves[2].config.lease is None
    out = SPAWN.Queue()
    workers = [SPAWN.Process(target=procs.hammer,
                             args=(redis_url, leaves[i % 4].token, i, 300, out))
               for i in range(8)]
    for w in workers:
        w.start()
    results = [out.get(timeout=120) for _ in workers]
    for w in workers:
        w.join(30)
        assert w.exitcode == 0
    assert sum(r["allowed"] for r in results) > 50
    for ctx in (*leaves, leased, strict):
        ctx.close()
    used = check_tree(coord.client, root.chain_id)
    assert used <= 2_000_000
    root.close()


def test_sigkilled_process_slice_is_reclaimed(coord: Coordinator, redis_url: str) -> None:
    client = coord.client
    root = ExecutionContext(_cfg(1.0, LeasePolicy(usd=0.2, steps=50)))
    ready = SPAWN.Event()
    p = SPAWN.Process(target=lease_procs.hold_slice,
                      args=(redis_url, root.token, 2000, ready))
    p.start()
    assert ready.wait(60)
    h = _hash(client, root.chain_id, root.chain_id)
    assert h["u:usd"] == 50_000 and h["h:usd"] == 200_000 - 50_000
    assert client.scard(KS.slices(root.chain_id)) == 1
    os.kill(p.pid, signal.SIGKILL)
    p.join(10)
    time.sleep(2.2)  # the lease (2 s) is no longer renewed
    # the next reserve in the tree reaps it: flushed spend stays charged, the rest returns
    strict_kid = root.spawn_child(lease=False)
    assert strict_kid.wrap_llm_call(lambda: report_usage(cost_usd=0.01),
                                    WrapOptions(cost_estimate_hint=0.01)) == Decision.ALLOW
    strict_kid.close()
    h = _hash(client, root.chain_id, root.chain_id)
    assert h["u:usd"] == 60_000 and h["h:usd"] == 0
    reclaimed = [f for _, f in client.xrange(KS.nodes(root.chain_id, root.chain_id))
                 if "(lease slice reclaimed)" in f["n"]]
    assert len(reclaimed) == 1  # reclaimed by the expiry, not given back by its process
    root.close()
    check_tree(client, root.chain_id)


def test_abort_reaches_eight_leasing_processes(coord: Coordinator, redis_url: str) -> None:
    root = ExecutionContext(_cfg(1000.0, LeasePolicy(usd=0.5, steps=5000)))
    ready, out = SPAWN.Queue(), SPAWN.Queue()
    workers = [SPAWN.Process(target=lease_procs.run_until_stopped,
                             args=(redis_url, root.token, ready, out)) for _ in range(8)]
    for w in workers:
        w.start()
    for _ in workers:
        ready.get(timeout=60)
    time.sleep(0.3)  # every process is calling from its slice
    aborted_at = time.time()
    root.abort("stop the fleet")
    results = [out.get(timeout=60) for _ in workers]
    for w in workers:
        w.join(30)
        assert w.exitcode == 0
    for r in results:
        assert r["reason"] == "aborted" and r["reached"] is not None
        assert r["calls"] > 0
        # at most the one call admitted just before the stop landed starts after it
        assert r["started_after"] <= 1, r
        assert r["after"] == ["HALT"] * 3
    lags = sorted(r["refused_at"] - aborted_at for r in results)
    print(f"abort to refusal across 8 leasing processes: p50 {statistics.median(lags)*1e3:.1f}"
          f" ms, max {lags[-1]*1e3:.1f} ms")
    root.close()
    check_tree(coord.client, root.chain_id)


@pytest.mark.slow
def test_eight_processes_share_the_last_ten_cents(coord: Coordinator, redis_url: str) -> None:
    root = ExecutionContext(_cfg(1.0, LeasePolicy(usd=0.05, steps=100, max_age_ms=200)))
    assert root.spawn_child(lease=False).wrap_llm_call(
        lambda: report_usage(cost_usd=0.9), WrapOptions(cost_estimate_hint=0.9)) \
        == Decision.ALLOW
    ready, go, out = SPAWN.Queue(), SPAWN.Event(), SPAWN.Queue()
    workers = [SPAWN.Process(target=lease_procs.share_the_rest,
                             args=(redis_url, root.token, ready, go, out)) for _ in range(8)]
    for w in workers:
        w.start()
    for _ in workers:  # every process attached
        ready.get(timeout=60)
    go.set()
    results = [out.get(timeout=90) for _ in workers]
    for w in workers:
        w.join(30)
    allowed = sorted(r["allowed"] for r in results)
    print("calls per process sharing the last $0.10:", allowed, results)
    assert sum(allowed) == 50  # $0.10 / $0.002: all of it, and no more
    assert all(a >= 1 for a in allowed), allowed
    assert all(r["reason"] == "budget_exceeded" for r in results)
    root.close()
    used = check_tree(coord.client, root.chain_id)
    assert used == 1_000_000


def test_threads_failures_and_async_calls_share_one_slice(coord: Coordinator) -> None:
    import asyncio
    import threading

    client = coord.client
    root = ExecutionContext(_cfg(50.0, LeasePolicy(usd=0.5, steps=64)))
    counts = {"ok": 0, "retry": 0}
    lock = threading.Lock()

    def worker(seed: int) -> None:
        for i in range(150):
            fail = (i + seed) % 10 == 0

            def body() -> None:
                report_usage(cost_usd=0.001)
                if fail:
                    raise RuntimeError("provider 500")

            d = root.wrap_llm_call(body, WrapOptions(cost_estimate_hint=0.002))
            with lock:
                counts["ok" if d == Decision.ALLOW else "retry"] += 1

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    async def spend() -> None:
        report_usage(cost_usd=0.001)

    assert asyncio.run(root.awrap_llm_call(spend, WrapOptions(cost_estimate_hint=0.002))) \
        == Decision.ALLOW
    assert counts == {"ok": 540, "retry": 60}
    root.close()
    h = _hash(client, root.chain_id, root.chain_id)
    assert h["u:steps"] == 541 and h["u:retries"] == 60 and h["u:usd"] == 601 * 1000
    check_tree(client, root.chain_id)


def test_a_timeout_ends_the_slice(coord: Coordinator) -> None:
    config = ExecutionConfig(max_cost_usd=1.0, max_steps=10**6, max_retries_total=10,
                             timeout_ms=300, lease=LeasePolicy(usd=0.5))
    root = ExecutionContext(config)
    served = 0
    end = time.monotonic() + 5
    while time.monotonic() < end:
        if root.wrap_llm_call(lambda: time.sleep(0.001),
                              WrapOptions(cost_estimate_hint=0.0001)) != Decision.ALLOW:
            break
        served += 1
    assert served > 10 and root.stop_reason == "timeout"
    assert root.wrap_llm_call(lambda: None) == Decision.HALT
    root.close()
    check_tree(coord.client, root.chain_id)


def test_token_slices_cover_token_estimates(coord: Coordinator) -> None:
    from coordinator import TokenBudget

    client = coord.client
    config = ExecutionConfig(max_cost_usd=10.0, max_steps=10_000, max_retries_total=10,
                             token_budget=TokenBudget(total=10_000),
                             lease=LeasePolicy(usd=1.0, tokens=4000))
    root = ExecutionContext(config)
    opts = WrapOptions(cost_estimate_hint=0.001, input_tokens_estimate=100,
                       max_output_tokens=100)
    allowed = 0
    while root.wrap_llm_call(lambda: report_usage(input_tokens=100, output_tokens=100),
                             opts) == Decision.ALLOW:
        allowed += 1
        if allowed == 1:  # served from a slice of tokens (near the ceiling: strict)
            lease = slice_of(root._state)
            assert lease is not None and lease.slice_id is not None
            assert _hash(client, root.chain_id, root.chain_id)["h:tin"] == 1250
        assert allowed <= 50
    # the token total (10,000 = 50 calls of 200) was reached, not exceeded
    assert allowed == 50 and root.stop_reason == "token_budget_exceeded"
    h = _hash(client, root.chain_id, root.chain_id)
    assert h["u:tin"] + h["u:tout"] == 10_000
    # a call with a provider reserves provider dimensions: a strict reserve
    other = ExecutionContext(config)
    assert other.wrap_llm_call(
        lambda: report_usage(input_tokens=10, output_tokens=10, provider="openai"),
        WrapOptions(cost_estimate_hint=0.001, input_tokens_estimate=10,
                    max_output_tokens=10, provider="openai")) == Decision.ALLOW
    other_lease = slice_of(other._state)
    assert other_lease is not None and other_lease.slice_id is None
    other.close()
    root.close()
    check_tree(client, root.chain_id)
    check_tree(client, other.chain_id)


def test_a_corrupt_counter_refuses_the_slice_and_stops_the_level(coord: Coordinator) -> None:
    client = coord.client
    root = ExecutionContext(_cfg(1.0, LeasePolicy(usd=0.1)))
    client.hset(KS.ctx(root.chain_id, root.chain_id), "u:usd", "abc")
    assert root.wrap_llm_call(lambda: None, WrapOptions(cost_estimate_hint=0.01)) \
        == Decision.HALT
    assert root.stop_reason == "state_corrupt"
    assert client.scard(KS.slices(root.chain_id)) == 0  # no slice was taken
    root.close()
