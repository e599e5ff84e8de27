"""Connections are closed when their owner is done: a thread's wire connections when the
thread ends, everything a coordinator opened when it closes. redis-py's connections sit in
reference cycles, so a connection merely dropped keeps its socket open until the cyclic
collector runs (and then warns of an unclosed socket); the collector is off here, so the
test sees only what the code closes itself."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from coordinator import Coordinator, ExecutionConfig, ExecutionContext, report_usage
from coordinator.embedded import RedisServer
from coordinator.store.wire import command
from tests.support.procs import TEST_KEYS


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer() as s:  # its own: the count of clients is this test's alone
        yield s


@pytest.fixture
def no_cycle_collector() -> Iterator[None]:
    gc.collect()
    gc.disable()
    yield
    gc.enable()


def clients_besides(admin: redis.Redis) -> int:
    """How many clients the server has, besides ``admin``."""
    return len(admin.client_list()) - 1


def settles_to(admin: redis.Redis, count: int) -> int:
    """The number of other clients once it reaches ``count`` (a closed socket reaches the
    server a moment later), or what it still is after 5 s."""
    deadline = time.monotonic() + 5
    while (now := clients_besides(admin)) != count and time.monotonic() < deadline:
        time.sleep(0.02)
    return now


def one_call(coord: Coordinator) -> None:
    ctx = ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_steps=10,
                                           max_retries_total=1), coordinator=coord)
    ctx.wrap_llm_call(lambda: report_usage(cost_usd=0.01))
    ctx.close()


def test_a_finished_thread_and_a_closed_coordinator_leave_no_connection_open(
        server: RedisServer, no_cycle_collector: None) -> None:
    admin = redis.Redis.from_url(server.url)
    coord = Coordinator.from_url(server.url, token_keys=TEST_KEYS)
    one_call(coord)
    used: list[Any] = []

    def in_a_thread() -> None:
        one_call(coord)
        used.append(coord.store.wire._conn().conn)  # this thread's raw connection

    worker = threading.Thread(target=in_a_thread)
    worker.start()
    worker.join()
    assert used[0]._sock is None  # disconnected as the thread ended

    assert clients_besides(admin) >= 1
    coord.close()
    assert settles_to(admin, 0) == 0
    admin.close()


def test_a_closed_coordinator_still_answers_by_reconnecting(server: RedisServer) -> None:
    coord = Coordinator.from_url(server.url, token_keys=TEST_KEYS)
    one_call(coord)
    coord.close()
    assert coord.client.ping()
    assert coord.store.wire.run(command("PING")) == "PONG"
    coord.client.close()
    coord.store.wire.close()
