"""Helpers for stall tests: pause a redis-server (SIGSTOP) from a timer thread that does
not depend on any event loop, and measure an event loop's lag with a heartbeat."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from dataclasses import dataclass, field

from coordinator.embedded import RedisServer


@dataclass
class Pause:
    """SIGSTOP ``server`` ``after_s`` from now for ``stall_s``, on its own thread."""

    server: RedisServer
    after_s: float
    stall_s: float
    stopped_at: float = 0.0
    resumed_at: float = 0.0
    done: threading.Event = field(default_factory=threading.Event)

    def start(self) -> Pause:
        threading.Thread(target=self._run, daemon=True).start()
        return self

    def _run(self) -> None:
        assert self.server.proc is not None
        pid = self.server.proc.pid
        time.sleep(self.after_s)
        os.kill(pid, signal.SIGSTOP)
        self.stopped_at = time.monotonic()
        try:
            time.sleep(self.stall_s)
        finally:
            os.kill(pid, signal.SIGCONT)
            self.resumed_at = time.monotonic()
            self.done.set()

    def during(self, t: float) -> bool:
        """True when ``t`` falls while the server was stopped."""
        return 0 < self.stopped_at <= t and (not self.resumed_at or t < self.resumed_at)


class Heartbeat:
    """A coroutine that wakes every ``period_s``; ``worst`` is the largest lateness seen
    (how long the loop could not run anything)."""

    def __init__(self, period_s: float = 0.005) -> None:
        self.period_s = period_s
        self.worst = 0.0
        self._stop = False

    async def run(self) -> None:
        while not self._stop:
            start = time.monotonic()
            await asyncio.sleep(self.period_s)
            self.worst = max(self.worst, time.monotonic() - start - self.period_s)

    def stop(self) -> None:
        self._stop = True
