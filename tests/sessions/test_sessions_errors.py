"""The specification's error table, the parts that need no running kernel: creation
failure raises and leaves nothing behind, bad input is typed, the store fails closed."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from coordinator import Coordinator, ExecutionConfig, ExecutionContext
from coordinator.sessions import (
    ExecutionSessionIdentity,
    InvalidSessionInputError,
    LocalKernelProvider,
    SessionConfig,
    SessionCreationError,
    SessionManager,
    SessionStoreUnavailableError,
    SessionTenantError,
    UnsupportedLanguageError,
)
from coordinator.sessions.telemetry import SessionMetrics

PATH = ExecutionSessionIdentity(tenant_id="acme", conversation_id="c1", path_id="main")


def manager_for(coord: Coordinator, provider: LocalKernelProvider) -> SessionManager:
    return SessionManager(coord, provider, SessionConfig(creation_timeout_ms=20_000),
                          metrics=SessionMetrics(CollectorRegistry()))


def test_creation_failure_raises_and_leaves_nothing(coord: Coordinator,
                                                    short_tmp: Path) -> None:
    m = manager_for(coord, LocalKernelProvider(short_tmp / "k", kernel_name="no-such-kernel"))
    conversation = ExecutionContext(
        ExecutionConfig(max_cost_usd=1.0, max_steps=10, max_retries_total=5),
        coordinator=coord)
    with pytest.raises(SessionCreationError, match="no-such-kernel"):
        m.execute_code(PATH, "print(1)", parent=conversation)
    assert m.store.load(PATH) is None
    assert m.store.list_active_for_tenant("acme") == []
    assert coord.client.zcard("bc:{sess:acme}:claims") == 0  # the claim was given back
    assert list((short_tmp / "k").iterdir()) == []
    assert m.metrics.errors.labels(kind="creation")._value.get() == 1
    conversation.close()


def test_bad_input_is_typed_and_changes_nothing(coord: Coordinator, short_tmp: Path) -> None:
    m = manager_for(coord, LocalKernelProvider(short_tmp / "k"))
    with pytest.raises(InvalidSessionInputError):
        m.execute_code(PATH, "print(1)", "ruby")  # type: ignore[arg-type]
    with pytest.raises(InvalidSessionInputError):
        m.execute_code(PATH, b"print(1)")  # type: ignore[arg-type]
    with pytest.raises(UnsupportedLanguageError):
        m.execute_code(PATH, "console.log(1)", "javascript")
    assert m.store.load(PATH) is None


def test_a_tenant_bound_coordinator_serves_only_its_tenant(redis_url: str,
                                                          short_tmp: Path) -> None:
    coord = Coordinator.from_url(redis_url, tenant="globex")
    try:
        m = manager_for(coord, LocalKernelProvider(short_tmp / "k"))
        with pytest.raises(SessionTenantError):
            m.get_or_create(PATH)  # PATH belongs to acme
        with pytest.raises(SessionTenantError):
            m.terminate(PATH)
    finally:
        coord.close()


def test_store_failure_fails_closed(short_tmp: Path) -> None:
    coord = Coordinator.from_url("redis://127.0.0.1:1/0")
    try:
        m = manager_for(coord, LocalKernelProvider(short_tmp / "k"))
        with pytest.raises(SessionStoreUnavailableError):
            m.execute_code(PATH, "print('must not run unrecorded')")
        assert not (short_tmp / "k").exists() or not any((short_tmp / "k").iterdir())
    finally:
        coord.close()
