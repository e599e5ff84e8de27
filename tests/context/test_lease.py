"""Lease mode: slices held like reservations, calls served locally and flushed in
batches, slices shrinking near a ceiling, stops ending slices, a dead process's slice
reclaimed (its unflushed part charged as used, or given back on opt-in); many OS
processes in lease and strict mode on one tree, then the invariants."""

from __future__ import annotations

import json
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
from coordinator.store.leases_store import Batch, LeaseStore
from coordinator.store.records import ReservationRecord
from tests.support import lease_procs, procs
from tests.support.invariants import check_tree

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
        coord.store.flush()  # its settle is queued (sent within 20 ms): land it now
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


@pytest.mark.parametrize("flush", [False, True], ids=["unflushed", "flushed"])
@pytest.mark.parametrize("returns", [False, True], ids=["charged", "return_on_expiry"])
def test_sigkilled_process_slice_is_charged_as_used(coord: Coordinator, redis_url: str,
                                                    returns: bool, flush: bool) -> None:
    """Issue 25, case 8: a process served five $0.01 calls from its $0.20 slice and was
    SIGKILLed (before or after its flush). Its unflushed part is charged in full by
    default (which calls it ran cannot be known); with return_on_expiry only what it
    flushed stays charged."""
    client = coord.client
    policy = LeasePolicy(usd=0.2, steps=50, return_on_expiry=returns)
    root = ExecutionContext(_cfg(1.0, policy))
    ready = SPAWN.Queue()
    p = SPAWN.Process(target=lease_procs.hold_slice,
                      args=(redis_url, root.token, 4000, ready, flush))
    p.start()
    slice_id = ready.get(timeout=60)
    os.kill(p.pid, signal.SIGKILL)
    flushed = 50_000 if flush else 0
    h = _hash(client, root.chain_id, root.chain_id)
    assert h.get("u:usd", 0) == flushed and h["h:usd"] == 200_000 - flushed
    assert client.scard(KS.slices(root.chain_id)) == 1
    p.join(10)
    time.sleep(4.2)  # the lease (4 s) is no longer renewed
    # the next reserve in the tree reaps it
    strict_kid = root.spawn_child(lease=False)
    assert strict_kid.wrap_llm_call(lambda: report_usage(cost_usd=0.01),
                                    WrapOptions(cost_estimate_hint=0.01)) == Decision.ALLOW
    strict_kid.close()
    h = _hash(client, root.chain_id, root.chain_id)
    charged = flushed if returns else 200_000
    assert h["u:usd"] == charged + 10_000 and h["h:usd"] == 0
    reclaimed = [json.loads(n) for n in
                 client.lrange(KS.nodes(root.chain_id, root.chain_id), 0, -1)
                 if "(lease slice reclaimed)" in n]
    assert len(reclaimed) == 1  # reclaimed by the expiry, not given back by its process
    assert reclaimed[0]["cost_usd"] == pytest.approx(0 if returns else 0.2 - flushed / 1e6)
    events = [json.loads(e) for e in
              client.lrange(KS.events(root.chain_id, root.chain_id), 0, -1)]
    expired = [e for e in events if e["event_type"] == "slice_expired"]
    assert len(expired) == 1 and slice_id in expired[0]["reason"]
    meta = expired[0]["metadata"]
    assert meta["slice_id"] == slice_id
    assert meta["returned" if returns else "charged"]["usd"] == 200_000 - flushed
    root.close()
    check_tree(client, root.chain_id)


@pytest.mark.parametrize("returns", [False, True], ids=["charged", "return_on_expiry"])
def test_an_expired_slice_that_leaves_no_room_is_reaped_by_the_refused_call(
        coord: Coordinator, redis_url: str, returns: bool) -> None:
    """A dead process's slice holds so much of a $0.25 tree that the next call cannot be
    held, and expired holds used to be reaped only by a call that was: the tree stayed
    blocked for good. The refused reserve now names the expired holds; the caller
    reclaims them and asks once more."""
    client = coord.client
    root = ExecutionContext(_cfg(0.25, LeasePolicy(usd=0.2, steps=50,
                                                   return_on_expiry=returns)))
    strict_kid = root.spawn_child(lease=False)  # its ceiling: the whole $0.25
    ready = SPAWN.Queue()
    p = SPAWN.Process(target=lease_procs.hold_slice,
                      args=(redis_url, root.token, 1000, ready, False))
    p.start()
    ready.get(timeout=60)
    os.kill(p.pid, signal.SIGKILL)
    p.join(10)
    slice_usd = _hash(client, root.chain_id, root.chain_id)["h:usd"]  # shrunk near the ceiling
    cost = round(0.25 - slice_usd / 1e6 + 0.01, 6)  # does not fit beside the slice
    time.sleep(1.2)  # the lease (1 s) is no longer renewed
    d = strict_kid.wrap_llm_call(lambda: report_usage(cost_usd=cost),
                                 WrapOptions(cost_estimate_hint=cost))
    coord.store.flush()
    h = _hash(client, root.chain_id, root.chain_id)
    assert h["h:usd"] == 0 and client.scard(KS.slices(root.chain_id)) == 0
    if returns:  # the slice's unflushed part went back: the call fits
        assert d == Decision.ALLOW and h["u:usd"] == round(cost * 1e6)
    else:  # its unflushed part is charged as used: the refusal stands, on true books
        assert d == Decision.HALT and h["u:usd"] == slice_usd
    strict_kid.close()
    root.close()
    check_tree(client, root.chain_id)


