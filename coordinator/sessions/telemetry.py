"""Spans (OpenTelemetry API: a no-op without an SDK) and Prometheus metrics of execution
sessions, named after the specification's."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from ..core.session_models import ExecutionSessionIdentity

_tracer = trace.get_tracer("coordinator.sessions")

GET_OR_CREATE = "execution_context.get_or_create"
EXECUTE_CODE = "execution_context.execute_code"


@contextmanager
def span(name: str, identity: ExecutionSessionIdentity, **attributes: str
         ) -> Iterator[Any]:
    """A span carrying the specification's attributes (``app.tenant.id``,
    ``app.conversation.id``, ``app.path.id``, plus ``attributes``); an exception marks it
    as an error and propagates."""
    attrs = {"app.tenant.id": identity.tenant_id,
             "app.conversation.id": identity.conversation_id,
             "app.path.id": identity.path_id, **attributes}
    with _tracer.start_as_current_span(name, attributes=attrs) as current:
        yield current


class SessionMetrics:
    """The specification's metrics on ``registry`` (default: Prometheus's)::

        execution_context_created_total{provider}
        execution_context_terminated_total{reason}
        execution_context_executions_total{outcome}   ok | error | timeout | interrupted
        execution_context_execution_duration_ms       histogram
        execution_context_execution_errors_total{kind}
        execution_context_active_count{tenant}        as this process last read it
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        registry = REGISTRY if registry is None else registry
        self.created = Counter("execution_context_created", "Execution sessions created",
                               ["provider"], registry=registry)
        self.terminated = Counter("execution_context_terminated",
                                  "Execution sessions terminated", ["reason"],
                                  registry=registry)
        self.executions = Counter("execution_context_executions",
                                  "Code executions in sessions", ["outcome"],
                                  registry=registry)
        self.duration = Histogram(
            "execution_context_execution_duration_ms", "Code execution wall time (ms)",
            buckets=(10, 50, 100, 250, 500, 1000, 2500, 5000, 10_000, 30_000, 60_000),
            registry=registry)
        self.errors = Counter("execution_context_execution_errors",
                              "Failed code executions and session errors", ["kind"],
                              registry=registry)
        self.active = Gauge("execution_context_active_count", "Active execution sessions",
                            ["tenant"], registry=registry)


_default: SessionMetrics | None = None
_default_lock = threading.Lock()


def default_metrics() -> SessionMetrics:
    """The metrics on Prometheus's default registry (created once)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = SessionMetrics()
        return _default
