"""The stop listener: a background thread that hears the stops broadcast on the tenant's
abort channel and applies them to this process's contexts in the tree they concern, and
the lifts of ceiling stops (an operator raised a limit: set_limits.lua) and the budget
warnings (a warn_at threshold reached: lib/warnings.lua) likewise."""

from __future__ import annotations

import json
import logging
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from ..core.paths import Path
from ..core.vocabulary import CEILING_REASONS
from ..models_records import BudgetWarning
from ..store.channels import StopSubscription
from ..store.errors import RedisError

log = logging.getLogger("coordinator")


class StopTarget(Protocol):
    """What the listener needs of a local context handle."""

    @property
    def tree_path(self) -> Path:
        """Where the context sits."""

    def handle_stop(self, reason: str) -> None:
        """The context, or a level above it, was stopped for ``reason``."""


class StopListener:
    """Tracks local contexts (weakly) and runs the listening thread."""

    def __init__(self, subscribe: Callable[[], StopSubscription],
                 read_stops: Callable[[Sequence[Path]], list[list[str]]],
                 read_warnings: Callable[[Sequence[Path]], list[list[BudgetWarning]]]
                 | None = None) -> None:
        self._subscribe = subscribe
        self._read_stops = read_stops
        self._read_warnings = read_warnings
        self._targets: weakref.WeakSet[Any] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False

    def add(self, target: StopTarget) -> None:
        with self._lock:
            self._targets.add(target)

    def discard(self, target: StopTarget) -> None:
        with self._lock:
            self._targets.discard(target)

    def start(self) -> None:
        self._closed = False
        self._thread = threading.Thread(target=self._listen, name="budget-stop-listener",
                                        daemon=True)
        self._thread.start()

    def stop(self, wake: Callable[[], None]) -> None:
        """End the thread: ``wake`` publishes on the channel to end its blocking read."""
        self._closed = True
        if self._thread is not None and self._thread is not threading.current_thread():
            try:
                wake()
            except RedisError:
                pass
            self._thread.join(timeout=2)

    def _targets_now(self) -> list[StopTarget]:
        with self._lock:
            return list(self._targets)

    def _listen(self) -> None:
        backoff = 0.1
        while not self._closed:
            sub = self._subscribe()
            try:
                sub.subscribe()
                self._resync()
                backoff = 0.1
                while not self._closed:
                    data = sub.poll(timeout=0.5)
                    if data is not None:
                        self.on_message(data)
            except Exception as exc:  # the listener must outlive any broken connection  # noqa: BLE001
                if not self._closed:
                    log.debug("stop listener reconnecting: %s", exc)
                    time.sleep(backoff)
                    backoff = min(backoff * 2, 2.0)
            finally:
                try:
                    sub.close()
                except Exception:  # noqa: BLE001 - closing a broken connection
                    pass

    def on_message(self, data: Any) -> None:
        """Apply one broadcast stop (JSON ``{root, id, reason}``), change of limits
        (``{root, id, lifted: [reason...]}``, set_limits.lua) or budget warning (``{root,
        id, warning, dim, remaining: {usd, steps}}``, lib/warnings.lua) to the contexts
        under it."""
        try:
            msg = json.loads(data)
            root, ctx_id = str(msg["root"]), str(msg["id"])
            if "lifted" in msg:
                self.lifted(root, ctx_id, tuple(str(r) for r in msg["lifted"] or ()))
                return
            if "warning" in msg:
                left = msg.get("remaining") or {}
                self.warned(root, BudgetWarning(
                    chain_id=ctx_id, threshold=msg["warning"], dimension=msg["dim"],
                    remaining_usd=left.get("usd"), remaining_steps=left.get("steps")))
                return
            reason = str(msg["reason"])
        except (TypeError, ValueError, KeyError, AttributeError):
            return
        for target in self._targets_now():
            path = target.tree_path
            if path.root == root and ctx_id in path.ids:
                target.handle_stop(reason)

    def lifted(self, root: str, ctx_id: str, reasons: Sequence[str]) -> None:
        """The stops ``reasons`` of context ``ctx_id`` were lifted: the contexts under it
        that have a ``handle_lift(reasons)`` (a handle's state) forget them."""
        if reasons:
            for target in self._targets_now():
                path = target.tree_path
                if path.root == root and ctx_id in path.ids:
                    _lift(target, frozenset(reasons))

    def warned(self, root: str, warning: BudgetWarning) -> None:
        """A level reached a warn_at threshold: the contexts under it that have a
        ``handle_warning(warning)`` (a handle's state) hear it."""
        for target in self._targets_now():
            path = target.tree_path
            if path.root == root and warning.chain_id in path.ids:
                handle_warning = getattr(target, "handle_warning", None)
                if handle_warning is not None:
                    handle_warning(warning)

    def _resync(self) -> None:
        """After (re)subscribing, read the stop state of every local context, and the
        warnings recorded on the path of each that listens for them: a message missed
        while disconnected loses nothing."""
        targets = self._targets_now()
        if not targets:
            return
        for target, reasons in zip(targets, self._read_stops([t.tree_path for t in targets]),
                                   strict=True):
            for reason in reasons:
                target.handle_stop(reason)
            _lift(target, CEILING_REASONS.difference(reasons))
        hearing = [t for t in targets if getattr(t, "warnings", None) is not None]
        if hearing and self._read_warnings is not None:
            for target, warnings in zip(hearing, self._read_warnings(
                    [t.tree_path for t in hearing]), strict=True):
                for warning in warnings:
                    target.handle_warning(warning)  # type: ignore[attr-defined]


def _lift(target: StopTarget, reasons: frozenset[str]) -> None:
    """Tell ``target`` the stops ``reasons`` above it were lifted, if it listens for that
    (a handle's state and a lease slice do)."""
    handle_lift = getattr(target, "handle_lift", None)
    if handle_lift is not None and reasons:
        handle_lift(reasons)