def test_a_late_flush_of_a_slice_charged_as_used_charges_nothing_twice(
        coord: Coordinator) -> None:
    """A process only slow (not dead) flushes after its slice was reclaimed and charged
    as used: its calls are recorded and their steps counted, the tree is charged the
    slice once, and the ledger still equals its node records (the calls' records carry
    no cost: the reclaim's record has it)."""
    client = coord.client
    with ExecutionContext(_cfg(1.0, LeasePolicy(usd=0.2, steps=50))) as root:
        for _ in range(3):
            assert root.wrap_llm_call(lambda: report_usage(cost_usd=0.01),
                                      WrapOptions(cost_estimate_hint=0.01)) \
                == Decision.ALLOW
        lease = slice_of(root._state)
        assert lease is not None and lease.slice_id is not None
        record = ReservationRecord.from_json(
            client.hget(KS.reservations(root.chain_id), lease.slice_id))
        LeaseStore(coord.store).reclaim(root.chain_id, lease.slice_id, record)
        coord.store.flush()
        assert _hash(client, root.chain_id, root.chain_id)["u:usd"] == 200_000
        lease.give_back()
        h = _hash(client, root.chain_id, root.chain_id)
        assert h["u:usd"] == 200_000 and h["h:usd"] == 0
        assert h["u:steps"] == 3  # the reclaim gave the held steps back; the calls ran
        # the three calls and the reclaim (whose $0.20 already covers theirs)
        nodes = [json.loads(n) for n in client.lrange(KS.nodes(root.chain_id, root.chain_id),
                                                     0, -1)]
        assert sorted(n["cost_usd"] for n in nodes) == [0, 0, 0, 0.2]
    assert check_tree(client, root.chain_id) == 200_000


def test_a_give_back_sent_again_charges_nothing_twice(coord: Coordinator) -> None:
    """The last flush of a slice (its give-back) landed but its reply was lost (a timed
    out WAIT, a dropped connection): sent again, it finds the slice gone and must not
    charge its batch a second time."""
    client = coord.client
    with ExecutionContext(_cfg(1.0, LeasePolicy(usd=0.2, steps=50))) as root:
        assert root.wrap_llm_call(lambda: report_usage(cost_usd=0.01),
                                  WrapOptions(cost_estimate_hint=0.01)) == Decision.ALLOW
        lease = slice_of(root._state)
        assert lease is not None and lease.slice_id is not None
        leases = LeaseStore(coord.store)
        node = json.dumps({"node_id": "n1", "kind": "llm", "operation_name": "x",
                           "start_ts": 0, "end_ts": 0, "status": "ok", "cost_usd": 0.005,
                           "steps_used": 1})
        last = leases.flush_op(root._state.path, lease.slice_id,
                               Batch(seq=10**6, nodes=[node], events=[],
                                     spent={"usd": 5000, "steps": 1}), give_back=True)
        leases.flush(root._state.path, last)
        once = _hash(client, root.chain_id, root.chain_id)
        leases.flush(root._state.path, last)  # the same op again
        assert _hash(client, root.chain_id, root.chain_id) == once
        assert once["h:usd"] == 0 and once["u:usd"] == 5_000 and once["u:steps"] == 1
        lease.slice_id = None  # given back above (the first call flushes at the close)
    assert check_tree(client, root.chain_id) == 15_000


@pytest.mark.slow
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
    root.close()
    check_tree(client, root.chain_id)


def test_token_slices_cover_a_providers_tokens_under_its_share(coord: Coordinator) -> None:
    from coordinator import TokenBudget

    client = coord.client
    share = TokenBudget(total=2_000)
    config = ExecutionConfig(max_cost_usd=10.0, max_steps=10_000, max_retries_total=10,
                             token_budget=TokenBudget(provider_shares={"openai": share}),
                             lease=LeasePolicy(usd=1.0, tokens=4000))
    root = ExecutionContext(config)
    opts = WrapOptions(cost_estimate_hint=0.001, input_tokens_estimate=10,
                       max_output_tokens=10, provider="openai")
    allowed = 0
    while root.wrap_llm_call(
            lambda: report_usage(input_tokens=10, output_tokens=10, provider="openai"),
            opts) == Decision.ALLOW:
        allowed += 1
        if allowed == 1:  # the slice holds the provider's tokens: served from it
            lease = slice_of(root._state)
            assert lease is not None and lease.slice_id is not None
            assert lease.avail.get("openai.tin", 0) > 0
            assert _hash(client, root.chain_id, root.chain_id)["h:openai.tin"] > 0
        assert allowed <= 100
    # the provider's share (2,000 = 100 calls of 20) was reached, not exceeded
    assert allowed == 100 and root.stop_reason == "token_budget_exceeded"
    h = _hash(client, root.chain_id, root.chain_id)
    assert h["u:openai.tin"] + h["u:openai.tout"] == 2_000
    root.close()
    check_tree(client, root.chain_id)


def test_a_corrupt_counter_refuses_the_slice_and_stops_the_level(coord: Coordinator) -> None:
    client = coord.client
    root = ExecutionContext(_cfg(1.0, LeasePolicy(usd=0.1)))
    client.hset(KS.ctx(root.chain_id, root.chain_id), "u:usd", "abc")
    assert root.wrap_llm_call(lambda: None, WrapOptions(cost_estimate_hint=0.01)) \
        == Decision.HALT
    assert root.stop_reason == "state_corrupt"
    assert client.scard(KS.slices(root.chain_id)) == 0  # no slice was taken
    root.close()
