"""Live updates: one Redis subscription and one poll per dashboard process, fanned out
to every browser's server-sent event stream.

The subscription hears stops (``bc:abort``), ledger updates, alerts and the trees the
indexer has just placed in its indexes (so an overview refreshes when a new tree can be
listed); the poll (every ``tick_s``) re-reads the roots that some open page shows, once
for all the pages that show them, and reports the ones that changed (a settle of a
cost-only call publishes nothing)."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..store.dashboard_reads import BACKEND_ERRORS, DashboardReads

log = logging.getLogger("coordinator.dashboard.live")

ANSWER_S = 2.0
"""The feed is alive while Redis answered one of its reads (every ``tick_s``) within this
long, plus ``tick_s``: a read held by a stalled Redis (its socket timeout) or by the
client's retries cannot keep it alive, so a page says "disconnected" within about
this plus a status interval (api.py) of Redis going away."""


@dataclass(eq=False)
class Listener:
    """One browser's stream: what it watches, and its queue on its event loop."""

    tenant: str
    roots: frozenset[str]
    loop: asyncio.AbstractEventLoop
    overview: bool = False
    """An overview page: it also wants to hear of trees just opened."""
    primed: bool = False
    """Told to refresh once after the poll's first reading of its roots: whatever
    changed between the page's render and that reading is shown, and every change
    after it is reported (the first reading is never a silent baseline)."""
    queue: asyncio.Queue[dict[str, Any] | None] = field(
        default_factory=lambda: asyncio.Queue(maxsize=256))

    def wants(self, msg: Mapping[str, Any]) -> bool:
        if msg.get("tenant") != self.tenant:
            return False
        if msg.get("type") == "new":
            return self.overview
        return bool(set(msg.get("roots", ())) & self.roots)

    def push(self, msg: dict[str, Any] | None) -> None:
        def put() -> None:
            if self.queue.full():
                return  # a stalled browser loses updates, not the process's memory
            self.queue.put_nowait(msg)
        self.loop.call_soon_threadsafe(put)


class Live:
    """The process's live feed (a daemon thread)."""

    def __init__(self, views: Mapping[str, DashboardReads], *, tick_s: float = 0.5,
                 on_change: Callable[[str, str], None] | None = None) -> None:
        """``on_change(tenant, root)`` is called for each tree an event names."""
        self.views = dict(views)
        self.tick_s = tick_s
        self.on_change = on_change
        self.messages = 0
        self._connected = False
        self._answered = 0.0
        """When Redis last answered the feed (monotonic s)."""
        self._listeners: set[Listener] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._last: dict[tuple[str, str], tuple[str, ...]] = {}
        self._channels = {ch: t for t, v in self.views.items() for ch in v.channels()}
        self._thread = threading.Thread(target=self._run, name="budget-dashboard-live",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            listener.push(None)

    def add(self, listener: Listener) -> None:
        with self._lock:
            self._listeners.add(listener)

    def remove(self, listener: Listener) -> None:
        with self._lock:
            self._listeners.discard(listener)

    @property
    def alive(self) -> bool:
        """Subscribed, and Redis answered within ANSWER_S (plus a tick)."""
        return self._connected and time.monotonic() - self._answered < ANSWER_S + self.tick_s

    @property
    def listeners(self) -> int:
        return len(self._listeners)

    def publish(self, msg: dict[str, Any]) -> None:
        """Send ``msg`` to the streams it concerns, stamped ``at`` (Unix ms: a page's
        refresh asks for a read begun after it)."""
        msg.setdefault("at", time.time() * 1000)
        with self._lock:
            targets = [li for li in self._listeners if li.wants(msg)]
        for listener in targets:
            listener.push(msg)
        if self.on_change is not None and msg.get("type") != "new":
            for root in msg.get("roots", ()):
                self.on_change(str(msg["tenant"]), str(root))

    # -- the thread ----------------------------------------------------------------------

    def _run(self) -> None:
        backoff = 0.2
        any_views = next(iter(self.views.values()))
        while not self._stop.is_set():
            sub = None
            try:
                sub = any_views.subscribe(self._channels)
                self._connected, self._answered, backoff = True, time.monotonic(), 0.2
                next_tick = 0.0
                while not self._stop.is_set():
                    got = sub.get(timeout=min(self.tick_s, 0.2))
                    if got is not None:
                        self._on_message(*got)
                    if time.monotonic() >= next_tick:
                        self._poll()
                        self._answered = time.monotonic()
                        next_tick = self._answered + self.tick_s
            except BACKEND_ERRORS as exc:
                self._connected = False
                log.warning("live feed: Redis unavailable (%s); retrying", exc)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
            finally:
                if sub is not None:
                    sub.close()
        self._connected = False

    def _on_message(self, channel: str, data: str) -> None:
        tenant = self._channels.get(channel)
        if tenant is None:
            return
        try:
            msg = json.loads(data)
            if channel.endswith(":dash:index"):  # the indexer placed trees just opened
                self.publish({"type": "new", "tenant": tenant,
                              "roots": [str(r) for r in msg["roots"]][:100]})
                return
            root = str(msg["root"])
        except (ValueError, KeyError, TypeError):
            return
        self.messages += 1
        kind = "alert" if channel.endswith(":alerts") else (
            "stop" if channel.endswith(":abort") else "ledger")
        out: dict[str, Any] = {"type": kind, "tenant": tenant, "roots": [root]}
        if kind == "stop":
            out.update(context=str(msg.get("id", "")), reason=str(msg.get("reason", "")))
        elif kind == "alert":
            out.update(message=str(msg.get("message", "")), threshold=msg.get("threshold"))
        self.publish(out)

    def _poll(self) -> None:
        """Re-read the watched roots (a PING for a tenant with none: every poll is an
        answer from Redis, or an error) and report the changed ones."""
        with self._lock:
            watched: dict[str, set[str]] = {}
            for li in self._listeners:
                watched.setdefault(li.tenant, set()).update(li.roots)
            unprimed = [li for li in self._listeners if not li.primed]
        began = time.time() * 1000
        for tenant, views in self.views.items():
            roots = sorted(watched.get(tenant, ()))
            if not roots:
                views.ping()
            else:
                hashes, _ = views.root_hashes(roots)
                changed = []
                for root, h in zip(roots, hashes, strict=True):
                    sig = tuple(h.get(f, "") for f in ("u:usd", "h:usd", "status", "u:steps",
                                                       "u:tin", "u:tout", "u:retries"))
                    if self._last.get((tenant, root), sig) != sig:
                        changed.append(root)
                    self._last[(tenant, root)] = sig
                if changed:
                    self.publish({"type": "change", "tenant": tenant, "roots": changed,
                                  "at": began})
            self._last = {k: v for k, v in self._last.items()
                          if k[0] != tenant or k[1] in watched.get(tenant, ())}
        for li in unprimed:  # their roots were read after they connected: refresh once
            li.primed = True
            li.push({"type": "change", "tenant": li.tenant, "roots": sorted(li.roots),
                     "at": began})
