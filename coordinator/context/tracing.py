"""OpenTelemetry spans of wrapped calls: one span per call (manual wraps, the SDK
transport, framework hooks), named and attributed per the GenAI semantic conventions plus
the budget's own attributes, a child of the current span. Without ``opentelemetry``
installed, or with no tracer provider configured, every function here returns at once."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from ..core.amounts import micro_to_usd
from ..models import WrapOptions
from .state import ContextState

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate
    from opentelemetry import trace as otel
except ImportError:  # the telemetry extra is optional
    otel = None  # type: ignore[assignment]

_cached: tuple[Any, Any] = (None, None)
"""(the tracer provider, its tracer): the tracer is made once per provider."""
_OPERATIONS = {"llm": "chat", "tool": "execute_tool"}
_NO_SPAN = nullcontext()
"""What ``in_span`` enters when tracing is off (one, reused: it holds no state)."""
_environ_size = -1
"""The size of os.environ when OpenTelemetry's getter last found no provider named in it."""


def _tracer() -> Any:
    """The package's tracer, or None when no tracer provider is configured."""
    if otel is None:
        return None
    provider = otel._TRACER_PROVIDER  # the provider set (set once; tests reset it)
    if provider is None:
        # none set: OpenTelemetry's getter would look up the variable that may name one
        # (about 1 us a call: a KeyError raised and caught in os.environ); it is asked
        # again only when the environment changed size since it last found none there
        global _environ_size
        if len(os.environ) == _environ_size:
            return None
        provider = otel.get_tracer_provider()
        if otel._TRACER_PROVIDER is None:
            _environ_size = len(os.environ)
    if isinstance(provider, (otel.ProxyTracerProvider, otel.NoOpTracerProvider)):
        return None
    global _cached
    cached_provider, tracer = _cached
    if cached_provider is not provider:
        tracer = provider.get_tracer("budget-coordinator")
        _cached = (provider, tracer)
    return tracer


def start_span(state: ContextState, kind: str, options: WrapOptions,
               operation: str | None = None) -> Any:
    """Start the span of one call (None when tracing is off)."""
    tracer = _tracer()
    if tracer is None:
        return None
    op = operation or _OPERATIONS.get(kind, kind)
    model = options.model or state.metadata.model
    name = f"{op} {model}" if model and kind == "llm" else (
        f"{op} {options.operation_name}".strip())
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": op, "budget.context_id": state.ctx_id,
        "budget.root_id": state.path.root, "budget.call_kind": kind,
        "budget.cost_estimate_usd": options.cost_estimate_hint}
    if model:
        attributes["gen_ai.request.model"] = model
    if options.provider:
        attributes["gen_ai.provider.name"] = options.provider
    kind_ = otel.SpanKind.CLIENT if kind == "llm" else otel.SpanKind.INTERNAL
    return tracer.start_span(name, kind=kind_, attributes=attributes)


def in_span(span: Any) -> AbstractContextManager[Any]:
    """Make ``span`` current while the call runs (so spans it starts are its children)."""
    if span is None:
        return _NO_SPAN
    return otel.use_span(span, end_on_exit=False)


def end_span(span: Any, state: ContextState, *, decision: str, reason: str | None,
             settled: Mapping[str, Any] | None, error: BaseException | None = None) -> None:
    """Finish the span with how the call ended: the decision, the stop reason, the usage
    and cost charged (``settled``: the call's node record), the model that ran (with
    ``budget.degraded_from`` when its ladder chose a cheaper one), the USD left at the
    root."""
    if span is None:
        return
    try:
        attrs: dict[str, Any] = {"budget.decision": decision}
        if reason:
            attrs["budget.stop_reason"] = reason
        if settled is not None:
            attrs["budget.cost_usd"] = float(settled.get("cost_usd") or 0.0)
            attrs["gen_ai.usage.input_tokens"] = int(settled.get("input_tokens") or 0)
            attrs["gen_ai.usage.output_tokens"] = int(settled.get("output_tokens") or 0)
            if settled.get("model"):
                attrs["gen_ai.response.model"] = settled["model"]
            if settled.get("provider"):
                attrs["gen_ai.provider.name"] = settled["provider"]
            if settled.get("degraded_from") and settled.get("model"):
                _degraded(span, attrs, settled["model"], settled["degraded_from"])
        remaining = _remaining_at_root(state) if decision == "ALLOW" else None
        if remaining is not None:
            attrs["budget.remaining_usd_at_root"] = remaining
        span.set_attributes(attrs)
        if error is not None:
            span.record_exception(error)
            span.set_attribute("error.type", type(error).__name__)
        if decision != "ALLOW" or error is not None:
            span.set_status(otel.Status(otel.StatusCode.ERROR, reason or decision))
    finally:
        span.end()


def _degraded(span: Any, attrs: dict[str, Any], model: str, asked: str) -> None:
    """A call its model ladder ran on ``model`` instead of ``asked``: the request sent
    named the model that ran (and so does the span's name), ``budget.degraded_from`` the
    one asked for."""
    attrs["budget.degraded_from"] = asked
    attrs["gen_ai.request.model"] = model
    name = getattr(span, "name", None)
    if isinstance(name, str) and name.endswith(f" {asked}"):
        span.update_name(f"{name[:-len(asked)]}{model}")


def _remaining_at_root(state: ContextState) -> float | None:
    """USD left at the root (one read of the root's hash; None if it cannot be read).
    Read only after an allowed call and never while the breaker is open: a refusal in a
    stall must not wait on Redis for its span."""
    if not state.coord.backend.allow(state.backend_key):
        return None
    try:
        h = state.store.read_hash(state.path.root, state.path.root)
    except Exception:  # noqa: BLE001 - a span never fails a call
        return None
    if "l:usd" not in h:
        return None
    left = int(h["l:usd"]) - int(h.get("u:usd") or 0) - int(h.get("h:usd") or 0)
    return micro_to_usd(max(0, left))


# -- the trace context beside the context token (Celery headers, HTTP headers) ----------

def inject(carrier: MutableMapping[str, Any]) -> None:
    """Put the current trace context (W3C ``traceparent``, ``tracestate``) into
    ``carrier``, next to a context token being sent (no-op when tracing is off)."""
    if _tracer() is None:
        return
    propagate.inject(carrier)


def extracted(carrier: Mapping[str, Any]) -> AbstractContextManager[Any]:
    """Run the block in the trace context that ``carrier`` brought (its ``traceparent``),
    unless a span is already current here (an instrumented server extracted it)."""
    if _tracer() is None or not carrier.get("traceparent"):
        return nullcontext()
    if otel.get_current_span().get_span_context().is_valid:
        return nullcontext()
    return _attached(propagate.extract(carrier))


@contextmanager
def _attached(ctx: Any) -> Iterator[None]:
    token = otel_context.attach(ctx)
    try:
        yield
    finally:
        otel_context.detach(token)
