"""The backend breaker: a Coordinator's view of its Redis's health, per node (one on a
single server or Sentinel, one per primary on a Cluster). Once a node is known down, the
calls whose key it serves fail closed at once instead of each waiting a socket timeout,
while one background probe follows it every probe interval; calls on other nodes go on.

A node is known down on evidence, not on one slow reply: a connection error (refused,
reset, closed) opens its breaker at once; timeouts open it only when
``TIMEOUTS_TO_OPEN`` calls in a row timed out (any call's answer in between ends the
streak). The first call of a streak sends its reserve once more before it reports its
timeout; the others of the streak do not (see ``timing_out``), so that a stall decides
every call within about one hot-path timeout once the streak began."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from ..store.errors import failed_node
from ..store.health import BackendDown, is_stall, is_timeout

T = TypeVar("T")

log = logging.getLogger("coordinator")

TIMEOUTS_TO_OPEN = 2
"""Calls in a row that timed out (each after its one retry, when it had time for one)
before a node counts as down: one slow reply on a loaded machine is not an outage."""


def _one_node(key: str | None) -> str:
    return ""


class BackendHealth:
    """Per node: closed (calls go to Redis) or open (its calls fail fast; probed).

    ``probe(node)`` raises while ``node`` is down (on a Cluster it re-learns the slot map
    first, and succeeds once the node's slots moved to a new primary); ``node_of(key)``
    names the node that serves ``key`` ('' for the only one, or without a key)."""

    def __init__(self, probe: Callable[[str], None], probe_interval_s: float,
                 node_of: Callable[[str | None], str] = _one_node) -> None:
        self._probe = probe
        self._node_of = node_of
        self.probe_interval_s = probe_interval_s
        self._down: dict[str, float] = {}  # node -> since when (monotonic)
        self._timeouts: dict[str, int] = {}  # node -> calls in a row that timed out
        self._lock = threading.Lock()
        self._probe_pid = 0
        self._closed = threading.Event()

    @property
    def down(self) -> bool:
        """True while some node is known down (its calls fail fast)."""
        return bool(self._down)

    def down_nodes(self) -> list[str]:
        """The nodes known down now ('' is a single server's)."""
        return list(self._down)

    def allow(self, key: str | None = None) -> bool:
        """Whether a call on ``key`` (any key of its tree) may go to Redis now: false
        while the node serving it is known down. The hot path reads this on every call."""
        if not self._down:
            return True
        if self._node_of(key) not in self._down:
            return True
        if self._probe_pid != os.getpid():  # forked while open: this process needs a probe
            self._start_probe()
        return False

    def timing_out(self, key: str | None = None) -> bool:
        """Whether the node serving ``key`` is in a streak of timeouts (not yet taken for
        a stall): a call on it should not spend a second hot-path timeout resending."""
        return bool(self._timeouts) and self._node_of(key) in self._timeouts

    def succeeded(self, key: str | None = None) -> None:
        """A call on ``key`` got its answer: timeouts before it were not an outage."""
        if self._timeouts:
            self._timeouts.pop(self._node_of(key), None)

    def failed(self, exc: BaseException, key: str | None = None) -> None:
        """A call on ``key`` got no answer (``exc``): open the breaker of the node that
        failed (the node the error names, else the one serving ``key``) on evidence."""
        if not is_stall(exc):
            return
        named = failed_node(exc)
        node = named if named is not None else self._node_of(key)
        if node in self._down:
            return
        with self._lock:
            if node in self._down:
                return
            if is_timeout(exc):
                count = self._timeouts[node] = self._timeouts.get(node, 0) + 1
                if count < TIMEOUTS_TO_OPEN:
                    log.info("Redis%s timed out (%s): %d of %d timeouts in a row before "
                             "failing its calls closed", _named(node), exc, count,
                             TIMEOUTS_TO_OPEN)
                    return
            self._timeouts.pop(node, None)
            self._down[node] = time.monotonic()
        log.warning("Redis%s stalled (%s): failing its calls closed at once, probing "
                    "every %.3f s", _named(node), exc, self.probe_interval_s)
        self._start_probe()

    def guard(self, fn: Callable[[], T], key: str | None = None) -> T:
        """Run ``fn`` (work on ``key``'s node that waits on Redis off the hot path: an
        open, an attach, a snapshot) under the breaker: while the node is down, raise
        :class:`BackendDown` at once instead of waiting a timeout (such work queues
        behind one another on the I/O thread); what ``fn`` meets counts as evidence for
        every caller, so the second timeout in a row opens the breaker."""
        if not self.allow(key):
            raise BackendDown()
        try:
            value = fn()
        except BaseException as exc:
            self.failed(exc, key)
            raise
        self.succeeded(key)
        return value

    def close(self) -> None:
        """Stop probing (the coordinator is closing)."""
        self._closed.set()

    def _start_probe(self) -> None:
        with self._lock:
            if self._probe_pid == os.getpid():
                return
            self._probe_pid = os.getpid()
        threading.Thread(target=self._probe_loop, name="budget-backend-probe",
                         daemon=True).start()

    def _probe_loop(self) -> None:
        """Probe every node known down at a fixed rate (a probe that times out does not
        push the next one back) until none is."""
        next_at = time.monotonic() + self.probe_interval_s
        while not self._closed.wait(max(0.0, next_at - time.monotonic())):
            next_at += self.probe_interval_s
            for node in list(self._down):
                try:
                    self._probe(node)
                except Exception as exc:  # noqa: BLE001 - any failure means still down
                    log.debug("backend probe of %r failed: %s", node, exc)
                    continue
                with self._lock:
                    since = self._down.pop(node, time.monotonic())
                log.warning("Redis%s answers again after %.1f s: its calls flow again",
                            _named(node), time.monotonic() - since)
            with self._lock:
                if not self._down:
                    self._probe_pid = 0
                    return


def _named(node: str) -> str:
    return f" node {node}" if node else ""
