"""CancellationToken: a thread-safe flag that running work polls or awaits, set when its
context (or any ancestor, in any process) is aborted or times out."""

from __future__ import annotations

import threading
from collections.abc import Callable

from ..errors import BudgetCoordinatorError


class CancelledByContext(BudgetCoordinatorError):
    """Raised by :meth:`CancellationToken.raise_if_cancelled` once the token is set."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"cancelled: {reason}")


class CancellationToken:
    """Set once, never cleared. Children are set when their parent is."""

    def __init__(self, parent: CancellationToken | None = None) -> None:
        self._lock = threading.Lock()
        self._set = False
        self._reason: str | None = None
        self._event: threading.Event | None = None  # made by the first wait()
        self._callbacks: list[Callable[[str], None]] = []
        self._detach: Callable[[], None] = lambda: None
        if parent is not None:
            self._detach = parent.on_cancel(self.cancel)

    @property
    def cancelled(self) -> bool:
        """True once cancelled."""
        return self._set

    @property
    def reason(self) -> str | None:
        """Why it was cancelled (``aborted``, ``timeout``), or None."""
        return self._reason

    def cancel(self, reason: str) -> None:
        """Set the token and run the callbacks (once; later calls do nothing)."""
        with self._lock:
            if self._set:
                return
            self._reason = reason
            self._set = True
            if self._event is not None:
                self._event.set()
            callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            cb(reason)

    def on_cancel(self, callback: Callable[[str], None]) -> Callable[[], None]:
        """Run ``callback(reason)`` on cancellation (at once if already cancelled).
        Returns a function that unregisters it."""
        with self._lock:
            if not self._set:
                self._callbacks.append(callback)
                return lambda: self._discard(callback)
        callback(self._reason or "")
        return lambda: None

    def _discard(self, callback: Callable[[str], None]) -> None:
        with self._lock:
            if callback in self._callbacks:
                self._callbacks.remove(callback)

    def detach(self) -> None:
        """Stop following the parent token (call when the work it guarded is over)."""
        self._detach()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until cancelled or ``timeout`` seconds passed; True if cancelled."""
        with self._lock:
            if self._set:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout)

    def raise_if_cancelled(self) -> None:
        """Raise :class:`CancelledByContext` if cancelled (for polling loops)."""
        if self._set:
            raise CancelledByContext(self._reason or "cancelled")
