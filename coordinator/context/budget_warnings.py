"""The budget warnings a handle hears (``ExecutionContext.on_warning``): a level of its
path reached a ``warn_at`` threshold (lib/warnings.lua records it once and broadcasts it
on the abort channel; the stop listener hands it to every handle under the level, and
reads back, when it subscribes, those recorded while it was not listening)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Protocol

from ..core.paths import Path
from ..models_records import BudgetWarning
from ..store.errors import UNAVAILABLE
from ..store.tree import Store
from ..store.warnings_read import read_warnings

log = logging.getLogger("coordinator")

WarningCallback = Callable[[BudgetWarning], object]


def _key(warning: BudgetWarning) -> tuple[str, str, float]:
    return warning.chain_id, warning.dimension, warning.threshold


class WarningHub:
    """One handle's warning callbacks, and the warnings it heard: each callback is called
    once per level, dimension and threshold."""

    def __init__(self) -> None:
        self._callbacks: list[WarningCallback] = []
        self._heard: set[tuple[str, str, float]] = set()
        self._lock = threading.Lock()

    def add(self, callback: WarningCallback, recorded: Sequence[BudgetWarning] = ()) -> None:
        """Register ``callback`` and call it with ``recorded``, the warnings the path has
        recorded already (the callbacks registered before it get those they missed)."""
        with self._lock:
            missed = [w for w in recorded if _key(w) not in self._heard]
            self._heard.update(_key(w) for w in recorded)
            others = list(self._callbacks)
            self._callbacks.append(callback)
        for warning in recorded:
            _call(callback, warning)
        for warning in missed:
            for other in others:
                _call(other, warning)

    def hear(self, warning: BudgetWarning) -> None:
        """Call every callback with ``warning``, unless this handle heard it already."""
        with self._lock:
            if _key(warning) in self._heard:
                return
            self._heard.add(_key(warning))
            callbacks = list(self._callbacks)
        for callback in callbacks:
            _call(callback, warning)


def _call(callback: WarningCallback, warning: BudgetWarning) -> None:
    """A callback that raises is logged: the others are called all the same."""
    try:
        callback(warning)
    except Exception:  # a user's callback must not end the listener  # noqa: BLE001
        log.exception("budget warning callback %r raised", callback)


class HearsWarnings(Protocol):
    """What on_warning needs of a handle's state (a ContextState)."""

    warnings: WarningHub | None
    path: Path
    store: Store

    def is_open(self) -> bool:
        """Whether the context is open in Redis."""


_creating = threading.Lock()


def on_warning(state: HearsWarnings, callback: WarningCallback) -> None:
    """Register ``callback`` for the warnings ``state``'s handle hears, called at once
    with those its path has recorded already (read after this process's queued writes;
    none while Redis is unreachable)."""
    if not callable(callback):
        raise TypeError(f"on_warning takes a callable; got {callback!r}")
    with _creating:
        if state.warnings is None:
            state.warnings = WarningHub()
        hub = state.warnings
    recorded: list[BudgetWarning] = []
    if state.is_open():
        try:  # after this process's queued settles: it hears what it spent
            state.store.flush(state.path.root)
            recorded = read_warnings(state.store, [state.path])[0]
        except UNAVAILABLE as exc:
            log.debug("budget warnings not read back: %s", exc)
    hub.add(callback, recorded)
