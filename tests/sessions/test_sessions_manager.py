"""SessionManager with real Jupyter kernels and a real Redis: lazy creation, reuse with
state continuity, branch isolation, path events, timeouts, rotation, expiry, loss."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from coordinator import Coordinator
from coordinator.sessions import (
    ExecutionSessionIdentity,
    LocalKernelProvider,
    SandboxElsewhereError,
    SandboxLostError,
    SessionConfig,
    SessionManager,
)
from coordinator.sessions.manager import info_of
from coordinator.sessions.telemetry import SessionMetrics


def ident(path: str = "main", conv: str = "conv-1", tenant: str = "acme"
          ) -> ExecutionSessionIdentity:
    return ExecutionSessionIdentity(tenant_id=tenant, conversation_id=conv, path_id=path)


def make_manager(coord: Coordinator, root: Path, **config: object) -> SessionManager:
    return SessionManager(coord, LocalKernelProvider(root), SessionConfig(**config),
                          metrics=SessionMetrics(CollectorRegistry()))


@pytest.fixture
def manager(coord: Coordinator, short_tmp: Path) -> Iterator[SessionManager]:
    m = make_manager(coord, short_tmp / "kernels", execution_timeout_ms=1500,
                     max_output_chars=200)
    yield m
    m.close()


def test_lazy_reuse_branch_isolation_and_path_events(manager: SessionManager) -> None:
    main, branch = ident("main"), ident("branch-1")
    assert manager.store.load(main) is None and not manager.has_active(main)

    first = manager.execute_code(main, "x = 41\nprint('defined')")
    assert first.success and first.output == "defined\n"
    again = manager.execute_code(main, "x + 1")  # the same kernel: x is still there
    assert again.output.strip() == "42" and again.sandbox_id == first.sandbox_id
    session = manager.on_edit(main)  # an edit continues the same session
    assert session is not None and session.execution_count == 2
    assert session.sandbox_id == first.sandbox_id

    manager.on_branch(branch)  # lazy: nothing is created
    assert manager.store.load(branch) is None
    isolated = manager.execute_code(branch, "print('x' in dir())")
    assert isolated.output.strip() == "False"  # never sees the parent path's state
    assert isolated.sandbox_id != first.sandbox_id

    assert manager.on_merge(branch)
    merged = manager.store.load(branch)
    assert merged is not None and merged.status == "terminated"
    assert merged.terminated_reason == "merged" and not manager.has_active(branch)
    with pytest.raises(SandboxLostError, match="gone"):
        manager.provider.connect(info_of(merged))  # its kernel was killed
    assert manager.on_archive(main)
    assert manager.store.load(main).terminated_reason == "archived"  # type: ignore[union-attr]
    assert not manager.on_delete(main)  # already ended: nothing to do
    assert manager.store.list_active_for_tenant("acme") == []

    m = manager.metrics
    assert m.created.labels(provider="local")._value.get() == 2
    assert m.terminated.labels(reason="merged")._value.get() == 1
    assert m.executions.labels(outcome="ok")._value.get() == 3
    assert m.active.labels(tenant="acme")._value.get() == 0


def test_timeout_interrupts_and_keeps_the_session(manager: SessionManager,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-must-not-leak")
    path = ident()
    manager.execute_code(path, "y = 7")
    env = manager.execute_code(path, "import os\nprint(os.environ.get('OPENAI_API_KEY'), "
                                     "os.environ['PATH_ID'], os.getcwd())")
    assert env.output.split() == ["None", "main", "/sandbox/" + env.sandbox_id + "/work"]
    if manager.provider.isolate_network:  # type: ignore[attr-defined]
        net = manager.execute_code(path, "import socket\n"
                                         "socket.create_connection(('1.1.1.1', 53), 2)")
        assert "OSError" in (net.error or "") or "unreachable" in (net.error or "")
    started = time.monotonic()
    slow = manager.execute_code(path, "import time\nprint('before')\ntime.sleep(60)")
    assert time.monotonic() - started < 10
    assert slow.timed_out and not slow.success and slow.output_type == "error"
    assert "timed out" in (slow.error or "")
    after = manager.execute_code(path, "print(y)")  # interrupted, not restarted
    assert after.success and after.output.strip() == "7"
    assert after.sandbox_id == slow.sandbox_id and manager.has_active(path)

    big = manager.execute_code(path, "print('a' * 5000)")
    assert big.truncated and len(big.output) == 200

    raised = manager.execute_code(
        path, "raise ValueError('key sk-live-abcdefghijklmnop0123 for bob@example.com "
              "in /home/alice/data.csv')")
    assert not raised.success and raised.output_type == "error"
    assert "ValueError" in (raised.error or "")
    for secret in ("sk-live-abcdefghijklmnop0123", "bob@example.com", "/home/alice"):
        assert secret not in (raised.error or "")
    assert "[REDACTED_KEY]" in (raised.error or "")
    # Code that raises is a result, not a sandbox failure: the session and state stay.
    assert manager.has_active(path)
    assert manager.execute_code(path, "print(y)").output.strip() == "7"


def test_rotation_expiry_and_cleanup(coord: Coordinator, short_tmp: Path) -> None:
    m = make_manager(coord, short_tmp / "k", max_executions=2, ttl_ms=60_000)
    try:
        path = ident()
        a = m.execute_code(path, "z = 1")
        b = m.execute_code(path, "z")
        assert a.sandbox_id == b.sandbox_id
        rotated = m.store.load(path)
        assert rotated is not None and rotated.status == "terminated"
        assert rotated.terminated_reason == "rotated"
        c = m.execute_code(path, "print('z' in dir())")  # a fresh session
        assert c.sandbox_id != a.sandbox_id and c.output.strip() == "False"
        fresh = m.store.load(path)
        assert fresh is not None and fresh.generation == 2
        assert [h.sandbox_id for h in m.store.history(path)] == [a.sandbox_id]

        # TTL: a short one, then cleanup (no long sleeps).
        m.config = m.config.model_copy(update={"ttl_ms": 1500})
        other = ident("short")
        m.get_or_create(other)
        assert m.has_active(other)
        time.sleep(1.6)
        assert not m.has_active(other)
        assert m.cleanup_expired() == 1  # only 'short': 'main' lives 60 s
        gone = m.store.load(other)
        assert gone is not None and gone.status == "expired"
        assert not Path(gone.connection["workdir"]).exists()
        assert m.cleanup_expired() == 0
        assert m.has_active(path)
    finally:
        m.close()


def test_lost_sandbox_is_said_then_replaced_and_other_hosts_are_told(coord: Coordinator,
                                                            manager: SessionManager,
                                                            short_tmp: Path) -> None:
    path = ident()
    first = manager.execute_code(path, "v = 1")
    session = manager.store.load(path)
    assert session is not None
    elsewhere = SessionManager(coord, LocalKernelProvider(short_tmp / "o", host_id="host-b"),
                               metrics=SessionMetrics(CollectorRegistry()))
    with pytest.raises(SandboxElsewhereError, match=session.host):
        elsewhere.execute_code(path, "v")
    assert manager.store.load(path).execution_count == 1  # type: ignore[union-attr]

    os.kill(int(session.connection["pid"]), signal.SIGKILL)
    time.sleep(0.2)
    manager._sandboxes.clear()  # as in another process of this host: connect by record
    manager.provider._open.clear()  # type: ignore[attr-defined]
    with pytest.raises(SandboxLostError, match="next call starts a new one"):
        manager.execute_code(path, "print('v' in dir())")  # said, not a silent new kernel
    marked = manager.store.load(path)
    assert marked is not None and marked.status == "error"
    again = manager.execute_code(path, "print('v' in dir())")
    assert again.success and again.sandbox_id != first.sandbox_id
    lost = [h for h in manager.store.history(path) if h.sandbox_id == first.sandbox_id]
    assert lost and lost[0].status == "error"
