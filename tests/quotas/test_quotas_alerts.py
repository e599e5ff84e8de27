"""Quota buckets get the 50/80/100 % alerts trees get: each threshold crossed by a
bucket's window reaches the webhook once (a jump past several: the highest), from a real
dashboard process."""

from __future__ import annotations

import json
import time

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

from tests.support.dashboard_server import WebhookReceiver, dashboard  # noqa: E402


def _spend_in_a_tree(coord: Coordinator, usd: float) -> None:
    config = ExecutionConfig(max_cost_usd=1.0, max_steps=100, max_retries_total=5)
    with ExecutionContext(config, metadata=labelled("ann"), coordinator=coord) as ctx:
        assert ctx.wrap_llm_call(lambda: report_usage(cost_usd=usd),
                                 WrapOptions(cost_estimate_hint=usd)) == Decision.ALLOW


def test_quota_alerts_at_50_80_and_100_percent(coord: Coordinator, redis_url: str) -> None:
    Quotas(coord).set(QuotaRule(id="user-day", match={"user": "*"}, usd=0.10), actor="t")
    env = {"BUDGET_ALERT_FRACTIONS": "0.5,0.8,1"}
    with WebhookReceiver() as hook:
        env["BUDGET_ALERT_WEBHOOKS"] = hook.url
        with dashboard(redis_url, env=env):
            for usd, count in ((0.05, 1), (0.03, 2), (0.02, 3)):
                _spend_in_a_tree(coord, usd)
                deadline = time.monotonic() + 20
                while len(hook.received) < count and time.monotonic() < deadline:
                    time.sleep(0.1)
                assert len(hook.received) == count
            time.sleep(2.5)  # more sweeps: no repeat
        payloads = [json.loads(body) for _, body in hook.received]
    assert [p["threshold"] for p in payloads] == ["fraction:0.5", "fraction:0.8",
                                                  "fraction:1"]
    for p in payloads:
        assert p["labels"]["quota"] == "user-day" and p["labels"]["bucket"] == "user=ann"
        assert p["ceiling_usd"] == 0.1
    assert "100%" in payloads[-1]["message"]


def test_a_jump_past_several_thresholds_alerts_once(coord: Coordinator,
                                                    redis_url: str) -> None:
    Quotas(coord).set(QuotaRule(id="user-day", match={"user": "*"}, usd=0.10), actor="t")
    env = {"BUDGET_ALERT_FRACTIONS": "0.5,0.8,1"}
    with WebhookReceiver() as hook:
        env["BUDGET_ALERT_WEBHOOKS"] = hook.url
        with dashboard(redis_url, env=env):
            _spend_in_a_tree(coord, 0.09)  # past 50 % and 80 % at once
            deadline = time.monotonic() + 20
            while not hook.received and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(2.5)  # more sweeps: neither a repeat nor the lower threshold
        payloads = [json.loads(body) for _, body in hook.received]
    assert [p["threshold"] for p in payloads] == ["fraction:0.8"]
