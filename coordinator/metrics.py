"""Prometheus metrics fed from the token ledger's ``TokenLedgerUpdated`` events.

``budget_tokens_total{provider,direction}`` counts tokens consumed (direction ``input`` or
``output``), ``budget_cost_usd_total{provider}`` the USD charged where events carry it.
Needs the ``metrics`` extra (``pip install budget-coordinator[metrics]``).

An event is a dict::

    {"type": "TokenLedgerUpdated", "chain_id": "...",
     "delta":  {"openai": {"input": 120, "output": 30, "cost_usd": 0.0006}, "": {...}},
     "totals": {...the same shape, consumed so far...}}

``delta`` maps each provider slug (``""`` for usage without a provider) to what this
update added; the counters add the deltas (``totals`` are for dashboards, not counted).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter

from .errors import InvalidUsageError

EVENT_TYPE = "TokenLedgerUpdated"
NO_PROVIDER = "none"
"""The ``provider`` label of usage that named no provider (the event's ``""`` key)."""


def _delta_rows(event: Mapping[str, Any]) -> list[tuple[str, int, int, float]]:
    """(provider label, input, output, cost) per provider, all validated first, so that a
    bad event counts nothing."""
    delta = event.get("delta")
    if not isinstance(delta, Mapping):
        raise InvalidUsageError(f"{EVENT_TYPE} event needs a 'delta' mapping; got {delta!r}")
    rows: list[tuple[str, int, int, float]] = []
    for provider, amounts in delta.items():
        if not isinstance(provider, str) or not isinstance(amounts, Mapping):
            raise InvalidUsageError(
                f"delta entries must map a provider slug to amounts; got {provider!r}")
        tokens = []
        for direction in ("input", "output"):
            value = amounts.get(direction, 0)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidUsageError(
                    f"delta[{provider!r}][{direction!r}] must be a non-negative integer; "
                    f"got {value!r}")
            tokens.append(value)
        cost = amounts.get("cost_usd", 0.0)
        if isinstance(cost, bool) or not isinstance(cost, (int, float)) or not (
            math.isfinite(cost) and cost >= 0
        ):
            raise InvalidUsageError(
                f"delta[{provider!r}]['cost_usd'] must be finite and >= 0; got {cost!r}")
        rows.append((provider or NO_PROVIDER, tokens[0], tokens[1], float(cost)))
    return rows


class PrometheusLedgerObserver:
    """Counts ledger deltas into Prometheus counters on ``registry`` (the default
    registry when None). Call it with each ``TokenLedgerUpdated`` event."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        registry = REGISTRY if registry is None else registry
        self.tokens = Counter("budget_tokens", "Tokens consumed by LLM calls under a budget",
                              ["provider", "direction"], registry=registry)
        self.cost = Counter("budget_cost_usd", "USD charged for LLM calls under a budget",
                            ["provider"], registry=registry)

    def __call__(self, event: Mapping[str, Any]) -> bool:
        """Count one event. Returns False for events of another type (ignored); raises
        :class:`~coordinator.errors.InvalidUsageError` for a malformed ledger event,
        counting nothing."""
        if not isinstance(event, Mapping) or event.get("type") != EVENT_TYPE:
            return False
        for provider, tin, tout, cost in _delta_rows(event):
            if tin:
                self.tokens.labels(provider=provider, direction="input").inc(tin)
            if tout:
                self.tokens.labels(provider=provider, direction="output").inc(tout)
            if cost:
                self.cost.labels(provider=provider).inc(cost)
        return True


_default: PrometheusLedgerObserver | None = None
_default_lock = threading.Lock()


def default_observer() -> PrometheusLedgerObserver:
    """The observer on Prometheus's default registry (created on first use, once)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = PrometheusLedgerObserver()
        return _default


def observe_ledger_update(event: Mapping[str, Any]) -> bool:
    """Count a ``TokenLedgerUpdated`` event on the default registry (see
    :meth:`PrometheusLedgerObserver.__call__`)."""
    return default_observer()(event)
