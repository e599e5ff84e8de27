"""The Celery app of the tracing test, run in a real worker subprocess: OpenTelemetry
configured with an exporter that appends each finished span, as a JSON line, to the file
``BC_SPAN_FILE`` (the test reads it: the worker's spans must join the caller's trace)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from celery import Celery
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from coordinator import WrapOptions, report_usage
from coordinator.celery import contained, current_context, install


class FileExporter(SpanExporter):
    """Each span as a JSON line: name, trace and parent ids, attributes."""

    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with open(self.path, "a", encoding="utf-8") as f:
            for span in spans:
                ctx = span.get_span_context()
                parent = span.parent
                f.write(json.dumps({
                    "name": span.name, "trace_id": format(ctx.trace_id, "032x"),
                    "span_id": format(ctx.span_id, "016x"),
                    "parent_id": format(parent.span_id, "016x") if parent else None,
                    "attributes": dict(span.attributes or {})}) + "\n")
        return SpanExportResult.SUCCESS


provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(FileExporter(os.environ["BC_SPAN_FILE"])))
trace.set_tracer_provider(provider)

app = Celery("bc_trace")
app.conf.update(
    broker_url=os.environ["BC_BROKER_URL"],
    result_backend=os.environ["BC_BACKEND_URL"],
    task_default_queue=os.environ["BC_QUEUE"],
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    broker_connection_retry_on_startup=True,
)
install(app)


@app.task(bind=True)
@contained()
def traced_call(self: Any) -> str:
    """One budgeted LLM call in the worker."""
    ctx = current_context()
    assert ctx is not None
    ctx.wrap_llm_call(lambda: report_usage(input_tokens=100, output_tokens=20,
                                           model="gpt-4o", provider="openai"),
                      WrapOptions(cost_estimate_hint=0.01, model="gpt-4o", provider="openai",
                                  operation_name="worker call"))
    return ctx.chain_id
