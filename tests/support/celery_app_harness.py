"""Real Celery worker subprocesses for the integration tests and the benchmarks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from celery import Celery

ROOT = Path(__file__).resolve().parents[2]
TOKEN_KEYS = "test:test-secret-0123456789abcdef"


class Workers:
    """``count`` ``celery worker`` processes of ``app_module`` on one queue."""

    def __init__(self, app: Celery, app_module: str, env: dict[str, str], *, count: int = 2,
                 pool: str = "prefork", concurrency: int = 2) -> None:
        self.app = app
        self.app_module = app_module
        self.env = {**os.environ, **env, "PYTHONPATH": str(ROOT)}
        self.count = count
        self.pool = pool
        self.concurrency = concurrency
        self.names = [f"w{i}-{uuid.uuid4().hex[:8]}@bc" for i in range(count)]
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, timeout: float = 60.0) -> Workers:
        """Start the workers and wait until each answers a ping."""
        for name in self.names:
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", self.app_module, "worker",
                 "-P", self.pool, "-c", str(self.concurrency), "-n", name,
                 "-Q", self.env["BC_QUEUE"], "-l", "WARNING",
                 "--without-gossip", "--without-mingle", "--without-heartbeat"],
                env=self.env, cwd=ROOT, start_new_session=True,
                stdout=subprocess.DEVNULL,
            ))
        deadline = time.monotonic() + timeout
        waiting = set(self.names)
        while waiting:
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"celery workers did not start: {sorted(waiting)}")
            for p in self.procs:
                if p.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"a celery worker exited with {p.returncode}")
            for reply in self.app.control.ping(destination=sorted(waiting), timeout=0.5):
                waiting -= set(reply)
        return self

    def stop(self) -> None:
        """Cold shutdown (running tasks are not waited for), then SIGKILL."""
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGQUIT)
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
            else:
                try:  # pool children left behind by a cold shutdown
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.procs = []

    def __enter__(self) -> Workers:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
