"""The live feed says Redis is gone within the bound the pages promise (a page's dot
turns red within 5 s), whether Redis stopped (its connections closed) or stalls (its
connections silent): the feed's state is when Redis last answered it, so a read that
waits on a socket timeout or on the client's retries cannot keep it "alive"."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable

import pytest

from coordinator.dashboard.live import ANSWER_S, Listener, Live
from coordinator.dashboard.service import Service
from coordinator.embedded import RedisServer
from tests.support.dashboard_server import coordinator, open_tree

pytest.importorskip("starlette")


def _wait(predicate: Callable[[], bool], deadline_s: float) -> None:
    """Wait until ``predicate()`` holds (fails after ``deadline_s``)."""
    start = time.monotonic()
    while not predicate():
        assert time.monotonic() - start < deadline_s, "not reached in time"
        time.sleep(0.02)


@pytest.mark.parametrize("how", ["stall", "stop"])
def test_the_feed_reports_redis_gone_within_its_bound(how: str) -> None:
    with RedisServer() as server:
        coord = coordinator(server.url)
        open_tree(coord, "watched-run")  # left open: Redis goes away under it
        coord.store.flush()
        live = Live(Service({"": coord}).views, tick_s=0.5)
        loop = asyncio.new_event_loop()
        live.add(Listener("", frozenset({"watched-run"}), loop))  # the poll reads it
        assert server.proc is not None
        pid = server.proc.pid
        live.start()
        try:
            _wait(lambda: live.alive, 10)
            if how == "stall":
                os.kill(pid, signal.SIGSTOP)
            else:
                server.stop()
            # the pages' bound is 5 s from Redis to the dot: the feed takes at most
            # ANSWER_S and a tick (0.5 s) of it, the stream's status another 0.5 s
            _wait(lambda: not live.alive, ANSWER_S + 1.0)
            if how == "stall":
                os.kill(pid, signal.SIGCONT)
                _wait(lambda: live.alive, 15)  # and it comes back
        finally:
            if how == "stall":
                os.kill(pid, signal.SIGCONT)
            live.stop()
            loop.close()
            coord.close()
