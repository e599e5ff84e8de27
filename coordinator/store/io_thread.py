"""The I/O thread: one per store and process, it runs the Redis work of async callers off
their event loop. Every reserve queued while it was busy goes out in one pipelined round
trip (with the queued writes), so the reserves of concurrent coroutines overlap instead of
queuing; other requests run one after another."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from .health import BackendDown, is_stall
from .requests import Blocking, Request, Reserve
from .tree import Store

log = logging.getLogger("coordinator")


class IOThread:
    """Runs requests on a background thread; ``submit`` returns a future of the result.

    ``allow`` says whether Redis may be tried now (the backend breaker): when it does not,
    reserves fail at once with :class:`BackendDown`; ``failed`` hears every stall."""

    def __init__(self, store: Store, allow: Callable[[], bool],
                 failed: Callable[[BaseException], None]) -> None:
        self._store = store
        self._allow = allow
        self._failed = failed
        self._cond = threading.Condition()
        self._queue: list[tuple[Request, Future[Any]]] = []
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._closed = False

    def submit(self, request: Request) -> Future[Any]:
        """Queue ``request``; the future gets its result (or its error)."""
        fut: Future[Any] = Future()
        with self._cond:
            if self._thread is None or self._closed or self._pid != os.getpid():
                # first use, after close, or forked (the parent's thread is not ours)
                self._queue, self._pid, self._closed = [], os.getpid(), False
                self._thread = threading.Thread(target=self._run, name="budget-io",
                                                daemon=True)
                self._thread.start()
            self._queue.append((request, fut))
            self._cond.notify()
        return fut

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
            for request, fut in batch:
                if not fut.set_running_or_notify_cancel():
                    continue
                if isinstance(request, Reserve):
                    reserves.append((request, fut))
                else:
                    self._run_one(request, fut)
            if reserves:
                self._reserve_all(reserves)

    def _run_one(self, request: Blocking, fut: Future[Any]) -> None:
        try:
            result = request.fn()
        except BaseException as exc:  # noqa: BLE001 - the waiting caller gets it
            if is_stall(exc):
                self._failed(exc)
            fut.set_exception(exc)
        else:
            fut.set_result(result)

    def _reserve_all(self, reserves: list[tuple[Reserve, Future[Any]]]) -> None:
        """The reserves in one round trip; each future gets its own reply."""
        store = self._store
        if not self._allow():
            for _, fut in reserves:
                fut.set_exception(BackendDown())
            return
        ops = [store.reserve_op(r.path, r.reservation_id, r.amounts, r.keyed)
               for r, _ in reserves]
        try:
            replies = store.wire.round_trip(ops)
        except BaseException as exc:  # noqa: BLE001 - every waiting caller gets it
            if is_stall(exc):
                self._failed(exc)
            for _, fut in reserves:
                fut.set_exception(exc)
            return
        for (r, fut), reply in zip(reserves, replies, strict=True):
            try:
                if isinstance(reply, Exception):
                    raise reply
                fut.set_result(store.reserved(r.path, r.reservation_id, reply))
            except Exception as exc:  # noqa: BLE001 - a script error is this call's
                fut.set_exception(exc)
