"""Prometheus counters fed from TokenLedgerUpdated events, read back from a real
CollectorRegistry and from its text exposition."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from coordinator.errors import InvalidUsageError
from coordinator.metrics import PrometheusLedgerObserver


def event(delta: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "TokenLedgerUpdated", "chain_id": "chain-1", "delta": delta,
            "totals": delta, **extra}


def tokens(registry: CollectorRegistry, provider: str, direction: str) -> float | None:
    return registry.get_sample_value("budget_tokens_total",
                                     {"provider": provider, "direction": direction})


def test_deltas_add_up_per_provider_and_direction() -> None:
    registry = CollectorRegistry()
    observe = PrometheusLedgerObserver(registry)
    assert observe(event({"openai": {"input": 120, "output": 30},
                          "anthropic": {"input": 500, "output": 0}}))
    assert observe(event({"openai": {"input": 80, "output": 20, "cost_usd": 0.0125},
                          "": {"input": 7, "output": 3}}))
    assert tokens(registry, "openai", "input") == 200
    assert tokens(registry, "openai", "output") == 50
    assert tokens(registry, "anthropic", "input") == 500
    assert tokens(registry, "anthropic", "output") is None  # a zero delta adds no series
    assert tokens(registry, "none", "input") == 7
    assert registry.get_sample_value("budget_cost_usd_total",
                                     {"provider": "openai"}) == pytest.approx(0.0125)
    text = generate_latest(registry).decode()
    assert 'budget_tokens_total{direction="input",provider="openai"} 200.0' in text
    assert "# TYPE budget_tokens_total counter" in text


def test_other_events_are_ignored() -> None:
    registry = CollectorRegistry()
    observe = PrometheusLedgerObserver(registry)
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
])
def test_a_malformed_event_raises_and_counts_nothing(delta: Any) -> None:
    registry = CollectorRegistry()
    observe = PrometheusLedgerObserver(registry)
    # The valid provider comes first: it must not be counted either.
    bad = {"anthropic": {"input": 10, "output": 10}, **delta} if delta else delta
    with pytest.raises(InvalidUsageError):
        observe(event(bad))  # type: ignore[arg-type]
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
        "{'openai': {'input': 3, 'output': 4}}, 'totals': {}}\n"
        "observe_ledger_update(e); observe_ledger_update(e)\n"
        "assert default_observer() is default_observer()\n"
        "print(REGISTRY.get_sample_value('budget_tokens_total',"
        " {'provider': 'openai', 'direction': 'output'}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True, cwd=Path(__file__).resolve().parents[1])
    assert out.stdout.strip() == "8.0"
