"""Prometheus counters fed from TokenLedgerUpdated events, read back from a real
CollectorRegistry and from its text exposition."""

from __future__ import annotations

import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from coordinator import (
    Coordinator,
    ExecutionConfig,
    ExecutionContext,
    WrapOptions,
    report_usage,
)
from coordinator.errors import InvalidUsageError
from coordinator.metrics import PrometheusLedgerObserver, subscribe_ledger


def event(delta: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "TokenLedgerUpdated", "chain_id": "chain-1", "root": "chain-1",
            "delta": delta, "totals": delta, "ts": 1764107000000, **extra}


def tokens(registry: CollectorRegistry, provider: str, direction: str) -> float | None:
    return registry.get_sample_value("budget_tokens_total",
                                     {"provider": provider, "direction": direction})


def test_deltas_add_up_per_provider_and_direction() -> None:
    registry = CollectorRegistry()
    observe = PrometheusLedgerObserver(registry)
    # As settle.lua publishes them: "" is the call over all providers, "total" is ignored.
    assert observe(event({"": {"input": 120, "output": 30, "total": 150},
                          "openai": {"input": 120, "output": 30, "total": 150}}))
    assert observe(event({"": {"input": 500, "total": 500},
                          "anthropic": {"input": 500, "total": 500}}))
    assert observe(event({"": {"input": 80, "output": 20, "cost_usd": 0.0125},
                          "openai": {"input": 80, "output": 20, "cost_usd": 0.0125}}))
    assert observe(event({"": {"input": 7, "output": 3, "total": 10}}))  # no provider
    assert tokens(registry, "openai", "input") == 200
    assert tokens(registry, "openai", "output") == 50
    assert tokens(registry, "anthropic", "input") == 500
    assert tokens(registry, "anthropic", "output") is None  # nothing moved: no series
    assert tokens(registry, "none", "input") == 7
    assert tokens(registry, "none", "output") == 3
    assert registry.get_sample_value("budget_cost_usd_total",
                                     {"provider": "openai"}) == pytest.approx(0.0125)
    assert registry.get_sample_value("budget_cost_usd_total", {"provider": "none"}) is None
    text = generate_latest(registry).decode()
    assert 'budget_tokens_total{direction="input",provider="openai"} 200.0' in text
    assert "# TYPE budget_tokens_total counter" in text


def test_reservation_events_and_other_types_are_not_counted() -> None:
    registry = CollectorRegistry()
    observe = PrometheusLedgerObserver(registry)
    reserved = {"type": "TokenLedgerUpdated", "chain_id": "c", "change": "reserved",
                "direction": "both", "reserved": {"openai": {"input": 400, "output": 300}}}
    assert observe(reserved) is False
    assert observe({"type": "budget_exceeded", "delta": {"openai": {"input": 5}}}) is False
    assert observe("not an event") is False  # type: ignore[arg-type]
    assert tokens(registry, "openai", "input") is None


@pytest.mark.parametrize("delta", [
    None,
    {"openai": {"input": -5, "output": 1}},
    {"openai": {"input": 1.5}},
    {"openai": {"output": True}},
    {"openai": 12},
    {"openai": {"input": 1, "cost_usd": math.nan}},
    {"openai": {"input": 1, "cost_usd": -0.1}},
    {"": {"input": 5}, "openai": {"input": 6}},  # the whole is less than its parts
])
def test_a_malformed_event_raises_and_counts_nothing(delta: Any) -> None:
    registry = CollectorRegistry()
    observe = PrometheusLedgerObserver(registry)
    # The valid provider comes first: it must not be counted either.
    bad = {"anthropic": {"input": 10, "output": 10}, **delta} if delta else delta
    if delta and "" in delta:
        bad = {"anthropic": {"input": 1}, **delta}
    with pytest.raises(InvalidUsageError):
        observe(event(bad))  # type: ignore[arg-type]
    with pytest.raises(InvalidUsageError):
        observe({"type": "TokenLedgerUpdated", "delta": None})
    assert tokens(registry, "anthropic", "input") is None
    assert tokens(registry, "openai", "input") is None


def test_two_observers_need_two_registries() -> None:
    registry = CollectorRegistry()
    PrometheusLedgerObserver(registry)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        PrometheusLedgerObserver(registry)


def test_module_function_counts_on_the_default_registry_once() -> None:
    # In a fresh interpreter: the default registry is process-wide.
    code = (
        "from prometheus_client import REGISTRY\n"
        "from coordinator.metrics import observe_ledger_update, default_observer\n"
        "e = {'type': 'TokenLedgerUpdated', 'chain_id': 'c', 'delta': "
        "{'': {'input': 3, 'output': 4}, 'openai': {'input': 3, 'output': 4}}}\n"
        "observe_ledger_update(e); observe_ledger_update(e)\n"
        "assert default_observer() is default_observer()\n"
        "print(REGISTRY.get_sample_value('budget_tokens_total',"
        " {'provider': 'openai', 'direction': 'output'}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True, cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "8.0"


def test_subscription_counts_what_real_wrapped_calls_consumed(coord: Coordinator) -> None:
    registry = CollectorRegistry()
    seen: list[dict[str, Any]] = []
    observer = PrometheusLedgerObserver(registry)

    def observe(e: Any) -> object:
        seen.append(e)
        return observer(e)

    subscription = subscribe_ledger(coord, observe)
    try:
        config = ExecutionConfig(max_cost_usd=1.0, max_steps=20, max_retries_total=2)
        with ExecutionContext(config) as ctx:
            for provider, tin, tout in (("openai", 100, 20), ("anthropic", 50, 5),
                                        (None, 7, 3), ("openai", 1, 1)):
                ctx.wrap_llm_call(
                    lambda tin=tin, tout=tout: report_usage(input_tokens=tin,
                                                            output_tokens=tout,
                                                            cost_usd=tin / 10_000),
                    WrapOptions(provider=provider))
            reservation = ctx.ledger.reserve(input_tokens=10, provider="openai")
            ctx.ledger.rollback(reservation)
            with ctx.spawn_child(max_cost_usd=0.5) as child:
                child.wrap_llm_call(lambda: report_usage(input_tokens=2, output_tokens=2,
                                                         cost_usd=0.0002),
                                    WrapOptions(provider="openai"))
        expected = {("openai", "input"): 103, ("openai", "output"): 23,
                    ("anthropic", "input"): 50, ("anthropic", "output"): 5,
                    ("none", "input"): 7, ("none", "output"): 3}
        deadline = time.monotonic() + 30  # delivery is asynchronous; this only waits
        while time.monotonic() < deadline and any(
                tokens(registry, *key) != value for key, value in expected.items()):
            time.sleep(0.05)
        assert {key: tokens(registry, *key) for key in expected} == expected
        # the USD each call was charged, under its provider
        usd = {p: registry.get_sample_value("budget_cost_usd_total", {"provider": p})
               for p in ("openai", "anthropic", "none")}
        assert usd == pytest.approx({"openai": 0.0101 + 0.0002, "anthropic": 0.005,
                                     "none": 0.0007})
        # Every call was published once (a child's call is not counted again per level).
        counted = [e for e in seen if "delta" in e]
        assert len(counted) == 5
        assert any(e.get("change") == "reserved" for e in seen)
    finally:
        subscription.close()
