"""Prometheus metrics of the dashboard: read from the indexer's views at scrape time
(a few commands per tenant, whatever the number of trees; the trees waiting for approval:
the newest open trees' wait fields, dashboard/waiting.py), on the app's own registry."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from .indexer import NEAR_BANDS
from .quota_metrics import QuotaCollector
from .service import Service
from .waiting import count_by_reason

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
BREAKER_STATES = ("CLOSED", "OPEN", "HALF_OPEN")


class _DashboardCollector(Collector):
    def __init__(self, service: Service, stats: Callable[[], dict[str, float]]) -> None:
        self.service = service
        self.stats = stats

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        trees = GaugeMetricFamily("budget_open_trees", "Budget trees not yet closed",
                                  labels=["tenant"])
        spend = GaugeMetricFamily("budget_open_spend_usd", "USD settled in open trees, by label",
                                  labels=["tenant", "label", "value"])
        tokens = GaugeMetricFamily("budget_open_tokens", "Tokens consumed in open trees",
                                   labels=["tenant", "provider", "direction"])
        held = GaugeMetricFamily("budget_held_usd", "USD held by calls in flight (open trees)",
                                 labels=["tenant"])
        stops = GaugeMetricFamily("budget_stopped_trees", "Open trees whose root is stopped",
                                  labels=["tenant", "reason"])
        state = GaugeMetricFamily("budget_breaker_state", "1 for the breaker's current state",
                                  labels=["tenant", "name", "state"])
        failures = GaugeMetricFamily("budget_breaker_failures", "Consecutive failures counted",
                                     labels=["tenant", "name"])
        waiting = GaugeMetricFamily("budget_waiting_trees",
                                    "Open trees waiting for approval (a call waits for an "
                                    "operator to raise a limit)", labels=["tenant"])
        waiting_by = GaugeMetricFamily("budget_waiting_trees_by_reason",
                                       "Open trees waiting for approval, by the stop waited on",
                                       labels=["tenant", "reason"])
        near = GaugeMetricFamily("budget_trees_near_ceiling",
                                 "Open trees whose root spent at least band % of its USD "
                                 "ceiling (cumulative bands 50, 80, 100)",
                                 labels=["tenant", "band"])
        refused = GaugeMetricFamily("budget_refusals",
                                    "Refused calls made at open trees' root contexts, by reason",
                                    labels=["tenant", "reason"])
        for tenant in self.service.tenants:
            count, views = self.service.views[tenant].counts()
            trees.add_metric([tenant], count)
            for label in ("org", "team", "service"):
                for value, micro in views[label].items():
                    spend.add_metric([tenant, label, value], micro / 1e6)
            for key, n in views["provider"].items():
                provider, _, direction = key.rpartition(".")
                tokens.add_metric([tenant, provider, direction], n)
            held.add_metric([tenant], views["held"].get("usd", 0) / 1e6)
            for reason, n in views["stops"].items():
                stops.add_metric([tenant, reason], n)
            for band in NEAR_BANDS:
                near.add_metric([tenant, str(band)], views["near"].get(str(band), 0))
            for reason, n in views["refused"].items():
                refused.add_metric([tenant, reason], n)
            for b in self.service.shield(tenant)["breakers"]:
                for s in BREAKER_STATES:
                    state.add_metric([tenant, b["name"], s], 1.0 if b["state"] == s else 0.0)
                failures.add_metric([tenant, b["name"]], b["failures"])
            waits = self.service.waiting(tenant)
            waiting.add_metric([tenant], len(waits))
            for reason, n in count_by_reason(waits).items():
                waiting_by.add_metric([tenant, reason], n)
        yield from (trees, spend, tokens, held, stops, near, refused, state, failures, waiting,
                    waiting_by)
        stats = self.stats()
        alerts = CounterMetricFamily("budget_dashboard_alerts",
                                     "Alerts this process emitted (after dedup)")
        alerts.add_metric([], stats.get("alerts", 0))
        hooks = CounterMetricFamily("budget_dashboard_webhook_deliveries",
                                    "Webhook deliveries of this process", labels=["result"])
        hooks.add_metric(["sent"], stats.get("webhooks_sent", 0))
        hooks.add_metric(["failed"], stats.get("webhooks_failed", 0))
        live = GaugeMetricFamily("budget_dashboard_live_streams", "Open server-sent event streams")
        live.add_metric([], stats.get("streams", 0))
        yield from (alerts, hooks, live)


def registry_for(service: Service, stats: Callable[[], dict[str, float]]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_DashboardCollector(service, stats))
    registry.register(QuotaCollector(service))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
