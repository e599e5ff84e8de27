"""Spans carry the specification's names and attributes (recorded by the OpenTelemetry
SDK's in-memory exporter); a refusal at the tenant cap is counted and marks the span."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from prometheus_client import CollectorRegistry

from coordinator import Coordinator
from coordinator.sessions import (
    ExecutionSession,
    ExecutionSessionIdentity,
    LocalKernelProvider,
    SessionConfig,
    SessionManager,
    TooManySessionsError,
)
from coordinator.sessions.telemetry import SessionMetrics

_EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module")
def exporter() -> InMemorySpanExporter:
    current = trace.get_tracer_provider()
    if not isinstance(current, TracerProvider):  # the global provider is set once
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    return _EXPORTER


def test_spans_and_cap_metrics(coord: Coordinator, short_tmp: Path,
                               exporter: InMemorySpanExporter) -> None:
    exporter.clear()
    m = SessionManager(coord, LocalKernelProvider(short_tmp / "k"),
                       SessionConfig(max_sessions_per_tenant=1),
                       metrics=SessionMetrics(CollectorRegistry()))
    taken = ExecutionSessionIdentity(tenant_id="acme", conversation_id="c1", path_id="a")
    now = datetime.now(timezone.utc)
    m.store.save(taken, ExecutionSession(
        identity=taken, sandbox_id="sb", provider="e2b", created_at=now, last_used_at=now,
        updated_at=now, expires_at=now + timedelta(minutes=5), ttl_ms=300_000))
    wanted = ExecutionSessionIdentity(tenant_id="acme", conversation_id="c1", path_id="b")
    with pytest.raises(TooManySessionsError, match="Too many active analysis sessions"):
        m.execute_code(wanted, "print(1)")
    spans = {s.name: s for s in exporter.get_finished_spans()}
    outer = spans["execution_context.execute_code"]
    inner = spans["execution_context.get_or_create"]
    assert dict(outer.attributes or {}) == {
        "app.tenant.id": "acme", "app.conversation.id": "c1", "app.path.id": "b",
        "code.language": "python"}
    assert dict(inner.attributes or {})["app.path.id"] == "b"
    assert inner.parent is not None and inner.parent.span_id == outer.context.span_id
    assert inner.status.status_code == StatusCode.ERROR
    assert m.metrics.errors.labels(kind="tenant_cap")._value.get() == 1
    assert not (short_tmp / "k").exists() or not any((short_tmp / "k").iterdir())
