"""A degraded call is on the books as what it was: its node's ``model`` is the model that
ran and ``degraded_from`` the one asked for, charged at the model that ran; every level
of its path counts it (``ContextSnapshot.degraded_calls``, subtree included, whichever
process made it); one ``degraded`` event per context and pair; its span names the model
that ran and carries ``budget.degraded_from`` (docs/degrade.md)."""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once

from coordinator import Coordinator, Decision, ExecutionContext
from tests.support.degrade import GPT4O_USD, MINI_USD, ask, ask_in_process, open_root


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


def test_snapshots_count_degraded_calls_at_every_level_and_nodes_say_what_ran(
        coord: Coordinator, redis_url: str) -> None:
    root = open_root(coord, "degrade-books")
    child = root.spawn_child(max_cost_usd=0.08)
    assert [ask(root) for _ in range(7)] == [Decision.ALLOW] * 7
    # another process, through the child's token: its calls count here too
    queue = multiprocessing.get_context("spawn").Queue()
    proc = multiprocessing.get_context("spawn").Process(
        target=ask_in_process, args=(redis_url, child.token, 2, queue))
    proc.start()
    assert queue.get(timeout=120) == ["ALLOW", "ALLOW"]
    proc.join(60)
    assert proc.exitcode == 0
    coord.store.flush()

    snap = root.get_snapshot()
    ran = [(n.model, n.degraded_from, n.cost_usd) for n in snap.nodes]
    assert ran == [("gpt-4o", None, GPT4O_USD)] * 5 + [("gpt-4o-mini", "gpt-4o", MINI_USD)] * 2
    assert snap.degraded_calls == 4  # 2 of its own, 2 of the child's
    kid = child.get_snapshot()
    assert kid.degraded_calls == 2
    assert [(n.model, n.degraded_from) for n in kid.nodes] == [("gpt-4o-mini", "gpt-4o")] * 2
    assert ExecutionContext.load_snapshot(child.chain_id, coord).degraded_calls == 2
    assert snap.cost_usd_accumulated == pytest.approx(5 * GPT4O_USD + 4 * MINI_USD)
    # one event per context and pair, naming both models and the first degraded call
    for s in (snap, kid):
        (event,) = [e for e in s.events if e.event_type == "degraded"]
        assert (event.metadata["from_model"], event.metadata["to_model"]) == (
            "gpt-4o", "gpt-4o-mini")
        assert event.metadata["node_id"] == next(n.node_id for n in s.nodes
                                                 if n.degraded_from)
    child.close()
    root.close()


def test_a_root_without_degraded_calls_counts_none(coord: Coordinator) -> None:
    root = open_root(coord, "degrade-none", usd=1.0)
    assert ask(root) == Decision.ALLOW
    coord.store.flush()
    snap = root.get_snapshot()
    assert snap.degraded_calls == 0 and snap.nodes[0].degraded_from is None
    root.close()


def test_the_span_of_a_degraded_call_names_the_model_that_ran(
        coord: Coordinator, spans: InMemorySpanExporter) -> None:
    root = open_root(coord, "degrade-spans")
    assert [ask(root) for _ in range(6)] == [Decision.ALLOW] * 6
    coord.store.flush()
    finished = spans.get_finished_spans()
    assert len(finished) == 6
    for span in finished[:5]:
        attrs = dict(span.attributes or {})
        assert span.name == "chat gpt-4o" and "budget.degraded_from" not in attrs
        assert attrs["gen_ai.request.model"] == attrs["gen_ai.response.model"] == "gpt-4o"
    last = finished[5]
    attrs = dict(last.attributes or {})
    assert last.name == "chat gpt-4o-mini"
    assert attrs["budget.degraded_from"] == "gpt-4o"
    assert attrs["gen_ai.request.model"] == attrs["gen_ai.response.model"] == "gpt-4o-mini"
    assert attrs["budget.cost_usd"] == pytest.approx(MINI_USD)
    root.close()
