"""The stop taxonomy of the shield: circuit_open, provider_rate_limit, provider_error (and
egress refusals), each shown as a SafetyEvent in the chain's snapshot."""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from coordinator import (
    ChainMetadata,
    Coordinator,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    SafetyEvent,
    ShieldPipeline,
    ToolCallContext,
    current_context,
)
from coordinator.errors import InvalidConfigError
from coordinator.shield.breaker import BreakerState, CircuitBreaker
from coordinator.shield.egress import DenyListEgressHook
from coordinator.shield.windows import BudgetWindowHook

SPAWN = mp.get_context("spawn")
NAME = "openai:gpt-4o"
CONFIG = ExecutionConfig(max_cost_usd=1.0, max_steps=50, max_retries_total=5)


def _wait_for(pred: Any, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, "condition not reached in time"
        time.sleep(0.01)


def _events(ctx: ExecutionContext, event_type: str) -> list[SafetyEvent]:
    return [e for e in ctx.get_snapshot().events if e.event_type == event_type]


def flaky_worker(url: str, opened: Any, go_probe: Any, probing: Any, go_close: Any,
                 closed: Any) -> None:
    """Another worker process: its failures open the breaker, then it holds the probe
    until told to report its success."""
    coord = Coordinator.from_url(url)
    b = CircuitBreaker(NAME, failure_threshold=2, recovery_timeout_s=2.0, coordinator=coord)
    for _ in range(2):
        assert b.check().allowed
        b.record_failure()
    opened.set()
    assert go_probe.wait(60)
    _wait_for(lambda: b.state == BreakerState.HALF_OPEN)
    assert b.check().allowed
    probing.set()
    assert go_close.wait(60)
    b.record_success()
    closed.set()
    coord.close()


def test_circuit_open_when_another_process_opened_it_or_holds_the_probe(
        coord: Coordinator, redis_url: str) -> None:
    flags = [SPAWN.Event() for _ in range(5)]
    opened, go_probe, probing, go_close, closed = flags
    worker = SPAWN.Process(target=flaky_worker, args=(redis_url, *flags))
    worker.start()
    breaker = CircuitBreaker(NAME, failure_threshold=2, recovery_timeout_s=2.0)
    ran = []
    with ExecutionContext(CONFIG, circuit_breaker=breaker) as ctx:
        assert opened.wait(60)
        assert ctx.wrap_llm_call(lambda: ran.append("open")) == Decision.HALT
        go_probe.set()
        assert probing.wait(60)
        assert ctx.wrap_llm_call(lambda: ran.append("half-open")) == Decision.HALT
        go_close.set()
        assert closed.wait(60)
        assert ctx.wrap_llm_call(lambda: ran.append("closed")) == Decision.ALLOW
        worker.join(30)
        assert worker.exitcode == 0
        assert ran == ["closed"]
        events = _events(ctx, "circuit_open")
        assert [e.hook for e in events] == ["ExecutionContext"] * 2
        assert all(e.decision == Decision.HALT for e in events)
        assert "OPEN" in events[0].reason and "HALF_OPEN" in events[1].reason
        snap = ctx.get_snapshot()
        assert [n.status for n in snap.nodes] == ["halted", "halted", "ok"]
        assert snap.step_count == 1 and not snap.aborted


def test_probe_through_a_context_closes_or_reopens_the_breaker(coord: Coordinator) -> None:
    breaker = CircuitBreaker(NAME, failure_threshold=1, recovery_timeout_s=1.0)
    with ExecutionContext(CONFIG, circuit_breaker=breaker) as ctx:
        def boom() -> None:
            raise ConnectionError("provider 503")

        assert ctx.wrap_llm_call(boom) == Decision.RETRY
        assert breaker.state == BreakerState.OPEN
        _wait_for(lambda: breaker.state == BreakerState.HALF_OPEN)
        assert ctx.wrap_llm_call(boom) == Decision.RETRY  # the probe failed
        assert breaker.state == BreakerState.OPEN
        _wait_for(lambda: breaker.state == BreakerState.HALF_OPEN)
        assert ctx.wrap_llm_call(lambda: "ok") == Decision.ALLOW  # the probe succeeded
        assert breaker.state == BreakerState.CLOSED


def test_provider_rate_limit_when_the_window_halts(coord: Coordinator) -> None:
    pipe = ShieldPipeline()
    BudgetWindowHook(scope="service", max_calls=3, window_s=60, degrade_at=0.5,
                     pipeline=pipe)
    meta = ChainMetadata(request_id="req-1", chain_id="agent-1", service="search")
    ran = []
    with ExecutionContext(CONFIG, pipe, meta) as ctx:
        got = [ctx.wrap_llm_call(lambda: ran.append(1)) for _ in range(4)]
        # the two calls before the third reach 50% of 3: DEGRADE, which the context does
        # not run
        assert got == [Decision.ALLOW, Decision.ALLOW, Decision.DEGRADE, Decision.HALT]
        assert ran == [1, 1]
        [event] = _events(ctx, "provider_rate_limit")
        assert event.hook == "BudgetWindowHook" and event.decision == Decision.HALT
        assert event.request_id == "req-1"
        assert event.metadata["scope"] == "service"
        assert event.metadata["scope_value"] == "search"
        assert "max_calls 3" in event.reason
        types = [e.event_type for e in ctx.get_snapshot().events]
        assert types == ["budget_window_degrade", "provider_rate_limit"]  # no generic copy


def test_provider_error_when_failures_spend_the_retry_budget(coord: Coordinator) -> None:
    breaker = CircuitBreaker(NAME, failure_threshold=10)
    config = ExecutionConfig(max_cost_usd=1.0, max_steps=50, max_retries_total=3)
    with ExecutionContext(config, circuit_breaker=breaker) as ctx:
        def boom() -> None:
            raise TimeoutError("provider timed out")

        got = [ctx.wrap_llm_call(boom) for _ in range(4)]
        assert got == [Decision.RETRY, Decision.RETRY, Decision.HALT, Decision.HALT]
        # every failure reached the shared breaker, until the budget was spent
        assert breaker.failure_count == 3
        [event] = _events(ctx, "provider_error")
        assert event.hook == "ExecutionContext" and event.decision == Decision.HALT
        assert "provider timed out" in event.reason and "retry budget" in event.reason
        snap = ctx.get_snapshot()
        assert snap.aborted and snap.abort_reason == "retry_budget_exceeded"


def test_window_halt_frees_a_probe_taken_in_the_same_round_trip(coord: Coordinator) -> None:
    breaker = CircuitBreaker(NAME, failure_threshold=1, recovery_timeout_s=0.3)
    pipe = ShieldPipeline()
    window = BudgetWindowHook(scope="service", max_calls=1, window_s=60, degrade_at=1.0,
                              circuit_breaker=breaker, pipeline=pipe)
    meta = ChainMetadata(request_id="r", chain_id="c", service="search")
    with ExecutionContext(CONFIG, pipe, meta, circuit_breaker=breaker) as ctx:
        assert ctx.wrap_llm_call(lambda: "ok") == Decision.ALLOW  # fills the window
        assert breaker.check().allowed
        breaker.record_failure()
        _wait_for(lambda: breaker.state == BreakerState.HALF_OPEN)
        assert ctx.wrap_llm_call(lambda: "ok") == Decision.HALT
        assert _events(ctx, "provider_rate_limit") and not _events(ctx, "circuit_open")
    # the probe fetched with the window's check went back: another worker gets it
    other = CircuitBreaker(NAME, failure_threshold=1, recovery_timeout_s=0.3)
    assert other.check().allowed
    assert window.circuit_breaker is breaker


class _Refuse:
    def before_llm_call(self, ctx: ToolCallContext) -> Decision:
        return Decision.HALT


def test_a_later_hook_refusing_frees_a_probe_the_window_took(coord: Coordinator) -> None:
    """The window ALLOWs and takes the probe in its round trip; the next hook refuses, so
    the call never runs and the probe goes back at once (it is renewed while held)."""
    breaker = CircuitBreaker(NAME, failure_threshold=1, recovery_timeout_s=0.3)
    pipe = ShieldPipeline()
    BudgetWindowHook(scope="service", max_calls=100, window_s=60, circuit_breaker=breaker,
                     pipeline=pipe)
    pipe.add_hook(_Refuse())
    meta = ChainMetadata(request_id="r", chain_id="c", service="search")
    assert breaker.check().allowed
    breaker.record_failure()
    _wait_for(lambda: breaker.state == BreakerState.HALF_OPEN)
    with ExecutionContext(CONFIG, pipe, meta, circuit_breaker=breaker) as ctx:
        assert ctx.wrap_llm_call(lambda: "ok") == Decision.HALT
    other = CircuitBreaker(NAME, failure_threshold=1, recovery_timeout_s=0.3)
    assert other.check().allowed


# -- egress ------------------------------------------------------------------------------


class _Sink(BaseHTTPRequestHandler):
    received: list[bytes] = []

    def do_POST(self) -> None:  # noqa: N802 - the http.server naming
        _Sink.received.append(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def sink() -> Iterator[int]:
    """A real HTTP server on a free loopback port that records what is posted to it."""
    _Sink.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()
    thread.join(5)


def _post_tool(url: str, body: bytes) -> str:
    """A tool that sends data out, asking the context first."""
    ctx = current_context()
    assert ctx is not None
    if ctx.check_egress(url) != Decision.ALLOW:
        return "refused"
    req = urllib.request.Request(url, data=body, method="POST")
    with urllib.request.urlopen(req, timeout=5) as resp:
        return str(resp.status)


def test_egress_to_a_deny_listed_host_is_refused(coord: Coordinator, sink: int) -> None:
    pipe = ShieldPipeline()
    DenyListEgressHook(["localhost"], pipeline=pipe)
    results: list[str] = []
    with ExecutionContext(CONFIG, pipe) as ctx:
        for host in ("localhost", "127.0.0.1"):
            url = f"http://{host}:{sink}/upload"
            assert ctx.wrap_tool_call(
                lambda u=url: results.append(_post_tool(u, b"secret"))) == Decision.ALLOW
        assert results == ["refused", "204"]
        assert _Sink.received == [b"secret"]  # only the allowed host got the data
        [event] = _events(ctx, "egress_denied")
        assert event.hook == "DenyListEgressHook" and event.decision == Decision.HALT
        assert event.metadata["host"] == "localhost"
        # outside a wrapped call too
        assert ctx.check_egress("https://api.LOCALHOST./x") == Decision.HALT
        assert ctx.check_egress("not a url") == Decision.HALT
    with ExecutionContext(CONFIG) as plain:
        assert plain.check_egress("http://localhost/") == Decision.ALLOW


def test_deny_list_matches_subdomains_and_rejects_bad_configuration() -> None:
    hook = DenyListEgressHook(["Example.com"])
    assert hook.denied_host("https://api.example.com/v1") == "example.com"
    assert hook.denied_host("https://example.com.evil.org/") is None
    assert hook.denied_host("https://notexample.com/") is None
    for bad in ([], [""], [3]):
        with pytest.raises(InvalidConfigError):
            DenyListEgressHook(bad)  # type: ignore[arg-type]
