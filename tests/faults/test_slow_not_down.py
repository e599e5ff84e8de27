"""Slow is not down: the backend breaker opens on evidence that Redis is down (a refused
connection, timeouts in a row), not on one slow reply, and a reserve that got no answer
is sent once more when the call has time for it."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from coordinator import Coordinator, Decision, ExecutionConfig, ExecutionContext, WrapOptions
from coordinator.embedded import RedisServer
from tests.support import procs
from tests.support.stall import Pause

BIG = ExecutionConfig(max_cost_usd=1000.0, max_steps=1_000_000, max_retries_total=1_000_000)
OPTS = WrapOptions(cost_estimate_hint=0.0001)


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


def _calls_during(ctx: ExecutionContext, pauses: list[Pause], until: float
                  ) -> list[tuple[float, Decision]]:
    out = []
    while time.monotonic() < until or not all(p.done.is_set() for p in pauses):
        out.append((time.monotonic(), ctx.wrap_llm_call(lambda: None, OPTS)))
        time.sleep(0.005)
    return out


def test_replies_slower_than_the_hot_timeout_refuse_no_call(own_redis: RedisServer) -> None:
    """Redis paused for 350 ms (longer than the 250 ms hot-path timeout) three times,
    a second apart, while a loop makes calls: every call is allowed (the reserve that
    timed out is sent once more, and one timeout does not open the breaker)."""
    coord = Coordinator.from_url(own_redis.url, token_keys=procs.TEST_KEYS,
                                 hot_timeout_ms=250)
    ctx = ExecutionContext(BIG, coordinator=coord)
    assert ctx.wrap_llm_call(lambda: None, OPTS) == Decision.ALLOW
    pauses = [Pause(own_redis, after_s=0.5 + i * 1.0, stall_s=0.35).start() for i in range(3)]
    decisions = _calls_during(ctx, pauses, time.monotonic() + 3.5)
    refused = [t for t, d in decisions if d != Decision.ALLOW]
    slow = [t for t, _ in decisions if any(p.during(t) for p in pauses)]
    assert slow  # calls were made while Redis was paused
    assert refused == []
    assert not coord.backend.down
    ctx.close()
    coord.close()


def test_redis_paused_for_good_still_fails_calls_closed_fast(own_redis: RedisServer) -> None:
    """Timeouts in a row are evidence: the breaker opens, and the calls after fail
    closed at once (without waiting a timeout each)."""
    coord = Coordinator.from_url(own_redis.url, token_keys=procs.TEST_KEYS,
                                 hot_timeout_ms=100)
    ctx = ExecutionContext(BIG, coordinator=coord)
    assert ctx.wrap_llm_call(lambda: None, OPTS) == Decision.ALLOW
    pause = Pause(own_redis, after_s=0.0, stall_s=4.0).start()
    time.sleep(0.1)
    decisions = _calls_during(ctx, [], time.monotonic() + 2.0)
    assert coord.backend.down  # still paused: known down
    assert all(d == Decision.HALT for _, d in decisions)
    assert len(decisions) > 20  # failing fast once it opened, not a timeout each
    pause.done.wait(10)
    deadline = time.monotonic() + 5
    while ctx.wrap_llm_call(lambda: None, OPTS) != Decision.ALLOW:  # and it recovers
        assert time.monotonic() < deadline
        time.sleep(0.05)
    ctx.close()
    coord.close()
