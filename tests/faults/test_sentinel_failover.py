"""Sentinel: a connection that a failover made stale is replaced before a call is
refused, so a process that sat idle through the failover gets its first call allowed
(sync and async)."""

from __future__ import annotations

import asyncio
import time

import pytest

from coordinator import (
    Coordinator,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    WrapOptions,
)
from tests.support import procs
from tests.support.topologies import SentinelSet, wait_for

BIG = ExecutionConfig(max_cost_usd=1000.0, max_steps=1_000_000, max_retries_total=1_000_000)
OPTS = WrapOptions(cost_estimate_hint=0.0001)


def _failed_over(ss: SentinelSet, old: int, settled_since: list[float]) -> bool:
    """Whether the sentinels have agreed on a new primary for a whole second (not only
    the first promotion of a failover that a second one may follow)."""
    port = ss.agreed_primary()
    if port is None or port == old:
        settled_since.clear()
        return False
    settled_since[:] = settled_since or [time.monotonic()]
    return time.monotonic() - settled_since[0] >= 1.0


@pytest.mark.slow
def test_an_idle_process_first_calls_after_a_failover_are_allowed() -> None:
    with SentinelSet(replicas=2) as ss:
        coord = Coordinator.from_url(ss.url, token_keys=procs.TEST_KEYS)
        root = ExecutionContext(BIG, coordinator=coord)
        child = ExecutionContext(BIG, parent=root)

        async def call_async() -> Decision:
            return await child.awrap_llm_call(_async_body, OPTS)

        for _ in range(3):  # connections made, on the primary about to die
            assert root.wrap_llm_call(lambda: None, OPTS) == Decision.ALLOW
            assert asyncio.run(call_async()) == Decision.ALLOW
        old = ss.primary_port()
        ss.kill_primary()
        settled_since: list[float] = []
        wait_for(lambda: _failed_over(ss, old, settled_since), 60,
                 "the sentinels to agree on a new primary")
        # idle through the failover: the very first calls go through
        assert root.wrap_llm_call(lambda: None, OPTS) == Decision.ALLOW
        assert asyncio.run(call_async()) == Decision.ALLOW
        assert not coord.backend.down
        child.close()
        root.close()
        coord.close()


async def _async_body() -> None:
    return None
