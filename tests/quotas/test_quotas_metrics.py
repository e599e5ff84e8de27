"""Quota gauges on the dashboard's /metrics, over real HTTP."""

from __future__ import annotations

import pytest

from coordinator import (
    Coordinator,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    WrapOptions,
    report_usage,
)
from coordinator.quotas import QuotaRule, Quotas
from tests.support.quota_procs import labelled

pytest.importorskip("starlette")

from tests.support.dashboard_server import VIEWER_TOKEN, dashboard  # noqa: E402


def test_metrics_show_each_rule_and_bucket(coord: Coordinator, redis_url: str) -> None:
    Quotas(coord).set(QuotaRule(id="user-day", match={"user": "*"}, usd=0.5, calls=100),
                      actor="test")
    config = ExecutionConfig(max_cost_usd=1.0, max_steps=100, max_retries_total=5)
    with ExecutionContext(config, metadata=labelled("ann"), coordinator=coord) as ctx:
        for _ in range(2):
            assert ctx.wrap_llm_call(lambda: report_usage(cost_usd=0.1),
                                     WrapOptions(cost_estimate_hint=0.1)) == Decision.ALLOW
    with dashboard(redis_url) as http:
        status, _, body = http.request("GET", "/metrics", token=VIEWER_TOKEN)
    assert status == 200
    base = 'bucket="user=ann",dim="{}",rule="user-day",tenant=""'
    assert f"budget_quota_spent{{{base.format('usd')}}} 0.2" in body
    assert f"budget_quota_spent{{{base.format('calls')}}} 2.0" in body
    assert f"budget_quota_in_grants{{{base.format('usd')}}} 0.0" in body
    assert f"budget_quota_limit{{{base.format('usd')}}} 0.5" in body
    assert f"budget_quota_limit{{{base.format('calls')}}} 100.0" in body
