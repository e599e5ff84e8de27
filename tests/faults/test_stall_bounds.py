"""A stall is bounded per process, not per call: opens, attaches and snapshots waiting on
a paused redis-server (SIGSTOP, tests/support/stall.py) share the backend breaker, so N calls on a
root made during the stall are all decided within about one hot-path timeout (two: the
breaker opens on the second timeout in a row), not one each."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from coordinator import Coordinator, Decision, ExecutionConfig, ExecutionContext, WrapOptions
from coordinator.embedded import RedisServer
from coordinator.errors import BackendUnavailableError
from tests.support.invariants import check_tree
from tests.support.procs import TEST_KEYS
from tests.support.stall import Pause

HOT_MS = 250
PROBE_MS = 200
CONFIG = ExecutionConfig(max_cost_usd=100.0, max_steps=100_000, max_retries_total=100)
OPTS = WrapOptions(cost_estimate_hint=0.001)


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A redis-server of this test's own (it is paused)."""
    with RedisServer() as server:
        yield server


def make_coord(url: str) -> Coordinator:
    return Coordinator.from_url(url, token_keys=TEST_KEYS, hot_timeout_ms=HOT_MS,
                                probe_interval_ms=PROBE_MS, lease_ms=3000,
                                long_timeout_ms=600)


def paused(server: RedisServer, stall_s: float) -> Pause:
    pause = Pause(server, after_s=0.0, stall_s=stall_s).start()
    while not pause.stopped_at:
        time.sleep(0.002)
    return pause


@pytest.mark.slow
@pytest.mark.parametrize("n", [20, 40])
def test_calls_on_a_root_made_in_a_stall_are_all_decided_within_one_timeout(
        own_redis: RedisServer, n: int) -> None:
    coord = make_coord(own_redis.url)
    coord.store.flush()  # the wire's connection is made before the pause
    try:
        async def scenario() -> tuple[list[float], list[Decision], str]:
            pause = paused(own_redis, stall_s=2.5)
            ctx = ExecutionContext(CONFIG, coordinator=coord)  # on a loop: opens later

            async def one() -> tuple[float, Decision]:
                start = time.monotonic()
                decision = await ctx.awrap_llm_call(lambda: asyncio.sleep(0), OPTS)
                return time.monotonic() - start, decision

            results = await asyncio.gather(*(one() for _ in range(n)))
            await asyncio.to_thread(pause.done.wait, 10)
            # the root opens for real once Redis answers, and its calls flow
            deadline = time.monotonic() + 5
            while await ctx.awrap_llm_call(lambda: asyncio.sleep(0), OPTS) != Decision.ALLOW:
                assert time.monotonic() < deadline, "the root never opened after the stall"
                await asyncio.sleep(0.05)
            await asyncio.to_thread(ctx.close)
            return [d for d, _ in results], [r for _, r in results], ctx.root_id

        durations, decisions, root = asyncio.run(scenario())
        coord.store.flush()
        check_tree(coord.client, root)
    finally:
        coord.close()
    assert decisions == [Decision.HALT] * n
    # the breaker opens on the second timeout in a row (TIMEOUTS_TO_OPEN: one slow reply
    # is not an outage): the first two opens wait their timeout, every other call none
    assert max(durations) < 2 * HOT_MS / 1000 + 0.5, \
        f"{n} calls: the slowest was decided after {max(durations):.2f} s"


@pytest.mark.slow
def test_attach_and_snapshot_fail_at_once_while_the_breaker_is_open(
        own_redis: RedisServer) -> None:
    coord = make_coord(own_redis.url)
    try:
        ctx = ExecutionContext(CONFIG, coordinator=coord)
        token = ctx.token
        assert ctx.wrap_llm_call(lambda: None, OPTS) == Decision.ALLOW
        pause = paused(own_redis, stall_s=2.0)
        # snapshots that wait on the stall (on the long-timeout pool) count as evidence:
        # two timeouts in a row open the breaker
        ctx.get_snapshot()
        ctx.get_snapshot()
        assert coord.backend.down
        assert ctx.wrap_llm_call(lambda: None, OPTS) == Decision.HALT
        start = time.monotonic()
        with pytest.raises(BackendUnavailableError):
            ExecutionContext.attach(token, coordinator=coord)
        snap = ctx.get_snapshot()  # the last one read, at once
        child = ctx.spawn_child()  # unopened: its calls halt
        assert child.wrap_llm_call(lambda: None, OPTS) == Decision.HALT
        assert time.monotonic() - start < 0.1
        assert snap.chain_id == ctx.chain_id
        pause.done.wait(10)
        deadline = time.monotonic() + 5
        while child.wrap_llm_call(lambda: None, OPTS) != Decision.ALLOW:
            assert time.monotonic() < deadline, "the child never opened after the stall"
            time.sleep(0.05)
        attached = ExecutionContext.attach(token, coordinator=coord)
        assert attached.chain_id == ctx.chain_id
        child.close()
        ctx.close()
        coord.store.flush()
        check_tree(coord.client, ctx.root_id)
    finally:
        coord.close()
