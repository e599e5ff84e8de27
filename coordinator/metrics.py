"""Prometheus metrics fed from the token ledger's ``TokenLedgerUpdated`` events.

``budget_tokens_total{provider,direction}`` counts tokens consumed (direction ``input`` or
``output``), ``budget_cost_usd_total{provider}`` the USD those calls were charged.
Needs the ``metrics`` extra (``pip install budget-coordinator[metrics]``).

The settle script publishes one event per settled call that consumed tokens::

    {"type": "TokenLedgerUpdated", "chain_id": "...", "root": "...", "ts": 1764107000000,
     "delta":  {"": {"input": 120, "output": 30, "total": 150, "cost_usd": 0.0006},
                "openai": {"input": 120, "output": 30, "total": 150, "cost_usd": 0.0006}},
     "totals": {...the same shape, the context's consumption so far...}}

In ``delta`` the ``""`` entry is the call's tokens over all providers and each slug its
provider's part; a direction that did not move may be absent. The counters add each
provider's part, and what the ``""`` entry has beyond the providers under
``provider="none"``. Events without a ``delta`` (a ``TokenLedger`` reservation or
rollback: nothing consumed) are not counted.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter

from .errors import InvalidUsageError
from .store.channels import ChannelThread

if TYPE_CHECKING:
    from .runtime.coordinator import Coordinator

log = logging.getLogger("coordinator.metrics")

EVENT_TYPE = "TokenLedgerUpdated"
ORPHAN_EVENT_TYPE = "SettleOrphaned"
"""A settle that found no reservation (settle.lua): ``budget_orphan_settles_total``."""
NO_PROVIDER = "none"
"""The ``provider`` label of tokens that named no provider."""
DIRECTIONS = ("input", "output")


def _amounts(provider: Any, entry: Any) -> tuple[int, int, float]:
    if not isinstance(provider, str) or not isinstance(entry, Mapping):
        raise InvalidUsageError(
            f"delta entries must map a provider slug to amounts; got {provider!r}: {entry!r}")
    tokens = []
    for direction in DIRECTIONS:
        value = entry.get(direction, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidUsageError(f"delta[{provider!r}][{direction!r}] must be a "
                                    f"non-negative integer; got {value!r}")
        tokens.append(value)
    cost = entry.get("cost_usd", 0.0)
    if isinstance(cost, bool) or not isinstance(cost, (int, float)) or not (
        math.isfinite(cost) and cost >= 0
    ):
        raise InvalidUsageError(
            f"delta[{provider!r}]['cost_usd'] must be finite and >= 0; got {cost!r}")
    return tokens[0], tokens[1], float(cost)


def ledger_rows(event: Mapping[str, Any]) -> list[tuple[str, int, int, float]]:
    """(provider label, input, output, USD) that one event adds, every entry validated
    before anything is returned (so a bad event counts nothing)."""
    delta = event.get("delta")
    if not isinstance(delta, Mapping):
        raise InvalidUsageError(f"{EVENT_TYPE} event needs a 'delta' mapping; got {delta!r}")
    parts = {provider: _amounts(provider, entry) for provider, entry in delta.items()}
    rows = [(provider, *amounts) for provider, amounts in parts.items() if provider]
    whole = parts.get("")
    if whole is not None:
        rest = tuple(whole[i] - sum(row[i + 1] for row in rows) for i in range(3))
        if rest[0] < 0 or rest[1] < 0:
            raise InvalidUsageError(
                f"delta['']: {whole[:2]} is less than its providers' parts in {dict(delta)!r}")
        rows.append((NO_PROVIDER, int(rest[0]), int(rest[1]), max(0.0, float(rest[2]))))
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
        self.orphans = Counter("budget_orphan_settles", "Settles that found no reservation "
                               "(lost in a failover); charged: to the context's path",
                               ["charged"], registry=registry)

    def __call__(self, event: Mapping[str, Any]) -> bool:
        """Count one event. Returns False for an event that consumed nothing (another
        type, or a reservation); raises :class:`~coordinator.errors.InvalidUsageError`
        for a malformed ledger event, counting nothing."""
        if isinstance(event, Mapping) and event.get("type") == ORPHAN_EVENT_TYPE:
            self.orphans.labels(charged=str(bool(event.get("charged"))).lower()).inc()
            return True
        if not isinstance(event, Mapping) or event.get("type") != EVENT_TYPE:
            return False
        if "delta" not in event:
            return False
        for provider, tin, tout, cost in ledger_rows(event):
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


class LedgerSubscription:
    """A background thread that feeds every ``TokenLedgerUpdated`` event published on a
    coordinator's ledger channel (all trees of its tenant) to an observer."""

    def __init__(self, coordinator: Coordinator,
                 observer: Callable[[Mapping[str, Any]], object]) -> None:
        self._observer = observer
        self._channel = ChannelThread(coordinator.client, coordinator.keyspace.ledger_channel,
                                      self._on_message, self._on_error)

    def _on_message(self, message: Mapping[str, Any]) -> None:
        try:
            event = json.loads(message["data"])
            self._observer(event)
        except Exception:  # a bad event or observer must not stop the subscription
            log.exception("ledger event not observed: %r", message.get("data"))

    @staticmethod
    def _on_error(exc: BaseException, pubsub: Any, thread: Any) -> None:
        # Pub/sub is at most once: a reconnect loses the events published meanwhile.
        log.warning("ledger subscription: %s", exc)
        time.sleep(0.5)  # Redis is down: retry calmly rather than spin

    def close(self) -> None:
        """Stop the thread and close its connection."""
        self._channel.close()


def subscribe_ledger(coordinator: Coordinator,
                     observer: Callable[[Mapping[str, Any]], object] | None = None
                     ) -> LedgerSubscription:
    """Feed the ledger events of every tree on ``coordinator`` to ``observer`` (default:
    :func:`observe_ledger_update`) from a background thread, until ``close()``.

    Pub/sub delivers each event at most once to every subscribed process: run one
    subscription per metrics exporter, not one per worker, or each worker's exporter
    counts every tree's tokens."""
    return LedgerSubscription(coordinator, observer or observe_ledger_update)
