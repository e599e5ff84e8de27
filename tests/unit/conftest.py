"""The unit tests run without Redis: starting a redis-server (by the project's helper or
any subprocess) fails the test, and the coordinator they build connects to nothing (a
connection attempt raises, as an unreachable Redis would: tests/unit/scripted.py)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from typing import Any, NoReturn

import pytest

from coordinator.embedded import RedisServer

_popen_init = subprocess.Popen.__init__


def _no_server(*_: Any, **__: Any) -> NoReturn:
    pytest.fail("a unit test tried to start a redis-server; unit tests run without Redis")


def _guarded_popen(self: Any, args: Any, *rest: Any, **kwargs: Any) -> None:
    argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
    if argv and "redis-server" in os.path.basename(os.fsdecode(argv[0])):
        _no_server()
    _popen_init(self, args, *rest, **kwargs)


@pytest.fixture(autouse=True)
def no_redis_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Starting a redis-server fails the test."""
    monkeypatch.setattr(RedisServer, "start", _no_server)
    monkeypatch.setattr(subprocess.Popen, "__init__", _guarded_popen)
    yield


@pytest.fixture
def redis_server() -> NoReturn:
    """Overrides tests/conftest.py's: a unit test asking for a server fails."""
    _no_server()
