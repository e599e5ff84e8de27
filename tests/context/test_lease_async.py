"""Lease mode with the generator steps: a call served from a slice sends no store request
(no I/O thread hop for async callers); while Redis is paused, calls covered by the live
slice keep being served, and strict reserves and slice takes fail closed at once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

from coordinator import (
    Coordinator,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    LeasePolicy,
    WrapOptions,
)
from coordinator.core.keys import KeySpace
from coordinator.embedded import RedisServer
from coordinator.store.io_thread import Work
from tests.support.invariants import check_tree
from tests.support.procs import TEST_KEYS
from tests.support.stall import Pause

KS = KeySpace()
CONFIG = ExecutionConfig(max_cost_usd=100.0, max_steps=100_000, max_retries_total=100,
                         lease=LeasePolicy(usd=0.05, steps=1000, max_age_ms=10_000))


def _steps(coord: Coordinator, root: str) -> int:
    return int(coord.client.hget(KS.ctx(root, root), "u:steps") or 0)


def test_async_calls_served_from_a_slice_send_no_store_request(
        coord: Coordinator, monkeypatch: pytest.MonkeyPatch) -> None:
    submitted: list[Work] = []
    submit = coord.io.submit

    def counting(request: Work) -> Any:
        submitted.append(request)
        return submit(request)

    monkeypatch.setattr(coord.io, "submit", counting)

    async def scenario() -> str:
        async with ExecutionContext(CONFIG, coordinator=coord) as ctx:
            opts = WrapOptions(cost_estimate_hint=0.001)
            assert await ctx.awrap_llm_call(lambda: asyncio.sleep(0), opts) == Decision.ALLOW
            taken = len(submitted)
            assert taken >= 1  # the slice's take went through the I/O thread
            for _ in range(30):
                assert await ctx.awrap_llm_call(lambda: asyncio.sleep(0), opts) \
                    == Decision.ALLOW
            assert len(submitted) == taken  # served in-process: no request at all
            return ctx.root_id

    root = asyncio.run(scenario())
    coord.store.flush()
    assert _steps(coord, root) == 31
    check_tree(coord.client, root)


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A redis-server of this test's own (it is paused)."""
    with RedisServer() as server:
        yield server


@pytest.mark.slow
def test_a_paused_redis_serves_the_live_slice_and_fails_takes_fast(
        own_redis: RedisServer) -> None:
    coord = Coordinator.from_url(own_redis.url, token_keys=TEST_KEYS, hot_timeout_ms=250,
                                 probe_interval_ms=300, lease_ms=30_000)
    small, big = WrapOptions(cost_estimate_hint=0.01), WrapOptions(cost_estimate_hint=0.1)

    async def timed(ctx: ExecutionContext, opts: WrapOptions) -> tuple[Decision, float]:
        start = time.monotonic()
        decision = await ctx.awrap_llm_call(lambda: asyncio.sleep(0), opts)
        return decision, time.monotonic() - start

    async def scenario() -> tuple[str, int]:
        async with ExecutionContext(CONFIG, coordinator=coord) as ctx:
            allowed = 0
            assert (await timed(ctx, small))[0] == Decision.ALLOW  # takes the slice
            allowed += 1
            pause = Pause(own_redis, after_s=0.0, stall_s=2.5).start()
            while not pause.stopped_at:
                await asyncio.sleep(0.01)
            # covered by the live slice: served without Redis
            d, took = await timed(ctx, small)
            assert d == Decision.ALLOW and took < 0.1
            allowed += 1
            # a strict reserve (larger than any slice) meets the stall, opens the breaker
            d, took = await timed(ctx, big)
            assert d == Decision.HALT and took < 0.25 + 0.5
            assert coord.backend.down
            d, took = await timed(ctx, big)  # fails fast now
            assert d == Decision.HALT and took < 0.1
            # the slice still serves what it covers; once spent, its take fails fast
            while True:
                d, took = await timed(ctx, small)
                assert took < 0.1
                if d != Decision.ALLOW:
                    break
                allowed += 1
            assert d == Decision.HALT and allowed == 5  # 0.05 / 0.01
            assert pause.during(time.monotonic())
            await asyncio.to_thread(pause.done.wait, 5)
            deadline = time.monotonic() + 3
            while coord.backend.down and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            d, _ = await timed(ctx, small)  # the same context goes on (a new slice)
            assert d == Decision.ALLOW
            allowed += 1
            snap = await ctx.aget_snapshot()
            assert any(e.event_type == "backend_unavailable" for e in snap.events)
            return ctx.root_id, allowed

    try:
        root, allowed = asyncio.run(scenario())
        coord.store.flush()
        assert _steps(coord, root) == allowed  # batches queued in the stall landed
        check_tree(coord.client, root)
    finally:
        coord.close()
