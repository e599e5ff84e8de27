"""A root made while an event loop runs on the thread (a notebook cell) is opened in the
background at once, off the loop: operators see it before its first call, which waits
for that open; a failed open surfaces at the first call, as a call's would."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable

import pytest

from coordinator import (
    ChainMetadata,
    Coordinator,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    report_usage,
)
from coordinator.cli import main
from coordinator.context.state import ContextState
from coordinator.core.keys import KeySpace
from coordinator.embedded import RedisServer
from coordinator.errors import ContextExistsError
from tests.support.procs import TEST_KEYS

KS = KeySpace()


def _config() -> ExecutionConfig:
    return ExecutionConfig(max_cost_usd=1.0, max_steps=10, max_retries_total=2)


def _openers(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the threads that run a context's open."""
    names: list[str] = []
    original: Callable[..., None] = ContextState.ensure_open

    def spy(self: ContextState, **kw: bool) -> None:
        names.append(threading.current_thread().name)
        original(self, **kw)

    monkeypatch.setattr(ContextState, "ensure_open", spy)
    return names


def _no_opener_left() -> None:
    deadline = time.monotonic() + 30
    while any(t.name == "budget-open" for t in threading.enumerate()):
        assert time.monotonic() < deadline, "the background open never ended"
        time.sleep(0.02)


def test_a_root_made_on_a_running_loop_is_listed_before_its_first_call(
        coord: Coordinator, redis_url: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    openers = _openers(monkeypatch)

    async def notebook_cell() -> ExecutionContext:
        run = ExecutionContext(_config())  # and the agent thinks: no call yet
        deadline = time.monotonic() + 30
        while not coord.client.exists(KS.ctx(run.chain_id, run.chain_id)):
            assert time.monotonic() < deadline, "the root was not opened"
            await asyncio.sleep(0.01)  # the loop is free meanwhile
        return run

    run = asyncio.run(notebook_cell())
    assert openers and threading.main_thread().name not in openers  # off the loop
    assert main(["--redis", redis_url, "top", "--json"]) == 0
    assert run.chain_id in capsys.readouterr().out

    async def first_call() -> Decision:
        async def spend() -> None:
            report_usage(cost_usd=0.01)
        return await run.awrap_llm_call(spend)

    assert asyncio.run(first_call()) == Decision.ALLOW
    run.close()
    _no_opener_left()
    assert run.get_snapshot().cost_usd_accumulated == pytest.approx(0.01)


def test_a_root_closed_at_once_is_not_left_open_by_its_background_open(
        coord: Coordinator, redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    async def notebook_cell() -> ExecutionContext:
        run = ExecutionContext(_config())
        run.close()
        return run

    run = asyncio.run(notebook_cell())
    _no_opener_left()
    status = coord.client.hget(KS.ctx(run.chain_id, run.chain_id), "status")
    assert status in (None, "closed")  # never opened, or opened then closed
    assert main(["--redis", redis_url, "top", "--json"]) == 0
    assert run.chain_id not in json.dumps(capsys.readouterr().out)


def test_a_failed_background_open_surfaces_at_the_first_call(
        redis_server: RedisServer) -> None:
    server = RedisServer()  # its port is chosen; nothing listens there yet
    c = Coordinator.from_url(server.url, token_keys=TEST_KEYS, probe_interval_ms=50)
    ran: list[int] = []

    async def spend() -> None:
        ran.append(1)
        report_usage(cost_usd=0.01)

    try:
        async def while_away() -> ExecutionContext:
            run = ExecutionContext(_config(), coordinator=c)
            await asyncio.to_thread(_no_opener_left)  # its open failed
            assert await run.awrap_llm_call(spend) == Decision.HALT
            return run

        run = asyncio.run(while_away())
        assert not ran
        assert [e.event_type for e in run.get_snapshot().events] == ["backend_unavailable"]
        with server:
            deadline = time.monotonic() + 10
            while c.backend.down and time.monotonic() < deadline:
                time.sleep(0.05)

            async def back() -> Decision:
                return await run.awrap_llm_call(spend)

            assert asyncio.run(back()) == Decision.ALLOW  # the first call opens it now
            assert c.client.hget(KS.ctx(run.chain_id, run.chain_id), "status") == "running"
            run.close()
            c.close()
    finally:
        c.client.close()


def test_an_id_taken_raises_at_the_first_call(coord: Coordinator) -> None:
    taken = ExecutionContext(_config(), metadata=ChainMetadata(chain_id="taken"))

    async def notebook_cell() -> None:
        run = ExecutionContext(_config(), metadata=ChainMetadata(chain_id="taken"))
        await asyncio.to_thread(_no_opener_left)
        with pytest.raises(ContextExistsError):
            await run.awrap_llm_call(lambda: asyncio.sleep(0))

    asyncio.run(notebook_cell())
    taken.close()
