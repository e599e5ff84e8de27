"""The budget warnings a handle hears (``ExecutionContext.on_warning``): a level of its
path reached a ``warn_at`` threshold (lib/warnings.lua records it once and broadcasts it
on the abort channel; the stop listener hands it to every handle under the level)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Protocol

from ..models_records import BudgetWarning

log = logging.getLogger("coordinator")

WarningCallback = Callable[[BudgetWarning], object]


class WarningHub:
    """One handle's warning callbacks, and the warnings it heard (each heard once)."""

    def __init__(self) -> None:
        self._callbacks: list[WarningCallback] = []
        self._heard: set[tuple[str, str, float]] = set()
        self._lock = threading.Lock()

    def add(self, callback: WarningCallback) -> None:
        with self._lock:
            self._callbacks.append(callback)

    def hear(self, warning: BudgetWarning) -> None:
        """Call every callback with ``warning``, unless this handle heard it already (the
        same level, dimension and threshold). A callback that raises is logged; the
        others are called all the same."""
        key = (warning.chain_id, warning.dimension, warning.threshold)
        with self._lock:
            if key in self._heard:
                return
            self._heard.add(key)
            callbacks = list(self._callbacks)
        for callback in callbacks:
            try:
                callback(warning)
            except Exception:  # a user's callback must not end the listener  # noqa: BLE001
                log.exception("budget warning callback %r raised", callback)


class HearsWarnings(Protocol):
    """What holds a handle's hub (its ContextState)."""

    warnings: WarningHub | None


_creating = threading.Lock()


def on_warning(state: HearsWarnings, callback: WarningCallback) -> None:
    """Register ``callback`` for the warnings ``state``'s handle hears."""
    if not callable(callback):
        raise TypeError(f"on_warning takes a callable; got {callback!r}")
    with _creating:
        if state.warnings is None:
            state.warnings = WarningHub()
        hub = state.warnings
    hub.add(callback)
