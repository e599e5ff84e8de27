"""OpenTelemetry: every wrapped call (a manual wrap, a request through the SDK transport)
is one span per the GenAI semantic conventions plus the budget's attributes, a child of
the current span; the W3C traceparent travels with the context token over HTTP and
Celery, so one trace spans a tree spread over a Celery worker and an HTTP service; and
nothing happens without a tracer provider."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from celery import Celery
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from coordinator import (
    Coordinator,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    WrapOptions,
    current_context,
    report_usage,
)
from coordinator.celery import install
from coordinator.context import tracing
from coordinator.http import BudgetContextMiddleware
from coordinator.http.httpx_client import budget_event_hooks
from coordinator.integrations import BudgetExceededError, budgeted
from tests.http.test_http_clients import ThreadServer
from tests.support.celery_app_harness import TOKEN_KEYS, Workers
from tests.support.fake_provider import ProviderServer

BUDGET_ATTRIBUTES = ("budget.context_id", "budget.root_id", "budget.decision",
                     "budget.cost_usd", "budget.remaining_usd_at_root")


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """A tracer provider exporting to memory, installed for the test only."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    yield exporter
    provider.shutdown()
    trace._TRACER_PROVIDER = None  # the globals, as OpenTelemetry's own tests reset them
    trace._TRACER_PROVIDER_SET_ONCE = Once()


def root(usd: float = 1.0) -> ExecutionContext:
    return ExecutionContext(ExecutionConfig(max_cost_usd=usd, max_steps=100,
                                            max_retries_total=5))


def test_no_tracer_provider_means_no_span(coord: Coordinator) -> None:
    with root() as ctx:
        assert tracing.start_span(ctx._state, "llm", WrapOptions()) is None
        assert ctx.wrap_llm_call(lambda: None) == Decision.ALLOW


def test_a_manual_wrap_is_a_child_span_with_the_budget_attributes(
        coord: Coordinator, spans: InMemorySpanExporter) -> None:
    tracer = trace.get_tracer("test")
    with root(usd=0.5) as ctx, tracer.start_as_current_span("agent run") as parent:
        options = WrapOptions(cost_estimate_hint=0.01, model="gpt-4o", provider="openai")
        ctx.wrap_llm_call(lambda: report_usage(input_tokens=1000, output_tokens=100,
                                               model="gpt-4o"), options)
        assert ctx.wrap_llm_call(lambda: None, WrapOptions(cost_estimate_hint=5.0)) \
            == Decision.HALT
    ok, refused = [s for s in spans.get_finished_spans() if s.name != "agent run"]
    assert ok.parent is not None and ok.parent.span_id == parent.get_span_context().span_id
    assert ok.context.trace_id == parent.get_span_context().trace_id
    a = ok.attributes or {}
    assert (a["gen_ai.operation.name"], a["gen_ai.request.model"], a["gen_ai.provider.name"],
            a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) == (
        "chat", "gpt-4o", "openai", 1000, 100)
    assert all(name in a for name in BUDGET_ATTRIBUTES)
    assert a["budget.context_id"] == ctx.chain_id and a["budget.decision"] == "ALLOW"
    assert a["budget.cost_usd"] == pytest.approx(0.0035)
    assert a["budget.remaining_usd_at_root"] == pytest.approx(0.5 - 0.0035)
    r = refused.attributes or {}
    assert (r["budget.decision"], r["budget.stop_reason"]) == ("HALT", "budget_exceeded")
    assert refused.status.status_code == trace.StatusCode.ERROR


