"""The backend breaker: a Coordinator's view of its Redis's health. After a stall (a
timeout or connection error) calls fail closed at once instead of each waiting a socket
timeout, while one background probe pings Redis every probe interval; the first answer
lets calls flow again."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from ..store.health import is_stall

log = logging.getLogger("coordinator")


class BackendHealth:
    """Closed (calls go to Redis) or open (calls fail fast; a probe thread runs)."""

    def __init__(self, probe: Callable[[], None], probe_interval_s: float) -> None:
        self._probe = probe
        self.probe_interval_s = probe_interval_s
        self._down = False
        self._down_since = 0.0
        self._lock = threading.Lock()
        self._probe_pid = 0
        self._closed = threading.Event()

    @property
    def down(self) -> bool:
        """True while calls fail fast (Redis stalled and no probe has answered since)."""
        return self._down

    def allow(self) -> bool:
        """Whether a call may go to Redis now (the hot path reads this on every call)."""
        if not self._down:
            return True
        if self._probe_pid != os.getpid():  # forked while open: this process needs a probe
            self._start_probe()
        return False

    def failed(self, exc: BaseException) -> None:
        """Redis did not answer a call: open, unless already open (or not a stall)."""
        if not is_stall(exc) or self._down:
            return
        with self._lock:
            if self._down:
                return
            self._down, self._down_since = True, time.monotonic()
        log.warning("Redis stalled (%s): failing calls closed at once, probing every "
                    "%.3f s", exc, self.probe_interval_s)
        self._start_probe()

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
        """Ping at a fixed rate (a ping that times out does not push the next one back)
        until Redis answers."""
        next_at = time.monotonic() + self.probe_interval_s
        while not self._closed.wait(max(0.0, next_at - time.monotonic())):
            next_at += self.probe_interval_s
            try:
                self._probe()
            except Exception as exc:  # noqa: BLE001 - any failure means still down
                log.debug("backend probe failed: %s", exc)
                continue
            with self._lock:
                self._down, self._probe_pid = False, 0
            log.warning("Redis answers again after %.1f s: calls flow again",
                        time.monotonic() - self._down_since)
            return
