"""A process that has seen a stop reads it in its snapshot: the abort this process sent
lands before any read it makes after the local stop shows (read-your-writes)."""

from __future__ import annotations

import asyncio
import threading
import time

from coordinator import (
    ContextSnapshot,
    Coordinator,
    Decision,
    ExecutionConfig,
    ExecutionContext,
)
from coordinator.embedded import RedisServer
from tests.support.procs import TEST_KEYS


def _config() -> ExecutionConfig:
    return ExecutionConfig(max_cost_usd=1.0, max_steps=50, max_retries_total=3)


def _snapshot_as_the_stop_shows(ctx: ExecutionContext) -> list[ContextSnapshot]:
    """The snapshots read by whoever hears the stop first: a callback of the context's
    cancellation token runs the moment the local stop is set."""
    seen: list[ContextSnapshot] = []
    ctx.cancellation_token.on_cancel(lambda _reason: seen.append(ctx.get_snapshot()))
    return seen


def test_a_snapshot_read_as_the_abort_shows_here_carries_it(coord: Coordinator) -> None:
    ctx = ExecutionContext(_config())
    seen = _snapshot_as_the_stop_shows(ctx)
    ctx.abort("enough")
    assert [(s.aborted, s.abort_reason) for s in seen] == [(True, "aborted")]
    assert any(e.reason == "enough" for e in seen[0].events)
    ctx.close()


def test_a_snapshot_read_as_the_async_abort_shows_here_carries_it(
        coord: Coordinator) -> None:
    ctx = ExecutionContext(_config())
    seen = _snapshot_as_the_stop_shows(ctx)
    asyncio.run(ctx.aabort("enough"))
    assert [(s.aborted, s.abort_reason) for s in seen] == [(True, "aborted")]
    ctx.close()


def test_another_thread_that_hears_the_abort_reads_it(coord: Coordinator) -> None:
    ctx = ExecutionContext(_config())
    seen: list[ContextSnapshot] = []

    def stream_consumer() -> None:  # a stream's thread: it stops when the token is set
        ctx.cancellation_token.wait()
        seen.append(ctx.get_snapshot())

    consumer = threading.Thread(target=stream_consumer)
    consumer.start()
    ctx.abort("enough")
    consumer.join(30)
    assert [(s.aborted, s.abort_reason) for s in seen] == [(True, "aborted")]
    ctx.close()


def test_an_abort_while_redis_is_away_lands_when_it_answers(
        redis_server: RedisServer) -> None:
    server = RedisServer()  # its port is chosen; nothing listens there yet
    c = Coordinator.from_url(server.url, token_keys=TEST_KEYS, probe_interval_ms=50)
    try:
        ctx = ExecutionContext(_config(), coordinator=c)  # unopened: Redis is away
        ctx.abort("while away")
        assert ctx.stop_reason == "aborted"
        assert ctx.wrap_llm_call(lambda: None) == Decision.HALT
        with server:
            deadline = time.monotonic() + 10
            while c.backend.down and time.monotonic() < deadline:  # its probe hears it
                time.sleep(0.05)
            snap = ctx.get_snapshot()  # the open, then the abort, land first
            assert (snap.aborted, snap.abort_reason) == (True, "aborted")
            ctx.close()
            c.close()
    finally:
        c.client.close()


def test_the_snapshot_shown_while_redis_is_away_carries_a_stop_seen_since() -> None:
    server = RedisServer().start()
    c = Coordinator.from_url(server.url, token_keys=TEST_KEYS, probe_interval_ms=50)
    try:
        ctx = ExecutionContext(_config(), coordinator=c)
        assert not ctx.get_snapshot().aborted  # the last snapshot read
        server.stop()
        ctx.abort("while away")  # queued: it lands once Redis answers
        snap = ctx.get_snapshot()  # Redis is away: the last one read, and what came since
        assert (snap.aborted, snap.abort_reason, snap.status) == (True, "aborted", "stopped")
        c.close()
    finally:
        server.stop()
        c.client.close()
