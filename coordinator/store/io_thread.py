"""The I/O thread: one per store and process, it runs the Redis work of async callers off
their event loop. Every reserve queued while it was busy goes out in one pipelined round
trip (with the queued writes), so the reserves of concurrent coroutines overlap instead of
queuing; other work (a function the async driver hands over: context/steps.py) runs one
after another; the results of a batch reach each event loop in one wake-up."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from .errors import UNAVAILABLE
from .health import BackendDown, is_stall
from .requests import Reserve
from .resend import round_trip_resending
from .tree import Store

log = logging.getLogger("coordinator")

Work = Reserve | Callable[[], Any]
"""What the thread runs: a reserve (pipelined with the others queued), or a function."""


class Item:
    """One request in flight: its future on the caller's loop, and what became of it."""

    __slots__ = ("request", "loop", "fut", "started", "done", "skipped", "value", "error")

    def __init__(self, request: Work, loop: asyncio.AbstractEventLoop) -> None:
        self.request = request
        self.loop = loop
        self.fut: asyncio.Future[Any] = loop.create_future()
        self.started = False
        """Set by the I/O thread before it looks whether the caller gave up."""
        self.done = False
        self.skipped = False
        """The caller gave up before it started: nothing was sent."""
        self.value: Any = None
        self.error: BaseException | None = None


class IOThread:
    """Runs requests on a background thread for asyncio callers (see :meth:`submit`).

    ``allow(key)`` says whether the node serving ``key`` may be tried now (the backend
    breaker): when it does not, reserves on it fail at once with :class:`BackendDown`;
    ``failed(exc, key)`` hears every stall, ``succeeded(key)`` every answered reserve."""

    def __init__(self, store: Store, allow: Callable[[str | None], bool],
                 failed: Callable[[BaseException, str | None], None],
                 succeeded: Callable[[str | None], None]) -> None:
        self._store = store
        self._allow = allow
        self._failed = failed
        self._succeeded = succeeded
        self._cond = threading.Condition()
        self._queue: list[Item] = []
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._closed = False

    def submit(self, request: Work) -> Item:
        """Queue ``request`` from a coroutine; await ``item.fut`` for its result. A
        request whose future is cancelled before it starts is skipped."""
        item = Item(request, asyncio.get_running_loop())
        with self._cond:
            if self._thread is None or self._closed or self._pid != os.getpid():
                # first use, after close, or forked (the parent's thread is not ours)
                self._queue, self._pid, self._closed = [], os.getpid(), False
                self._thread = threading.Thread(target=self._run, name="budget-io",
                                                daemon=True)
                self._thread.start()
            self._queue.append(item)
            self._cond.notify()
        return item

    def close(self) -> None:
        """Stop the thread once what is queued has run."""
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return
                batch, self._queue = self._queue, []
            reserves = []
            for item in batch:
                item.started = True
                if item.fut.cancelled():  # after ``started``: see steps.wait
                    item.skipped = True
                elif isinstance(item.request, Reserve):
                    reserves.append(item)
                else:
                    self._run_one(item, item.request)
            if reserves:
                self._reserve_all(reserves)
            self._deliver(batch)

    def _run_one(self, item: Item, fn: Callable[[], Any]) -> None:
        try:
            item.value = fn()
        except BaseException as exc:  # noqa: BLE001 - the waiting caller gets it
            if is_stall(exc):
                self._failed(exc, None)
            item.error = exc

    def _reserve_all(self, items: list[Item]) -> None:
        """The reserves whose node is not known down in one round trip (a Cluster's
        nodes are sent to in turn); each caller gets its own reply."""
        store = self._store
        for item in items:
            if not self._allow(_key(store, item.request)):
                item.error = BackendDown()
        items = [item for item in items if item.error is None]
        if not items:
            return
        requests = [item.request for item in items]
        ops = [store.reserve_op(r.path, r.reservation_id, r.amounts, r.keyed, r.terms)
               for r in requests if isinstance(r, Reserve)]
        try:
            # a lost connection is replaced and the reserves sent again, but a timeout is
            # not waited twice: the callers behind this round trip wait for it too
            replies = round_trip_resending(store.wire, ops, resend=True, after_timeout=False)
        except BaseException as exc:  # noqa: BLE001 - every waiting caller gets it
            if is_stall(exc):
                self._failed(exc, _key(store, requests[0]))
            for item, r in zip(items, requests, strict=True):
                item.error = exc
                if isinstance(r, Reserve) and isinstance(exc, UNAVAILABLE):
                    store.unheard(r.path, r.reservation_id, r.keyed)
            return
        self._succeeded(_key(store, requests[0]))
        for item, r, reply in zip(items, requests, replies, strict=True):
            assert isinstance(r, Reserve)
            try:
                if isinstance(reply, Exception):
                    raise reply
                item.value = store.reserved(r.path, r.reservation_id, reply)
            except Exception as exc:  # noqa: BLE001 - a script error is this call's
                item.error = exc

    @staticmethod
    def _deliver(batch: list[Item]) -> None:
        """Hand the results to their loops, one wake-up per loop."""
        by_loop: dict[asyncio.AbstractEventLoop, list[Item]] = {}
        for item in batch:
            by_loop.setdefault(item.loop, []).append(item)
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_resolve, items)
            except RuntimeError:  # the loop is closed: nobody waits any more
                log.debug("dropping %d results for a closed event loop", len(items))


def _key(store: Store, request: Work) -> str | None:
    """A key of the reserve's tree (the backend breaker finds its node by it)."""
    return store.ks.reservations(request.path.root) if isinstance(request, Reserve) else None


def _resolve(items: list[Item]) -> None:
    """On the caller's loop: mark the items done and resolve their futures."""
    for item in items:
        item.done = True
        if item.fut.done():
            continue
        if item.skipped:
            item.fut.cancel()
        elif item.error is not None:
            item.fut.set_exception(item.error)
        else:
            item.fut.set_result(item.value)
