"""A token always names a context that exists: a root made while an asyncio loop runs on
the thread (a notebook, Playwright's sync API) is opened before its token is handed out,
off the loop's thread, so another OS process attaches it and operators see it."""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import threading
import time

import pytest

from coordinator import Coordinator, ExecutionConfig, ExecutionContext
from coordinator.cli import main
from coordinator.context.state import ContextState
from coordinator.core.keys import KeySpace
from coordinator.embedded import RedisServer
from coordinator.errors import BackendUnavailableError
from tests.support import procs
from tests.support.invariants import check_tree
from tests.support.procs import TEST_KEYS

KS = KeySpace()
SPAWN = mp.get_context("spawn")


def _config() -> ExecutionConfig:
    return ExecutionConfig(max_cost_usd=1.0, max_steps=10, max_retries_total=2)


def test_a_token_read_on_a_running_loop_names_an_open_context(
        coord: Coordinator, redis_url: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 25, case 6: the root is made inside a running event loop and its token read
    there; a process attaches it and spends, and `budgetctl top` lists the tree."""
    opened_on: list[str] = []
    original = ContextState.ensure_open

    def spy(self: ContextState, **kw: bool) -> None:
        opened_on.append(threading.current_thread().name)
        original(self, **kw)

    monkeypatch.setattr(ContextState, "ensure_open", spy)

    async def notebook_cell() -> tuple[ExecutionContext, str]:
        root = ExecutionContext(_config())
        return root, root.token

    root, token = asyncio.run(notebook_cell())
    # opened before its token was handed out (by the background open or the token read,
    # whichever came first), never on the loop's thread
    assert opened_on and threading.main_thread().name not in opened_on
    assert coord.client.hget(KS.ctx(root.chain_id, root.chain_id), "status") == "running"

    worker = SPAWN.Process(target=procs.spend_and_exit, args=(redis_url, token))
    worker.start()
    worker.join(60)
    assert worker.exitcode == 0  # attach found the context (no ContextNotFoundError)
    assert root.get_snapshot().cost_usd_accumulated == pytest.approx(0.07)

    assert main(["--redis", redis_url, "top", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert root.chain_id in json.dumps(listed)
    root.close()
    assert check_tree(coord.client, root.chain_id) == 70_000


def test_no_token_names_a_context_redis_has_not_opened(redis_server: RedisServer) -> None:
    """A root made while Redis is unreachable stays unopened (its calls halt). Its token
    is refused meanwhile (BackendUnavailableError, on a loop's thread or not); read once
    Redis answers, it opens the root first, from a plain thread with no event loop."""
    server = RedisServer()  # its port is chosen; nothing listens there yet
    c = Coordinator.from_url(server.url, token_keys=TEST_KEYS, probe_interval_ms=50)
    try:
        root = ExecutionContext(_config(), coordinator=c)
        assert root._state.pending_open is not None
        with pytest.raises(BackendUnavailableError):
            _ = root.token

        async def on_loop() -> None:
            with pytest.raises(BackendUnavailableError):
                _ = root.token

        asyncio.run(on_loop())
        with server:
            deadline = time.monotonic() + 10
            while c.backend.down and time.monotonic() < deadline:
                time.sleep(0.05)
            token = root.token
            assert c.client.hget(KS.ctx(root.chain_id, root.chain_id), "status") == "running"
            assert ExecutionContext.attach(token, c).chain_id == root.chain_id
            root.close()
            c.close()
    finally:
        c.client.close()
