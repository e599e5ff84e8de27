"""Faults: Redis going away and coming back, the script cache flushed."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from coordinator import (
    Coordinator,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    WrapOptions,
    report_usage,
)
from coordinator.embedded import RedisServer
from coordinator.errors import BackendUnavailableError
from coordinator.store.charges import propagate
from tests.support.invariants import check_tree

CONFIG = ExecutionConfig(max_cost_usd=1.0, max_steps=100, max_retries_total=5)


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A private redis-server with an append-only file, so a restart keeps the data."""
    with RedisServer(extra_args=("--appendonly", "yes", "--appendfsync", "always")) as s:
        yield s


def spend(ctx: ExecutionContext, usd: float) -> Decision:
    return ctx.wrap_llm_call(lambda: report_usage(cost_usd=usd),
                             WrapOptions(cost_estimate_hint=usd))


@pytest.mark.slow
def wait_until_up(coord: Coordinator) -> None:
    """Wait for the backend breaker's probe to find Redis answering (one probe interval)."""
    deadline = time.monotonic() + 10
    while coord.backend.down and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not coord.backend.down


def test_redis_down_halts_with_reason_then_run_continues(own_redis: RedisServer) -> None:
    coord = Coordinator.from_url(own_redis.url, token_keys={"k": b"0123456789abcdef0"})
    try:
        ctx = ExecutionContext(CONFIG, coordinator=coord)
        assert spend(ctx, 0.10) == Decision.ALLOW
        before = ctx.get_snapshot()

        own_redis.stop()
        ran = []
        assert ctx.wrap_llm_call(lambda: ran.append(1)) == Decision.HALT
        assert ran == []  # fail closed: no silent local budget
        offline = ctx.get_snapshot()
        assert offline.cost_usd_accumulated == pytest.approx(0.10)
        last = offline.events[-1]
        assert last.event_type == "backend_unavailable" and "Redis unavailable" in last.reason

        own_redis.start()
        wait_until_up(coord)  # the backend breaker lets calls through once a probe answers
        assert spend(ctx, 0.20) == Decision.ALLOW
        after = ctx.get_snapshot()
        assert after.cost_usd_accumulated == pytest.approx(0.30)
        assert after.step_count == before.step_count + 1
        ctx.close()
        check_tree(coord.client, ctx.chain_id)
    finally:
        coord.close()


def test_context_opened_while_redis_is_down_halts_then_opens(own_redis: RedisServer) -> None:
    coord = Coordinator.from_url(own_redis.url, token_keys={"k": b"0123456789abcdef0"})
    try:
        own_redis.stop()
        ctx = ExecutionContext(CONFIG, coordinator=coord)
        assert ctx.wrap_llm_call(lambda: None) == Decision.HALT
        own_redis.start()
        wait_until_up(coord)
        assert spend(ctx, 0.05) == Decision.ALLOW
        assert ctx.get_snapshot().cost_usd_accumulated == pytest.approx(0.05)
        ctx.close()
    finally:
        coord.close()


def test_noscript_after_script_flush_reloads(coord: Coordinator) -> None:
    with ExecutionContext(CONFIG) as ctx:
        assert spend(ctx, 0.01) == Decision.ALLOW
        coord.client.script_flush()
        # the next reserve carries the queued settle in the same pipeline: both reload
        assert spend(ctx, 0.02) == Decision.ALLOW
        coord.client.script_flush()
        ctx.abort("flushed again")  # a direct script call reloads too
        snap = ctx.get_snapshot()
        assert snap.cost_usd_accumulated == pytest.approx(0.03)
        assert snap.abort_reason == "aborted"
    check_tree(coord.client, ctx.chain_id)


def test_settle_is_idempotent(coord: Coordinator) -> None:
    with ExecutionContext(CONFIG) as ctx:
        assert spend(ctx, 0.04) == Decision.ALLOW
        node = ctx.get_snapshot().nodes[0]
        # a replayed settle of the same reservation (a retry, a failover) changes nothing
        stops = coord.store.finish(ctx._path, node.node_id, outcome="ok", node=None,
                                   amounts=["usd", 40_000], write_behind=False)
        assert stops == []
        assert ctx.get_snapshot().cost_usd_accumulated == pytest.approx(0.04)
        assert ctx.get_snapshot().step_count == 1


def test_a_propagated_cost_survives_redis_being_down_and_counts_once(
        own_redis: RedisServer) -> None:
    coord = Coordinator.from_url(own_redis.url, token_keys={"k": b"0123456789abcdef0"})
    try:
        ctx = ExecutionContext(CONFIG, coordinator=coord)
        own_redis.stop()
        ctx.propagate_child_cost(0.20)  # queued: a late bill is never lost
        own_redis.start()
        assert ctx.get_snapshot().cost_usd_accumulated == pytest.approx(0.20)
        # the same charge sent again (its first reply lost) changes nothing
        node = {"node_id": "c1", "kind": "charge", "start_ts": 0, "end_ts": 0,
                "status": "ok", "cost_usd": 0.05}
        for _ in range(2):
            assert propagate(coord.store, ctx._path, "c1", ["usd", 50_000], node) == []
        assert ctx.get_snapshot().cost_usd_accumulated == pytest.approx(0.25)
        # a context not opened yet has nowhere to queue the charge: a typed error
        own_redis.stop()
        unopened = ExecutionContext(CONFIG, coordinator=coord)
        with pytest.raises(BackendUnavailableError):
            unopened.propagate_child_cost(0.10)
        own_redis.start()
        unopened.close()
        ctx.close()
        check_tree(coord.client, ctx.chain_id)
    finally:
        coord.close()
