"""Prometheus gauges of quotas (docs/quotas.md): per rule and bucket of the current
window, spent, held in grants and the limit, read at scrape time (one read of the rules
and of each rule's windows per tenant)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ..quotas import Quotas
from .service import Service

_SCALE = {"usd": 1e6, "calls": 1.0, "tok": 1.0}
"""Micro-USD shown in dollars; calls and tokens as counted."""


class QuotaCollector(Collector):
    """``budget_quota_spent``, ``budget_quota_in_grants``, ``budget_quota_limit`` with
    labels tenant, rule, bucket, dim (usd in dollars, calls, tok)."""

    def __init__(self, service: Service) -> None:
        self.service = service

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["tenant", "rule", "bucket", "dim"]
        spent = GaugeMetricFamily("budget_quota_spent", "Spent in a quota bucket's current "
                                  "window (grants ended)", labels=labels)
        held = GaugeMetricFamily("budget_quota_in_grants", "Held by trees in grants from a "
                                 "quota bucket's current window", labels=labels)
        limit = GaugeMetricFamily("budget_quota_limit", "A quota bucket's limit per window",
                                  labels=labels)
        for tenant in self.service.tenants:
            quotas = Quotas(self.service.coordinators[tenant])
            for rule in quotas.rules():
                for s in quotas.status(rule):
                    for dim, cap in s.limits.items():
                        key = [tenant, rule.id, s.bucket, dim]
                        spent.add_metric(key, s.spent[dim] / _SCALE[dim])
                        held.add_metric(key, s.in_grants[dim] / _SCALE[dim])
                        limit.add_metric(key, cap / _SCALE[dim])
        yield from (spent, held, limit)