def test_each_transport_request_is_a_span(coord: Coordinator,
                                          spans: InMemorySpanExporter) -> None:
    server = ProviderServer()
    client = budgeted(openai.OpenAI(base_url=server.openai_url, api_key="k", max_retries=0))
    try:
        with root(usd=0.01):
            reply = client.chat.completions.create(
                model="gpt-4o", messages=[{"role": "user", "content": "hi"}], max_tokens=30)
            with pytest.raises(BudgetExceededError):
                client.chat.completions.create(
                    model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    finally:
        client.close()
        server.stop()
    ok, refused = spans.get_finished_spans()
    a = ok.attributes or {}
    assert reply.usage is not None
    assert (a["gen_ai.operation.name"], a["gen_ai.request.model"], a["gen_ai.provider.name"],
            a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) == (
        "chat", "gpt-4o", "openai", reply.usage.prompt_tokens, 20)
    assert ok.name == "chat gpt-4o" and all(name in a for name in BUDGET_ATTRIBUTES)
    assert (refused.attributes or {})["budget.stop_reason"] == "budget_exceeded"


def spend(request: Request) -> JSONResponse:
    ctx = current_context()
    assert ctx is not None
    ctx.wrap_llm_call(lambda: report_usage(input_tokens=50, output_tokens=5, model="gpt-4o"),
                      WrapOptions(cost_estimate_hint=0.01, model="gpt-4o", provider="openai",
                                  operation_name="service call"))
    return JSONResponse({"chain_id": ctx.chain_id})


def test_one_trace_spans_a_tree_over_celery_and_http(
        coord: Coordinator, redis_url: str, spans: InMemorySpanExporter,
        tmp_path: Path) -> None:
    span_file = tmp_path / "worker-spans.jsonl"
    base = redis_url.rsplit("/", 1)[0]
    env = {"BC_BROKER_URL": base + "/1", "BC_BACKEND_URL": base + "/2",
           "BC_QUEUE": f"bc-trace-{uuid.uuid4().hex[:10]}", "BUDGET_REDIS_URL": redis_url,
           "BUDGET_TOKEN_KEYS": TOKEN_KEYS, "BC_SPAN_FILE": str(span_file),
           "PYTHONWARNINGS": "ignore"}
    install()
    app = Celery("bc_trace_client", broker=env["BC_BROKER_URL"],
                 backend=env["BC_BACKEND_URL"])
    app.conf.update(task_default_queue=env["BC_QUEUE"], broker_connection_retry_on_startup=True)
    service = ThreadServer(Starlette(routes=[Route("/spend", spend, methods=["POST"])],
                                     middleware=[Middleware(BudgetContextMiddleware)]))
    tracer = trace.get_tracer("test")
    try:
        with Workers(app, "tests.support.celery_trace_app", env, count=1, pool="solo",
                     concurrency=1), root() as ctx, \
                tracer.start_as_current_span("agent run") as parent:
            ctx.wrap_llm_call(lambda: report_usage(input_tokens=10, output_tokens=1,
                                                   model="gpt-4o"),
                              WrapOptions(cost_estimate_hint=0.01, model="gpt-4o"))
            # ``with root() as ctx`` made it current: the task and the request carry it
            worker_chain = app.signature("tests.support.celery_trace_app.traced_call").delay() \
                .get(timeout=60)
            with httpx.Client(event_hooks=budget_event_hooks(hosts=["127.0.0.1"])) as h:
                service_chain = h.post(f"{service.url}/spend").json()["chain_id"]
    finally:
        service.stop()
        app.close()
    trace_id = format(parent.get_span_context().trace_id, "032x")
    local = [s for s in spans.get_finished_spans() if s.name != "agent run"]
    remote: list[dict[str, Any]] = [json.loads(line) for line in
                                    span_file.read_text().splitlines()]
    assert len(local) == 2 and len(remote) == 1
    assert {format(s.context.trace_id, "032x") for s in local} == {trace_id}
    assert remote[0]["trace_id"] == trace_id
    assert remote[0]["parent_id"] == format(parent.get_span_context().span_id, "016x")
    service_span = next(s for s in local if (s.attributes or {})["budget.context_id"]
                        == service_chain)
    # the service's span is a child of the caller's span, through the traceparent header
    assert service_span.parent is not None
    assert service_span.parent.span_id == parent.get_span_context().span_id
    attributes = remote[0]["attributes"]
    assert attributes["budget.context_id"] == worker_chain
    assert attributes["budget.root_id"] == ctx.chain_id
    assert attributes["gen_ai.usage.input_tokens"] == 100
    assert all(name in attributes for name in BUDGET_ATTRIBUTES)
