"""A call waiting for approval (ExecutionConfig.approval_wait_s): how the executor waits
for an operator's raise. The wait ends when the stop listener hears a lift at the
context or above (set_limits.lua's broadcast), when the context is aborted or times out
(its cancellation token), after a poll interval (the steps then ask Redis again with a
reserve, which also catches a raise whose broadcast was missed, or one that lifted no
stop) or when the wait's time is up. Synchronous callers block on an Event; async ones
await a future, the event loop free meanwhile."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ..core.paths import Path
from ..store.approval import end_wait_op, start_wait
from ..store.requests import ApprovalEnd, ApprovalStart, AwaitApproval
from .state import ContextState

POLL_S = 0.5
"""The longest a waiting call goes without asking Redis again (a raise whose broadcast
it missed is seen within this)."""


class _LiftHeard:
    """A stop-listener target for the time of one wait: calls ``wake`` when a lift at
    the context or above is heard."""

    __slots__ = ("__weakref__", "tree_path", "wake")

    def __init__(self, path: Path, wake: Callable[[], None]) -> None:
        self.tree_path = path
        self.wake = wake

    def handle_stop(self, reason: str) -> None:
        """A stop needs no wake: one that cancels reaches the wait by the token."""

    def handle_lift(self, reasons: frozenset[str]) -> None:
        self.wake()


def start(state: ContextState, r: ApprovalStart) -> int:
    """Mark the tree waiting; the Redis clock learnt from the wait's end."""
    until_ms = start_wait(state.store, r.path.root, r.path.ctx_id, r.reason, r.wait_ms)
    if until_ms:
        state.coord.observe_redis_time(until_ms - r.wait_ms)
    return until_ms


def end(state: ContextState, r: ApprovalEnd) -> None:
    state.store.wire.queue(end_wait_op(state.store, r.path.root, r.path.ctx_id, r.until_ms))
    state.coord.schedule_flush()


def _left_s(state: ContextState, r: AwaitApproval) -> float:
    return (r.until_ms - state.coord.redis_now_ms()) / 1000


def await_sync(state: ContextState, r: AwaitApproval) -> bool:
    """Block this thread for the wait (see the module)."""
    left = _left_s(state, r)
    if left <= 0:
        return False
    woken = threading.Event()
    with _woken_by_lift_or_cancel(state, r.path, woken.set):
        woken.wait(min(left, POLL_S))
    return _left_s(state, r) > 0


async def await_async(state: ContextState, r: AwaitApproval) -> bool:
    """Await the wait on the running event loop (see the module)."""
    left = _left_s(state, r)
    if left <= 0:
        return False
    loop = asyncio.get_running_loop()
    woken: asyncio.Future[None] = loop.create_future()

    def resolve() -> None:
        if not woken.done():
            woken.set_result(None)

    def wake() -> None:  # called from the listener's thread, or the one that cancels
        loop.call_soon_threadsafe(resolve)

    with _woken_by_lift_or_cancel(state, r.path, wake):
        try:
            await asyncio.wait({woken}, timeout=min(left, POLL_S))
        finally:
            woken.cancel()
    return _left_s(state, r) > 0


@contextmanager
def _woken_by_lift_or_cancel(state: ContextState, path: Path, wake: Callable[[], None]
                             ) -> Iterator[None]:
    """While inside, a lift heard at ``path`` or above, or the context's cancellation,
    calls ``wake``."""
    hear = _LiftHeard(path, wake)
    state.coord.register(hear)
    unhook = state.cancellation_token.on_cancel(lambda _: wake())
    try:
        yield
    finally:
        unhook()
        state.coord.unregister(hear)
