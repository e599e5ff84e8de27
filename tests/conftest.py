"""Test fixtures: real redis-server processes that the tests start on free ports."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from coordinator import Coordinator
from coordinator.embedded import RedisServer
from tests.support.procs import TEST_KEYS  # the same keys in the processes the tests start

# pytest-xdist's workers set a terminal size (COLUMNS=80, LINES=24) that no terminal backs:
# budgetctl would wrap its rows there and nowhere else.
for _var in ("COLUMNS", "LINES"):
    os.environ.pop(_var, None)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One redis-server for the session (tests that kill or pause Redis start their own)."""
    with RedisServer() as server:
        yield server


@pytest.fixture
def redis_url(redis_server: RedisServer) -> Iterator[str]:
    """A clean database on the session server."""
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.script_flush()
    client.close()
    yield redis_server.url


@pytest.fixture
def coord(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Coordinator]:
    """A coordinator on the clean database, also installed as the process default (so the
    specification's examples run as written)."""
    monkeypatch.setenv("BUDGET_REDIS_URL", redis_url)
    c = Coordinator.from_url(redis_url, token_keys=TEST_KEYS)
    Coordinator.set_default(c)
    yield c
    Coordinator.set_default(None)
    c.close()
    c.client.close()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Everything under tests/faults/ (killed, paused and failed-over Redis) is slow."""
    for item in items:
        if item.path.parent.name == "faults":
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A fresh folder with a short path, for local kernels: their unix sockets live under
    it, a socket's path has at most 107 bytes, and pytest's tmp_path under xdist can be
    longer than that leaves room for."""
    folder = Path(tempfile.mkdtemp(prefix="bc-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)
