"""Sessions of a process that exited (issue 23, item 11), with real processes and kernels:
``close()`` ends the process's sessions (record and kernel); a record whose kernel is gone
does not hold a place under the tenant's cap; reusing a path whose kernel was lost says
so (SandboxLostError) instead of handing out a fresh kernel silently."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from coordinator import Coordinator
from coordinator.sessions import (
    ExecutionSessionIdentity,
    LocalKernelProvider,
    SandboxLostError,
    SessionConfig,
    SessionManager,
)
from coordinator.sessions.providers._kernel import pid_alive
from coordinator.sessions.telemetry import SessionMetrics

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys
from coordinator import Coordinator
from coordinator.sessions import (ExecutionSessionIdentity, LocalKernelProvider,
                                  SessionConfig, SessionManager)
from tests.support.procs import TEST_KEYS
url, root, path, close = sys.argv[1:5]
coord = Coordinator.from_url(url, token_keys=TEST_KEYS)
sessions = SessionManager(coord, LocalKernelProvider(root),
                          SessionConfig(max_sessions_per_tenant=1))
me = ExecutionSessionIdentity(tenant_id="acme", conversation_id="c-1", path_id=path)
print(sessions.execute_code(me, "x = 41\\nx + 1").output.strip(), flush=True)
if close == "close":
    sessions.close()
    coord.close()
else:
    sys.stdin.read()  # wait to be killed, as a process that dies without closing
"""


def _who(path: str) -> ExecutionSessionIdentity:
    return ExecutionSessionIdentity(tenant_id="acme", conversation_id="c-1", path_id=path)


def _manager(coord: Coordinator, root: Path) -> SessionManager:
    return SessionManager(coord, LocalKernelProvider(root),
                          SessionConfig(max_sessions_per_tenant=1),
                          metrics=SessionMetrics(CollectorRegistry()))


def _script(redis_url: str, root: Path, path: str, close: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", SCRIPT, redis_url, str(root), path, close],
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def test_close_ends_the_sessions_of_the_process(coord: Coordinator, redis_url: str,
                                                short_tmp: Path) -> None:
    root = short_tmp / "kernels"
    script = _script(redis_url, root, "main", "close")
    out, _ = script.communicate(timeout=120)
    assert (script.returncode, out.strip()) == (0, "42")
    manager = _manager(coord, root)
    ended = manager.store.load(_who("main"))
    assert ended is not None and ended.status == "terminated"
    assert ended.terminated_reason == "closed"
    assert not pid_alive(int(ended.connection["pid"]), ended.connection["connection_file"])
    assert manager.store.list_active_for_tenant("acme") == []
    assert not manager.has_active(_who("main"))
    other = manager.execute_code(_who("other"), "1 + 1")  # the cap of 1 is free
    assert other.success and other.output.strip() == "2"
    manager.close()


def _die_without_closing(redis_url: str, root: Path, path: str) -> tuple[int, str]:
    """A process that ran code on ``path`` and was killed, its kernel killed too."""
    script = _script(redis_url, root, path, "stay")
    assert script.stdout is not None
    assert script.stdout.readline().strip() == "42"
    script.send_signal(signal.SIGKILL)
    script.wait(30)
    script.stdout.close()
    assert script.stdin is not None
    script.stdin.close()
    return script.pid, path


def test_a_dead_kernel_does_not_hold_a_place_under_the_cap(coord: Coordinator,
                                                           redis_url: str,
                                                           short_tmp: Path) -> None:
    root = short_tmp / "kernels"
    _die_without_closing(redis_url, root, "main")
    manager = _manager(coord, root)
    record = manager.store.load(_who("main"))
    assert record is not None and record.status == "active"  # nobody could say otherwise
    os.kill(int(record.connection["pid"]), signal.SIGKILL)  # its kernel is gone too
    time.sleep(0.2)
    other = manager.execute_code(_who("other"), "1 + 1")  # not TooManySessionsError
    assert other.success
    gone = manager.store.load(_who("main"))
    assert gone is not None and gone.status == "error" and "lost" in (gone.last_error or "")
    manager.close()


def test_a_path_whose_kernel_was_lost_says_so(coord: Coordinator, redis_url: str,
                                              short_tmp: Path) -> None:
    root = short_tmp / "kernels"
    _die_without_closing(redis_url, root, "main")
    manager = _manager(coord, root)
    record = manager.store.load(_who("main"))
    assert record is not None
    os.kill(int(record.connection["pid"]), signal.SIGKILL)
    time.sleep(0.2)
    with pytest.raises(SandboxLostError, match="next call starts a new one"):
        manager.execute_code(_who("main"), "x")
    marked = manager.store.load(_who("main"))
    assert marked is not None and marked.status == "error"
    fresh = manager.execute_code(_who("main"), "print('x' in dir())")
    assert fresh.success and fresh.output.strip() == "False"
    assert fresh.sandbox_id != record.sandbox_id
    manager.close()
    assert manager.store.load(_who("main")).status == "terminated"  # type: ignore[union-attr]
