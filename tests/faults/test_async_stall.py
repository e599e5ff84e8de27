"""Never block the event loop, and fail fast when Redis stalls: a redis-server paused with
SIGSTOP (by a timer thread), async and sync callers, and a FastAPI service."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from coordinator import Coordinator, Decision, ExecutionConfig, ExecutionContext, WrapOptions
from coordinator.embedded import RedisServer, free_port
from tests.support.invariants import check_tree
from tests.support.procs import TEST_KEYS
from tests.support.stall import Heartbeat, Pause

HOT_MS = 250
PROBE_MS = 300
CONFIG = ExecutionConfig(max_cost_usd=100.0, max_steps=100_000, max_retries_total=100)
OPTS = WrapOptions(cost_estimate_hint=0.001)
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A redis-server of this test's own (it is paused)."""
    with RedisServer() as server:
        yield server


def make_coord(url: str) -> Coordinator:
    return Coordinator.from_url(url, token_keys=TEST_KEYS, hot_timeout_ms=HOT_MS,
                                probe_interval_ms=PROBE_MS, lease_ms=3000)


def settle_invariants(coord: Coordinator, root: str) -> None:
    """After a stall, the tree's books balance once the queued writes have landed."""
    coord.store.flush()
    check_tree(coord.client, root)


@pytest.mark.slow
def test_event_loop_stays_responsive_and_calls_fail_fast_while_redis_is_paused(
        own_redis: RedisServer) -> None:
    coord = make_coord(own_redis.url)
    ran_during_stall: list[float] = []
    calls: list[tuple[float, float, Decision]] = []

    async def scenario() -> tuple[Heartbeat, Pause]:
        async with ExecutionContext(CONFIG, coordinator=coord) as ctx:
            assert await ctx.awrap_llm_call(lambda: asyncio.sleep(0)) == Decision.ALLOW
            beat = Heartbeat()
            beating = asyncio.create_task(beat.run())
            pause = Pause(own_redis, after_s=0.5, stall_s=3.0).start()
            end = time.monotonic() + 5.0

            async def body() -> None:
                now = time.monotonic()
                if pause.during(now) and now > pause.stopped_at + 0.1:
                    # (a reserve answered just before the pause may start its body in it)
                    ran_during_stall.append(now)
                await asyncio.sleep(0.02)

            async def agent() -> None:
                while time.monotonic() < end:
                    start = time.monotonic()
                    decision = await ctx.awrap_llm_call(body, OPTS)
                    calls.append((start, time.monotonic(), decision))
                    await asyncio.sleep(0.01)

            await asyncio.gather(*(agent() for _ in range(10)))
            beat.stop()
            await beating
            pause.done.wait(5)
            # the same context continues after the stall
            assert await ctx.awrap_llm_call(lambda: asyncio.sleep(0), OPTS) == Decision.ALLOW
            snap = await ctx.aget_snapshot()
            assert any(e.event_type == "backend_unavailable" for e in snap.events)
            root = ctx.root_id
        settle_invariants(coord, root)
        return beat, pause

    try:
        beat, pause = asyncio.run(scenario())
    finally:
        coord.close()
    assert beat.worst < 0.5, f"event loop blocked for {beat.worst:.3f} s"
    assert not ran_during_stall  # fail closed: nothing ran without a budget
    stalled = [(s, e, d) for s, e, d in calls if pause.during(s) and pause.during(e)]
    assert len(stalled) > 10
    assert all(d == Decision.HALT for _, _, d in stalled)
    slowest = max(e - s for s, e, _ in stalled)
    assert slowest < HOT_MS / 1000 + 0.5, f"a call waited {slowest:.3f} s in the stall"
    allowed_after = [s for s, _, d in calls if s > pause.resumed_at and d == Decision.ALLOW]
    assert allowed_after, "calls did not flow again after the stall"


@pytest.mark.slow
def test_sync_threads_in_a_stall_all_get_their_answer_within_about_one_timeout(
        own_redis: RedisServer) -> None:
    coord = make_coord(own_redis.url)
    n = 20
    durations: list[float] = []
    decisions: list[Decision] = []
    lock = threading.Lock()
    try:
        ctx = ExecutionContext(CONFIG, coordinator=coord)
        barrier = threading.Barrier(n + 1)

        def thread() -> None:
            ctx.wrap_llm_call(lambda: None, OPTS)  # this thread's connection is made
            barrier.wait()
            barrier.wait()  # Redis is paused now
            start = time.monotonic()
            decision = ctx.wrap_llm_call(lambda: None, OPTS)
            with lock:
                durations.append(time.monotonic() - start)
                decisions.append(decision)

        threads = [threading.Thread(target=thread) for _ in range(n)]
        for t in threads:
            t.start()
        barrier.wait()
        pause = Pause(own_redis, after_s=0.0, stall_s=2.0).start()
        while not pause.stopped_at:
            time.sleep(0.005)
        barrier.wait()
        for t in threads:
            t.join(10)
        # a call made once the stall is known fails at once
        start = time.monotonic()
        assert ctx.wrap_llm_call(lambda: None, OPTS) == Decision.HALT
        fast = time.monotonic() - start
        pause.done.wait(5)
        deadline = time.monotonic() + 5
        while ctx.wrap_llm_call(lambda: None, OPTS) != Decision.ALLOW:
            assert time.monotonic() < deadline, "calls did not flow again"
            time.sleep(0.02)
        ctx.close()
        settle_invariants(coord, ctx.root_id)
    finally:
        coord.close()
    assert decisions == [Decision.HALT] * n
    # one timeout each, side by side: not n timeouts one after another
    assert max(durations) < HOT_MS / 1000 + 0.75, f"slowest answer {max(durations):.3f} s"
    assert fast < 0.1


