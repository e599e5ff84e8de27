"""The two drivers of a call's logic. The logic (call.py) is written once, as generators
that yield the requests they need, as plain data (store/requests.py, hooks.py); an
executor (executor.py, or a test's script) answers each. The sync driver runs each
request in the caller's thread; the async driver awaits the store's I/O thread for a
request that may wait on Redis, so the event loop never does, and awaits a wait for
approval (an operator's raise) as a future. The twins differ only in how they wait."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Generator
from functools import partial
from typing import Any, TypeVar

from ..store.io_thread import IOThread, Item
from ..store.requests import AwaitApproval, Reserve, StoreRequest
from .hooks import HookRequest

T = TypeVar("T")
Request = StoreRequest | HookRequest
"""Everything a call's steps may ask for."""
Steps = Generator[Request, Any, T]
"""A piece of a call's logic: yields requests, receives their replies (or has their
errors thrown in), returns its value."""
Execute = Callable[[Request], Any]
"""Answers a request: the executor (executor.py), or a unit test's script."""


def drive(steps: Steps[T], execute: Execute) -> T:
    """Run ``steps`` here, each request answered by ``execute`` in this thread."""
    try:
        request = next(steps)
        while True:
            try:
                value = execute(request)
            except BaseException as exc:  # noqa: BLE001 - the logic decides what it means
                request = steps.throw(exc)
            else:
                request = steps.send(value)
    except StopIteration as stop:
        result: T = stop.value
        return result


async def adrive(steps: Steps[T], execute: Execute, io: IOThread) -> T:
    """Run ``steps`` on the event loop. A reserve goes to the I/O thread (pipelined with
    other coroutines' reserves); other work that may wait (a round trip, hooks, whose
    state may live in context variables) runs there in a copy of the caller's context,
    and what it set there is set in the caller's; a queued write runs here."""
    try:
        request = next(steps)
        while True:
            try:
                if isinstance(request, Reserve):
                    value = await wait(io.submit(request))
                elif isinstance(request, AwaitApproval):
                    value = await _await_approval(execute, request)
                elif not request.waits:
                    value = execute(request)
                else:
                    ctx = contextvars.copy_context()
                    try:
                        value = await wait(io.submit(partial(ctx.run, execute, request)))
                    finally:
                        _adopt(ctx)
            except BaseException as exc:  # noqa: BLE001 - the logic decides what it means
                request = steps.throw(exc)
            else:
                request = steps.send(value)
    except StopIteration as stop:
        result: T = stop.value
        return result


async def _await_approval(execute: Execute, request: AwaitApproval) -> Any:
    """A wait for approval awaited here, the event loop free: the executor's
    ``await_approval``; an executor without one (a test's script) answers at once."""
    awaiting = getattr(execute, "await_approval", None)
    if awaiting is None:
        return execute(request)
    return await awaiting(request)


def _adopt(ctx: contextvars.Context) -> None:
    """Set in the current context the variables ``ctx`` changed."""
    for var, value in ctx.items():
        if var.get(_UNSET) is not value:
            var.set(value)


_UNSET = object()


async def wait(item: Item) -> Any:
    """The result of a request. A cancellation arriving while the I/O thread runs it is
    held until the request is done (it takes at most one hot-path timeout) and delivered
    at the task's next await, so that what the request did (a hold taken) is known to the
    logic and settled by it, never left behind. A request cancelled before it started is
    skipped, and the cancellation goes through at once."""
    try:
        return await item.fut
    except asyncio.CancelledError:
        if not item.started or item.skipped:
            raise
    task = asyncio.current_task()
    assert task is not None
    task.uncancel()
    held = 1
    while not item.done:
        item.fut = item.loop.create_future()  # _resolve (on this loop) resolves it
        try:
            await item.fut
        except asyncio.CancelledError:
            if not item.done:  # another cancellation of the task: hold it too
                task.uncancel()
                held += 1
        except BaseException:  # noqa: BLE001, S110 - the item has it, read below
            pass
    for _ in range(held):
        task.cancel()
    if item.skipped:
        await asyncio.sleep(0)  # nothing was sent: the cancellation goes through here
    if item.error is not None:
        raise item.error
    return item.value
