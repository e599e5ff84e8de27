"""The two drivers of a call's steps (context/steps.py), with a scripted executor and no
Redis: where each request runs, what reaches the steps, and that a cancellation arriving
while a request runs waits for its reply (so what it did is settled, never lost)."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from coordinator.context.steps import Request, Steps, adrive, drive
from coordinator.core.paths import Path
from coordinator.runtime.coordinator import Coordinator
from coordinator.store.requests import Event, Flush
from tests.unit.scripted import offline_coordinator

PATH = Path("root", ("root",))
seen_by_hook: contextvars.ContextVar[str] = contextvars.ContextVar("seen_by_hook",
                                                                   default="unset")


@pytest.fixture
def coord() -> Iterator[Coordinator]:
    c = offline_coordinator()
    yield c
    c.close()


def two_requests(log: list[Any]) -> Steps[str]:
    log.append((yield Flush()))
    log.append((yield Event(PATH, "{}")))
    return "done"


def test_drive_answers_each_request_here_and_throws_errors_in() -> None:
    def execute(request: Request) -> Any:
        if isinstance(request, Event):
            raise KeyError("no room")
        return threading.current_thread().name

    def steps() -> Steps[str]:
        here = yield Flush()
        try:
            yield Event(PATH, "{}")
        except KeyError:
            return f"{here}: refused"
        return "unreachable"

    assert drive(steps(), execute) == f"{threading.current_thread().name}: refused"


def test_adrive_waits_on_the_io_thread_and_writes_queued_work_on_the_loop(
        coord: Coordinator) -> None:
    def execute(request: Request) -> Any:
        return threading.current_thread().name

    async def scenario() -> tuple[str, list[Any]]:
        log: list[Any] = []
        return await adrive(two_requests(log), execute, coord.io), log

    result, log = asyncio.run(scenario())
    assert result == "done"
    assert log == ["budget-io", threading.current_thread().name]


def test_hooks_run_in_a_copy_of_the_caller_s_context_and_what_they_set_comes_back(
        coord: Coordinator) -> None:
    def execute(request: Request) -> Any:
        before = seen_by_hook.get()
        seen_by_hook.set("set by the hook")
        return before

    async def scenario() -> tuple[list[Any], str]:
        seen_by_hook.set("the caller's")
        log: list[Any] = []

        def steps() -> Steps[None]:
            log.append((yield Flush()))

        await adrive(steps(), execute, coord.io)
        return log, seen_by_hook.get()

    log, after = asyncio.run(scenario())
    assert log == ["the caller's"] and after == "set by the hook"


def test_a_cancellation_waits_for_the_request_in_flight_and_its_reply_reaches_the_steps(
        coord: Coordinator) -> None:
    running, release = threading.Event(), threading.Event()

    def execute(request: Request) -> Any:
        running.set()
        release.wait(5)
        return "held"

    async def scenario() -> tuple[list[Any], bool]:
        log: list[Any] = []

        def steps() -> Steps[None]:
            log.append((yield Flush()))

        task = asyncio.create_task(adrive(steps(), execute, coord.io))
        await asyncio.to_thread(running.wait, 5)
        task.cancel()
        await asyncio.sleep(0.05)
        assert not task.done()  # held while the request runs
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        return log, task.cancelled()

    log, cancelled = asyncio.run(scenario())
    assert log == ["held"] and cancelled
