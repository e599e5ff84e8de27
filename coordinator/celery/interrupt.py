"""Interrupting a running task body when its context is stopped from another process.

The core's stop listener (a thread) cancels the context's token; the callback armed here
then raises :class:`TaskInterrupted` in the thread running the body:

* in the main thread (prefork and solo pools) by sending it a signal whose handler
  raises; the signal also ends a blocking ``time.sleep`` or system call at once;
* in another thread (threads pool) with ``PyThreadState_SetAsyncExc``, which stops a
  Python loop at its next bytecode; a call blocked in C there is not interrupted, so such
  tasks poll or wait on their cancellation token (which is set at the same moment).

An interrupt is delivered at most once per task, and only while the body runs.
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
from types import FrameType
from typing import Any

from coordinator.context.cancellation import CancellationToken
from coordinator.core.vocabulary import StopReason

from .errors import TaskInterrupted

# SIGUSR1 is billiard's soft time limit in prefork children; SIGUSR2 is free unless
# Celery's remote debugger is enabled (CELERY_RDBSIG), so it is the default.
INTERRUPT_SIGNAL = int(os.environ.get("BUDGET_INTERRUPT_SIGNAL") or signal.SIGUSR2)

_main_armed: Armed | None = None
_installed_in_pid = 0
_previous_handler: Any = None


def _handler(signum: int, frame: FrameType | None) -> None:
    armed = _main_armed
    if armed is not None and armed.take():
        raise TaskInterrupted(armed.reason)
    if callable(_previous_handler):
        _previous_handler(signum, frame)


def _ensure_handler() -> None:
    global _installed_in_pid, _previous_handler
    if _installed_in_pid == os.getpid():
        return
    previous = signal.signal(INTERRUPT_SIGNAL, _handler)
    if previous is not _handler:
        _previous_handler = previous
    _installed_in_pid = os.getpid()


def _set_async_exc(thread_id: int, exc: type[BaseException] | None) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exc) if exc is not None else None
    )


class Armed:
    """The interrupt of one running task body; :meth:`disarm` when the body is over."""

    def __init__(self, token: CancellationToken) -> None:
        self.thread_id = threading.get_ident()
        self.in_main = threading.current_thread() is threading.main_thread()
        self.reason: str = StopReason.ABORTED
        self._lock = threading.Lock()
        self._active = True
        self._sent = False
        self._raised = False
        if self.in_main:
            global _main_armed
            _ensure_handler()
            _main_armed = self
        self._unhook = token.on_cancel(self._deliver)

    def take(self) -> bool:
        """True once, for the signal handler, if an interrupt is due now."""
        with self._lock:
            if self._active and self._sent and not self._raised:
                self._raised = True
                return True
            return False

    def _deliver(self, reason: str) -> None:
        with self._lock:
            if not self._active or self._sent:
                return
            self._sent = True
            self.reason = reason or StopReason.ABORTED
            if self.in_main:
                signal.pthread_kill(self.thread_id, INTERRUPT_SIGNAL)
            else:
                _set_async_exc(self.thread_id, TaskInterrupted)

    def disarm(self) -> None:
        """Stop interrupting: the body is over (a pending async exception is cleared)."""
        self._unhook()
        with self._lock:
            self._active = False
            if self._sent and not self.in_main:
                _set_async_exc(self.thread_id, None)
        if self.in_main:
            global _main_armed
            if _main_armed is self:
                _main_armed = None