SERVICE_APP = '''
import asyncio
from fastapi import FastAPI
from coordinator import ExecutionConfig, ExecutionContext, WrapOptions

def build_app():
    app = FastAPI()

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.post("/work")
    async def work():
        async with ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_steps=100,
                                                    max_retries_total=10)) as ctx:
            decisions = await asyncio.gather(*(
                ctx.awrap_llm_call(lambda: asyncio.sleep(0.05),
                                   WrapOptions(cost_estimate_hint=0.001))
                for _ in range(5)))
        return {"decisions": [d.value for d in decisions]}

    return app
'''


@pytest.mark.slow
def test_fastapi_service_answers_health_checks_while_redis_is_paused(
        own_redis: RedisServer) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    folder = tempfile.mkdtemp(prefix="svc-async-")
    Path(folder, "stall_app.py").write_text(SERVICE_APP)
    log = Path(folder, "log.txt").open("wb")
    code = ("import uvicorn; uvicorn.run('stall_app:build_app', factory=True, "
            f"host='127.0.0.1', port={port}, log_level='warning')")
    env = {**os.environ, "BUDGET_REDIS_URL": own_redis.url,
           "BUDGET_TOKEN_KEYS": ",".join(f"{k}:{v.decode()}" for k, v in TEST_KEYS.items()),
           "BUDGET_HOT_TIMEOUT_MS": str(HOT_MS), "BUDGET_PROBE_INTERVAL_MS": str(PROBE_MS),
           "PYTHONPATH": os.pathsep.join([folder, str(REPO)])}
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=folder, stdout=log,
                            stderr=log, env=env)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline, \
                    Path(folder, "log.txt").read_text()
                time.sleep(0.1)
        assert httpx.post(f"{url}/work", timeout=10).json()["decisions"] == ["ALLOW"] * 5

        work_results: list[list[str]] = []
        stop = threading.Event()

        def keep_working() -> None:
            with httpx.Client(timeout=30) as client:
                while not stop.is_set():
                    work_results.append(client.post(f"{url}/work").json()["decisions"])

        workers = [threading.Thread(target=keep_working) for _ in range(4)]
        for w in workers:
            w.start()
        pause = Pause(own_redis, after_s=0.3, stall_s=3.0).start()
        worst = 0.0
        checks = 0
        with httpx.Client(timeout=10) as client:
            while not pause.done.is_set():
                start = time.monotonic()
                assert client.get(f"{url}/health").status_code == 200
                if pause.during(start):
                    worst = max(worst, time.monotonic() - start)
                    checks += 1
                time.sleep(0.05)
        deadline = time.monotonic() + 10
        while "ALLOW" not in (work_results[-1] if work_results else []):
            assert time.monotonic() < deadline, "the service's calls did not flow again"
            time.sleep(0.05)
        stop.set()
        for w in workers:
            w.join(30)
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()
    assert checks > 10
    assert worst < 0.5, f"a health check waited {worst:.3f} s while Redis was paused"
    assert any(r == ["HALT"] * 5 for r in work_results)


def test_async_calls_cancelled_at_any_point_leave_nothing_held(coord: Coordinator) -> None:
    """Outer cancellations (``asyncio.wait_for``) landing before, during and after the
    reserve: a hold taken is always settled or released, nothing stays open."""
    async def scenario() -> str:
        async with ExecutionContext(CONFIG) as ctx:
            async def one(i: int) -> None:
                try:
                    await asyncio.wait_for(
                        ctx.awrap_llm_call(lambda: asyncio.sleep(0.002), OPTS),
                        timeout=(i % 7) * 0.0005)
                except TimeoutError:
                    pass
            await asyncio.gather(*(one(i) for i in range(300)))
            assert await ctx.awrap_llm_call(lambda: asyncio.sleep(0), OPTS) == Decision.ALLOW
            return ctx.root_id

    root = asyncio.run(scenario())
    settle_invariants(coord, root)
